#!/usr/bin/env python3
"""Builds the tiny test model(s) with the Rust generator, runs the Python reference
and writes the golden files in tests/golden/ (see tests/golden/README.md).

    python3 tools/reference/make_goldens.py                 # everything, default settings
    python3 tools/reference/make_goldens.py --generator target/release/ds4-make-test-model \
        --gguf-variants f32 --variants plain-f64,plain-f32,model-f64

GGUFs go to --workdir (not committed); the goldens record the generator command line
and the GGUF's sha256 so a mismatch is detected before any comparison.
"""

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tokenizers
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import ds4_reference as R  # noqa: E402
import prompts as P  # noqa: E402

FORMAT = "ds4-golden-v1"
# Generator settings chosen by conditioning.py (tools/reference/README.md).
GEN_ARGS = ["--init-gain", "0.5"]
TRACE_POSITIONS = [0, 1, 31, 32, 33, 63]
INDEXER_TRACE_POSITIONS = [67, 68, 100, 255, 500, 999]
TOKENIZER = REPO / "tests/data/deepseek-v4-tokenizer.json"
BOS_TEXT = "<｜begin▁of▁sentence｜>"


def find_generator(path: str | None) -> Path:
    if path:
        return Path(path)
    subprocess.run(["cargo", "build", "--release", "--bin", "ds4-make-test-model"], cwd=REPO, check=True)
    return REPO / "target/release/ds4-make-test-model"


def make_gguf(generator: Path, out: Path, variant: str, gen_args: list) -> list:
    """Runs the generator; returns the command line as recorded in the goldens."""
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ["--variant", variant, *gen_args, "-o", str(out)]
    subprocess.run([str(generator), *args], check=True)
    return ["ds4-make-test-model", "--variant", variant, *gen_args, "-o", out.name]


def load_tokenizer():
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    bos = tok.token_to_id(BOS_TEXT)
    if bos is None:
        raise KeyError(BOS_TEXT)
    return tok, bos


def cut_prompt(tok, bos: int, text: str, target: int) -> tuple[str, list]:
    """Longest prefix of `text` ending at whitespace (or the whole text) whose BOS +
    tokens count is <= target; returns (text, ids) with ids == [BOS] + encode(text)."""
    def ids_of(s):
        return [bos] + tok.encode(s, add_special_tokens=False).ids

    full = ids_of(text)
    if len(full) <= target:
        return text, full
    cuts = [i for i, c in enumerate(text) if c.isspace()]
    lo, hi, best = 0, len(cuts) - 1, None
    while lo <= hi:  # token count is monotone in the cut point for these texts
        mid = (lo + hi) // 2
        s = text[: cuts[mid]]
        if len(ids_of(s)) <= target:
            best, lo = s, mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError("prompt too short to cut")
    return best, ids_of(best)


def cut_prompt_exact(tok, bos: int, text: str, target: int) -> tuple[str, list]:
    """Like cut_prompt, but extends the cut character by character until BOS + tokens
    is exactly `target` (falls back to the whitespace cut if no prefix gives it)."""
    t, ids = cut_prompt(tok, bos, text, target)
    for end in range(len(t) + 1, len(text) + 1):
        cand = [bos] + tok.encode(text[:end], add_special_tokens=False).ids
        if len(cand) == target:
            return text[:end], cand
        if len(cand) > target:
            break
    return t, ids


def prompt_set(tok, bos):
    out = {}
    for name, (target, text) in P.PROMPTS.items():
        t, ids = cut_prompt(tok, bos, text, target)
        out[name] = {"name": name, "target_tokens": target, "text": t, "ids": ids}
    name, target, text = P.TRACE
    t, ids = cut_prompt_exact(tok, bos, text, target)
    out[name] = {"name": name, "target_tokens": target, "text": t, "ids": ids}
    return out


def greedy(ref: R.Reference, ids: list, n: int) -> dict:
    """The reference's own greedy continuation (full recomputation per step)."""
    seq, toks, margins, top2, lps = list(ids), [], [], [], []
    for _ in range(n):
        lg = ref.logits(seq, last_only=True).to(torch.float64)[0]
        vals, idx = torch.sort(lg, descending=True, stable=True)
        lse = torch.logsumexp(lg, 0)
        t = int(idx[0])
        toks.append(t)
        margins.append(float(vals[0] - vals[1]))
        top2.append([int(idx[0]), int(idx[1])])
        lps.append(float(vals[0] - lse))
        seq.append(t)
    return {"tokens": toks, "margins": margins, "top2": top2, "logprobs": lps}


def _g4(x: float):
    return None if x != x else float(f"{x:.4g}")


def selection_gaps(rec: R.Recorder, n: int) -> dict:
    """Per position, the smallest gap between the last selected and the first rejected
    candidate: experts over the non-hash layers (score + bias), indexer rows over the
    CSA layers (null where every row is visible). Small gaps mark positions where an
    implementation's rounding may legitimately pick differently."""
    rg = torch.full((n,), float("inf"), dtype=torch.float64)
    for g in rec.router_gap.values():
        rg = torch.minimum(rg, g.to(torch.float64))
    ig = torch.full((n,), float("nan"), dtype=torch.float64)
    for g in rec.indexer_gap.values():
        ig = torch.fmin(ig, g.to(torch.float64))
    return {
        "router_gap": [_g4(x) if x != float("inf") else None for x in rg.tolist()],
        "indexer_gap": [_g4(x) for x in ig.tolist()],
    }


def golden_for(ref: R.Reference, prompts: dict, hc_path: Path, top: int) -> dict:
    res = {"prompts": []}
    for name in P.PROMPTS:
        p = prompts[name]
        rec = R.Recorder(indexer=name == "long", gaps=True)
        t0 = time.time()
        s = R.summarize(ref.logits(p["ids"], recorder=rec), top)
        entry = {**p, "n_tokens": len(p["ids"]), **s, **selection_gaps(rec, len(p["ids"]))}
        if rec.indexer_ids:
            entry["indexer_trace"] = {
                "positions": [q for q in INDEXER_TRACE_POSITIONS if q < len(p["ids"])],
                "layers": {
                    str(l): [sorted(int(x) for x in v[q].tolist() if x >= 0)
                             for q in INDEXER_TRACE_POSITIONS if q < len(p["ids"])]
                    for l, v in rec.indexer_ids.items()
                },
            }
        res["prompts"].append(entry)
        print(f"  {name}: {len(p['ids'])} tokens, {time.time() - t0:.1f}s", flush=True)

    p = prompts[P.GREEDY_FROM]
    t0 = time.time()
    res["greedy"] = {"from_prompt": P.GREEDY_FROM, "prompt_ids": p["ids"], **greedy(ref, p["ids"], P.GREEDY_TOKENS)}
    print(f"  greedy: {time.time() - t0:.1f}s", flush=True)

    p = prompts[P.TRACE[0]]
    positions = [q for q in TRACE_POSITIONS if q < len(p["ids"])]
    if positions[-1] != len(p["ids"]) - 1:
        positions.append(len(p["ids"]) - 1)
    rec = R.Recorder(hc_positions=positions, experts=True)
    s = R.summarize(ref.logits(p["ids"], recorder=rec), top)
    arr = np.stack([np.stack([a.to(torch.float64).numpy(), b.to(torch.float64).numpy()])
                    for a, b in rec.hc])  # [L, 2, P, NHC, D]
    f32 = ref.dtype == torch.float32  # store what was computed, no wider
    arr.astype("<f4" if f32 else "<f8").tofile(hc_path)
    res["hc_trace"] = {
        **p,
        "n_tokens": len(p["ids"]),
        "positions": positions,
        "file": hc_path.name,
        "dtype": "f32le" if f32 else "f64le",
        "shape": list(arr.shape),
        "layout": "[layer][sublayer: 0 = after attention (HC-post of the attention sublayer), "
                  "1 = after the FFN (layer output)][position index into `positions`][stream][dim], "
                  "row-major, little-endian (dtype)",
        "expert_ids": {str(l): v.tolist() for l, v in rec.expert_ids.items()},
        **s,
    }
    return res


def tensor_type_summary(types: dict) -> dict:
    out = {}
    for t in types.values():
        out[t] = out.get(t, 0) + 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", help="path to ds4-make-test-model (default: cargo build --release)")
    ap.add_argument("--workdir", default="/tmp/ds4-goldens", help="where the GGUFs are written")
    ap.add_argument("--out", default=str(REPO / "tests/golden"))
    ap.add_argument("--gguf-variants", default="f32", help="generator --variant values, comma-separated")
    ap.add_argument("--variants", default="plain-f64,plain-f32,model-f64",
                    help="reference runs: <plain|model>-<f64|f32>")
    ap.add_argument("--gen-args", default=shlex.join(GEN_ARGS), help="extra generator arguments")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()

    gen = find_generator(a.generator)
    gen_args = shlex.split(a.gen_args)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok, bos = load_tokenizer()
    prompts = prompt_set(tok, bos)
    for gv in a.gguf_variants.split(","):
        gguf_path = Path(a.workdir) / f"tiny-{gv}.gguf"
        cmd = make_gguf(gen, gguf_path, gv, gen_args)
        ref = None
        for var in a.variants.split(","):
            numerics, dt = var.split("-")
            dtype = R.parse_dtype(dt)
            if ref is None:
                ref = R.Reference(gguf_path, dtype, numerics)
            else:
                ref.set_dtype(dtype)
                ref.numerics = numerics
            stem = f"tiny-{gv}.{numerics}-{dt}"
            print(f"{stem}", flush=True)
            body = golden_for(ref, prompts, out_dir / f"{stem}.hc.bin", a.top)
            doc = {
                "format": FORMAT,
                "variant": stem,
                "generator": {"command": shlex.join(cmd), "gguf_variant": gv},
                "gguf": {
                    "file": gguf_path.name,
                    "sha256": ref.info.sha256,
                    "size": gguf_path.stat().st_size,
                    "tensor_types": tensor_type_summary(ref.info.tensor_types),
                    "compress_ratios": ref.info.compress_ratios,
                    "layer_types": ref.info.layer_types,
                },
                "reference": {
                    "script": "tools/reference/ds4_reference.py",
                    "dtype": "float64" if dtype == torch.float64 else "float32",
                    "numerics": numerics,
                    "exact64": ref.exact64,
                    "topk_ties": "lowest index (stable sort on (-score, index))",
                    "router": "ds4 softplus and max(sum, 2^-14) guard",
                    "transformers": __import__("transformers").__version__,
                    "torch": torch.__version__,
                    "gguf_py": __import__("importlib.metadata").metadata.version("gguf"),
                    "bos_id": bos,
                    "tokenizer": "tests/data/deepseek-v4-tokenizer.json (HF tokenizers), BOS prepended",
                },
                "top_k": a.top,
                **body,
            }
            path = out_dir / f"{stem}.json"
            path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
            print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)


if __name__ == "__main__":
    main()
