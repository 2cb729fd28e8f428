#!/usr/bin/env python3
"""Goldens for the tiny DeepSeek V4.1 model: builds it with the Rust generator
(`ds4-make-test-model --arch deepseek41`), runs a float64 reference of the
official inference/model.py semantics on two prompts and a 3,000-token one,
and writes tests/golden/v41-tiny.json, v41-tiny.hc.bin and v41-tiny-3k.json.
Byte-identical on rerun with the same backend.

    cargo build --release --bin ds4-make-test-model
    python3 tools/reference/make_v41_goldens.py --generator target/release/ds4-make-test-model \
        [--backend numpy|torch]
    # the official simulated quantisation (numpy only): v41-tiny.model.json, v41-tiny-3k.model.json
    python3 tools/reference/make_v41_goldens.py --generator target/release/ds4-make-test-model \
        --numerics model [--steps act,expert_mid,kv,latent,index]

--numerics model also runs plain numerics in memory (for each prompt's
"plain_vs_model" summary) and checks that it reproduces the committed plain
goldens byte for byte; it writes only the *.model.json files.

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
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def load_reference(backend, path, steps=frozenset()):
    """The numpy or torch reference; both give forward(ids, hc_positions)
    -> float64 logits and the same trace keys. Model numerics (`steps`) are
    numpy only."""
    if backend == "torch":
        if steps:
            raise SystemExit("--numerics model: the numpy backend only (v41_torch.py has no fake-quant)")
        from v41_torch import TorchReference

        return TorchReference(path, max_seq_len=LONG_TOKENS + 8)
    from v41_reference import V41Reference

    return V41Reference(path, "model" if steps else "plain", sorted(steps) if steps else None)


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


def gaps_of(tr, T):
    gaps = []
    for t in range(T):
        g = [v[t] for v in tr["indexer_gap"].values() if v[t] is not None and v[t] > 0]
        gaps.append(float(f"{min(g):.4g}") if g else None)
    return gaps


def short_prompts(ref):
    """The short and long prompts: (prompt dicts, hc trace array, logits)."""
    prompts, hc_bin, all_logits = [], None, []
    for name, n, seed in (("short", 16, 7), ("long", 64, 41)):
        ids = prompt_ids(n, seed)
        positions = HC_POSITIONS if name == "long" else ()
        logits = ref.forward(ids, hc_positions=positions)
        all_logits.append(logits)
        tr = ref.trace
        p = {"name": name, "ids": ids, "n_tokens": len(ids)}
        p.update(summarise(logits))
        T = len(ids)
        p["router_gap"] = [min(v[t] for v in tr["router_gap"].values()) for t in range(T)]
        p["indexer_gap"] = gaps_of(tr, T)
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
    return prompts, hc_bin, all_logits


def long_prompt(ref):
    """The 3,000-token prompt (issue 19 item 7): every position, top-5 only."""
    ids = prompt_ids(LONG_TOKENS, 3000)
    logits = ref.forward(ids)
    s = summarise(logits, top=5)
    tr = ref.trace
    p = dict(name="3k", ids=ids, n_tokens=len(ids), **s,
             router_gap=[min(v[t] for v in tr["router_gap"].values()) for t in range(len(ids))],
             indexer_gap=gaps_of(tr, len(ids)))
    return p, logits


def log_softmax(logits):
    m = logits.max(axis=1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))


def compare(plain, model, top=TOP_K):
    """|Δ log-prob| between plain and model numerics over the model run's
    top-`top` ids at every position (the ids its golden lists first)."""
    lp, lm = log_softmax(plain), log_softmax(model)
    part = np.argpartition(-model, top - 1, axis=1)[:, :top]  # not a whole argsort: 3k x vocab
    vals = np.take_along_axis(model, part, 1)
    order = np.lexsort((part, -vals), axis=1)  # descending, ties to the lower id, as summarise
    ids = np.take_along_axis(part, order, 1)
    d = np.abs(np.take_along_axis(lm, ids, 1) - np.take_along_axis(lp, ids, 1))
    t, j = np.unravel_index(int(np.argmax(d)), d.shape)
    return {
        "over": f"the model run's top-{top} ids at every position",
        "median_abs_dlogprob": float(f"{np.median(d):.6g}"),
        "max_abs_dlogprob": float(f"{d.max():.6g}"),
        "max_at": {"position": int(t), "token": int(ids[t, j])},
        "argmax_agree": int(np.sum(np.argmax(plain, 1) == np.argmax(model, 1))),
        "positions": int(d.shape[0]),
    }


def dump(obj, path):
    text = json.dumps(obj, separators=(",", ":")) + "\n"
    if path is not None:
        with open(path, "w") as fp:
            fp.write(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--generator", required=True)
    ap.add_argument("--backend", choices=("numpy", "torch"), default="numpy",
                    help="which float64 reference writes the goldens (default numpy)")
    ap.add_argument("--numerics", choices=("plain", "model"), default="plain",
                    help="plain (default): v41-tiny.json, .hc.bin, v41-tiny-3k.json; model: the official "
                         "simulated quantisation, v41-tiny.model.json and v41-tiny-3k.model.json")
    ap.add_argument("--steps", help="with --numerics model: comma list of act,expert_mid,kv,latent,index "
                                    "(default all five)")
    ap.add_argument("--no-3k", action="store_true", help="skip the 3,000-token prompt")
    ap.add_argument("--work", default="/tmp/ds4-v41-goldens")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden"))
    a = ap.parse_args()
    from v41_reference import STEPS, POW2_STATS, parse_steps

    if a.steps and a.numerics != "model":
        ap.error("--steps needs --numerics model")
    steps = parse_steps(a.numerics, a.steps)
    model = a.numerics == "model"
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    gguf_path = os.path.join(a.work, "tiny-v41.gguf")
    subprocess.run([a.generator, *GEN_ARGS, "-o", gguf_path], check=True)
    data = open(gguf_path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()

    ref = load_reference(a.backend, gguf_path)
    t0 = time.time()
    prompts, hc_bin, plain_logits = short_prompts(ref)
    print(f"plain short + long: {time.time() - t0:.1f} s")

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
    plain_path = os.path.join(a.out, "v41-tiny.json")
    plain_hc_path = os.path.join(a.out, "v41-tiny.hc.bin")
    if not model:
        dump(golden, plain_path)
        hc_bin.tofile(plain_hc_path)
        print(f"wrote v41-tiny.json and v41-tiny.hc.bin {hc_bin.shape} (gguf sha256 {sha})")
    else:
        check_same(dump(golden, None), plain_path)
        check_same_bytes(hc_bin.tobytes(), plain_hc_path)
        mref = load_reference(a.backend, gguf_path, steps)
        mref.w = ref.w  # the same weights: read once
        t0 = time.time()
        mprompts, _, model_logits = short_prompts(mref)
        print(f"model short + long: {time.time() - t0:.1f} s")
        # one step at a time, so a test knows which steps move which prompt
        per_step = {}
        for s in STEPS:
            one = load_reference(a.backend, gguf_path, frozenset([s]))
            one.w = ref.w
            _, _, lg = short_prompts(one)
            per_step[s] = [compare(pl, l1) for pl, l1 in zip(plain_logits, lg)]
        for p, pl, ml, i in zip(mprompts, plain_logits, model_logits, range(2)):
            p["plain_vs_model"] = compare(pl, ml)
            p["plain_vs_step"] = {s: {k: v for k, v in per_step[s][i].items() if k != "over"}
                                  for s in STEPS}
        mgolden = model_golden(golden, mprompts, steps)
        worst = max(mprompts, key=lambda p: p["plain_vs_model"]["max_abs_dlogprob"])
        mgolden["plain_vs_model_worst"] = {"prompt": worst["name"], **worst["plain_vs_model"]["max_at"],
                                           "max_abs_dlogprob": worst["plain_vs_model"]["max_abs_dlogprob"]}
        del mgolden["hc_trace"]  # no HC state file for model numerics
        for p in mprompts:
            p.pop("hc_positions", None)
        dump(mgolden, os.path.join(a.out, "v41-tiny.model.json"))
        for p in mprompts:
            c = p["plain_vs_model"]
            print(f"  {p['name']}: plain vs model |Δ log-prob| over top-{TOP_K}: median {c['median_abs_dlogprob']:.3g}"
                  f", max {c['max_abs_dlogprob']:.3g} at position {c['max_at']['position']}"
                  f" (token {c['max_at']['token']}), argmax agree {c['argmax_agree']}/{c['positions']}")
            for s in STEPS:
                c1 = p["plain_vs_step"][s]
                print(f"    {s} alone: median {c1['median_abs_dlogprob']:.3g}, max {c1['max_abs_dlogprob']:.3g}")
        print(f"wrote v41-tiny.model.json (steps {mgolden['steps']})")
    if a.no_3k:
        report_pow2()
        return

    t0 = time.time()
    lp, plain3k = long_prompt(ref)
    print(f"plain 3k: {time.time() - t0:.1f} s")
    long_golden = {
        "format": "ds4-golden-v41-long-1",
        "variant": "v41-tiny.plain-f64",
        "generator": golden["generator"],
        "gguf": golden["gguf"],
        "reference": golden["reference"],
        "top_k": 5,
        "prompt": lp,
    }
    long_path = os.path.join(a.out, "v41-tiny-3k.json")
    if not model:
        dump(long_golden, long_path)
        print(f"wrote v41-tiny-3k.json ({len(lp['ids'])} positions)")
        return
    check_same(dump(long_golden, None), long_path)
    t0 = time.time()
    mp, model3k = long_prompt(mref)
    print(f"model 3k: {time.time() - t0:.1f} s")
    mp["plain_vs_model"] = compare(plain3k, model3k)
    ml = model_golden(long_golden, None, steps)
    ml["prompt"] = mp
    dump(ml, os.path.join(a.out, "v41-tiny-3k.model.json"))
    c = mp["plain_vs_model"]
    print(f"  3k: plain vs model |Δ log-prob| over top-{TOP_K}: median {c['median_abs_dlogprob']:.3g}"
          f", max {c['max_abs_dlogprob']:.3g} at position {c['max_at']['position']}"
          f" (token {c['max_at']['token']}), argmax agree {c['argmax_agree']}/{c['positions']}")
    print(f"wrote v41-tiny-3k.model.json ({len(mp['ids'])} positions)")
    report_pow2()


def model_golden(plain, prompts, steps):
    """The plain golden's header with the model variant, numerics and steps."""
    from v41_reference import STEPS

    g = dict(plain)
    g["variant"] = "v41-tiny.model-f64"
    g["numerics"] = "model"
    g["steps"] = [s for s in STEPS if s in steps]
    ref = dict(plain["reference"])
    ref["semantics"] = ("official inference/model.py @ dba1be0a (prefill at start_pos 0) with its simulated "
                        "quantisation (steps listed), no bf16; quantisers in float32 as the kernels")
    g["reference"] = ref
    if prompts is not None:
        g["prompts"] = prompts
    return g


def check_same(text, path):
    """Plain numerics must reproduce the committed golden byte for byte."""
    if not os.path.exists(path):
        print(f"note: {path} absent, plain not compared")
        return
    same = open(path).read() == text
    print(f"plain reproduces {os.path.basename(path)} byte for byte: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(f"plain numerics no longer reproduce {path}")


def check_same_bytes(data, path):
    if not os.path.exists(path):
        print(f"note: {path} absent, plain not compared")
        return
    same = open(path, "rb").read() == data
    print(f"plain reproduces {os.path.basename(path)} byte for byte: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(f"plain numerics no longer reproduce {path}")


def report_pow2():
    from v41_reference import POW2_STATS

    for k, (n, diff) in POW2_STATS.items():
        print(f"UE8M0 scales ({k}): {n} computed, {diff} where float32 log2 differs from the exact power of two")


if __name__ == "__main__":
    main()
