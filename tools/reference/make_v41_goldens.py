#!/usr/bin/env python3
"""Goldens for the tiny DeepSeek V4.1 model: builds it with the Rust generator
(`ds4-make-test-model --arch deepseek41`), runs a float64 reference of the
official inference/model.py semantics on two prompts and a 3,000-token one,
and writes tests/golden/v41-tiny.json, v41-tiny.hc.bin and v41-tiny-3k.json.
Byte-identical on rerun with the same backend.

    cargo build --release --bin ds4-make-test-model
    python3 tools/reference/make_v41_goldens.py --generator target/release/ds4-make-test-model \
        [--backend numpy|torch]

--backend numpy (the default; the committed goldens) runs v41_reference.py and
needs numpy and gguf-py; --backend torch runs v41_torch.py (the port of the
official modules, with their caches) and needs torch too. The two agree to
~5e-15 in log-probability (docs/V41.md), so either can write the goldens.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def load_reference(backend, path):
    """The numpy or torch reference; both give forward(ids, hc_positions)
    -> float64 logits and the same trace keys."""
    if backend == "torch":
        from v41_torch import TorchReference

        return TorchReference(path, max_seq_len=LONG_TOKENS + 8)
    from v41_reference import V41Reference

    return V41Reference(path)


TOP_K = 20
LONG_TOKENS = 3000
HC_POSITIONS = [0, 1, 3, 4, 17, 63]
GEN_ARGS = ["--arch", "deepseek41"]


def prompt_ids(n, seed):
    """BOS, then ids drawn from a fixed generator, with earlier spans
    repeated so the Engram n-grams (and their table rows) recur."""
    rng = np.random.default_rng(seed)
    body = [int(x) for x in rng.integers(3, 129000, size=n - 1)]
    if n > 24:
        body[n // 2: n // 2 + 6] = body[4:10]
    for start in range(200, n - 40, 300):
        body[start: start + 20] = body[start - 150: start - 130]
    return [0] + body


def summarise(logits, top=TOP_K):
    out = {"top_ids": [], "top_logprobs": [], "logsumexp": [], "argmax": [], "margin": []}
    for row in logits:
        m = row.max()
        lse = float(m + np.log(np.exp(row - m).sum()))
        order = np.argsort(-row, kind="stable")[:top]
        out["top_ids"].append([int(i) for i in order])
        out["top_logprobs"].append([float(row[i] - lse) for i in order])
        out["logsumexp"].append(lse)
        out["argmax"].append(int(order[0]))
        out["margin"].append(float(row[order[0]] - row[order[1]]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--generator", required=True)
    ap.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                    help="which float64 reference writes the goldens (default numpy)")
    ap.add_argument("--work", default="/tmp/ds4-v41-goldens")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    gguf_path = os.path.join(a.work, "tiny-v41.gguf")
    subprocess.run([a.generator, *GEN_ARGS, "-o", gguf_path], check=True)
    data = open(gguf_path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()

    ref = load_reference(a.backend, gguf_path)
    prompts = []
    hc_bin = None
    for name, n, seed in (("short", 16, 7), ("long", 64, 41)):
        ids = prompt_ids(n, seed)
        positions = HC_POSITIONS if name == "long" else ()
        logits = ref.forward(ids, hc_positions=positions)
        tr = ref.trace
        p = {"name": name, "ids": ids, "n_tokens": len(ids)}
        p.update(summarise(logits))
        T = len(ids)
        p["router_gap"] = [min(v[t] for v in tr["router_gap"].values()) for t in range(T)]
        gaps = []
        for t in range(T):
            g = [v[t] for v in tr["indexer_gap"].values() if v[t] is not None and v[t] > 0]
            gaps.append(float(f"{min(g):.4g}") if g else None)
        p["indexer_gap"] = gaps
        p["engram_rows"] = tr["engram_rows"].tolist()
        p["engram_gate"] = {str(L): v.tolist() for L, v in tr["engram_gate"].items()}
        p["topk"] = {str(L): v for L, v in tr["topk"].items() if L in ref.ix_src}
        p["candidates"] = {str(L): [[int(j) for j in np.nonzero(row)[0]] for row in v]
                           for L, v in tr["candidates"].items()}
        p["experts"] = {str(L): v for L, v in tr["experts"].items()}
        if positions:
            p["hc_positions"] = list(positions)
            hc_bin = np.array(tr["hc"], dtype="<f8")  # [layer][sublayer][pos][stream][dim]
        prompts.append(p)

    golden = {
        "format": "ds4-golden-v41-1",
        "variant": "v41-tiny.plain-f64",
        "generator": {"command": "ds4-make-test-model " + " ".join(GEN_ARGS) + " -o tiny-v41.gguf"},
        "gguf": {"file": "tiny-v41.gguf", "sha256": sha, "size": len(data)},
        "reference": {
            "script": "tools/reference/make_v41_goldens.py + "
                      + ("v41_torch.py" if a.backend == "torch" else "v41_reference.py"),
            "dtype": "float64",
            "semantics": "official inference/model.py @ dba1be0a (prefill at start_pos 0), no fake-quant, no bf16",
            "topk_ties": "lowest index wins (router, candidate blocks, indexer rows)",
            "numpy": np.__version__,
            **({"torch": __import__("torch").__version__} if a.backend == "torch" else {}),
        },
        "top_k": TOP_K,
        "prompts": prompts,
        "hc_trace": {"prompt": "long", "file": "v41-tiny.hc.bin", "dtype": "f64le",
                     "shape": list(hc_bin.shape),
                     "layout": "[layer][sublayer: after attention, after ffn][position][stream][dim]"},
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "v41-tiny.json"), "w") as fp:
        json.dump(golden, fp, separators=(",", ":"))
        fp.write("\n")
    hc_bin.tofile(os.path.join(a.out, "v41-tiny.hc.bin"))
    print(f"wrote v41-tiny.json and v41-tiny.hc.bin {hc_bin.shape} (gguf sha256 {sha})")

    # A 3,000-token context (issue 19 item 7): every position, top-5 only.
    ids = prompt_ids(LONG_TOKENS, 3000)
    logits = ref.forward(ids)
    s = summarise(logits, top=5)
    tr = ref.trace
    gaps = []
    for t in range(len(ids)):
        g = [v[t] for v in tr["indexer_gap"].values() if v[t] is not None and v[t] > 0]
        gaps.append(float(f"{min(g):.4g}") if g else None)
    long_golden = {
        "format": "ds4-golden-v41-long-1",
        "variant": "v41-tiny.plain-f64",
        "generator": golden["generator"],
        "gguf": golden["gguf"],
        "reference": golden["reference"],
        "top_k": 5,
        "prompt": dict(name="3k", ids=ids, n_tokens=len(ids), **s,
                       router_gap=[min(v[t] for v in tr["router_gap"].values()) for t in range(len(ids))],
                       indexer_gap=gaps),
    }
    with open(os.path.join(a.out, "v41-tiny-3k.json"), "w") as fp:
        json.dump(long_golden, fp, separators=(",", ":"))
        fp.write("\n")
    print(f"wrote v41-tiny-3k.json ({len(ids)} positions)")


if __name__ == "__main__":
    main()
