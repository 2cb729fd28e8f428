#!/usr/bin/env python3
"""Measures how well conditioned and how non-trivial a generated tiny model is.

For each --init-gain: generate the model, run the float64 plain reference on a prompt
and report
  * dlp_perturb: max |delta log-prob| (all positions, whole vocabulary) when every
    embedding row e gets e + 1e-4 * rms(e) * N(0, 1) (fixed seed);
  * dlp_f32:     max |delta log-prob| float32 vs float64 reference;
  * dlp_model:   max |delta log-prob| ds4 numerics (FP8/f16/FP4) vs plain, and the
                 fraction of positions whose argmax changes;
  * non-triviality: distinct argmax / positions, mean top-1 log-prob, logit std,
    attention entropy (1 = uniform over the visible rows), expert usage entropy
    (1 = uniform), distinct expert sets, indexer: queries with more rows than top-k,
    distinct selected sets, fraction different from "the newest k rows";
  * checks: hash layers choose tid2eid[input_ids]; router / indexer selection gaps.

    python3 tools/reference/conditioning.py --gains 0.25,0.5,1,2 --prompt long
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ds4_reference as R  # noqa: E402
import make_goldens as G  # noqa: E402


def log_softmax(lg):
    lg = lg.to(torch.float64)
    return lg - torch.logsumexp(lg, -1, keepdim=True)


def perturber(rel, seed=1234):
    def f(e):
        g = torch.Generator().manual_seed(seed)
        n = torch.randn(e.shape, generator=g, dtype=torch.float64).to(e.dtype)
        rms = e.pow(2).mean(-1, keepdim=True).sqrt()
        return e + rel * rms * n
    return f


def measure(ref: R.Reference, ids: list) -> dict:
    out = {}
    rec = R.Recorder(experts=True, indexer=True, attention=True, gaps=True)
    base = ref.logits(ids, recorder=rec)
    lp = log_softmax(base)
    T = len(ids)
    am = lp.argmax(-1)
    out["positions"] = T
    out["distinct_argmax_frac"] = len(set(am.tolist())) / T
    out["mean_top1_logprob"] = float(lp.max(-1).values.mean())
    out["mean_logit_std"] = float(base.to(torch.float64).std(-1).mean())

    top20 = lp.topk(20, -1).indices
    for rel in (1e-4, 1e-6):
        pert = log_softmax(ref.logits(ids, perturb=perturber(rel)))
        d = (pert - lp).abs()
        out[f"dlp_perturb{rel:g}_max"] = float(d.max())
        out[f"dlp_perturb{rel:g}_top20_max"] = float(torch.gather(d, 1, top20).max())
        out[f"argmax_flips_perturb{rel:g}"] = int((pert.argmax(-1) != am).sum())

    # attention entropy (normalised) per layer, positions with >= 2 visible rows
    out["attn_entropy"] = {l: round(float(e[:, 1:].mean()), 3) for l, e in rec.attn_entropy.items()}
    # experts
    ex = {}
    tid2eid = {l: layer.mlp.gate.tid2eid for l, layer in enumerate(ref.model.model.layers)
               if layer.mlp.is_hash}
    n_exp = ref.config.n_routed_experts
    for l, ids_l in rec.expert_ids.items():
        counts = torch.bincount(ids_l.reshape(-1), minlength=n_exp).to(torch.float64)
        p = counts / counts.sum()
        ent = float(-(p[p > 0] * p[p > 0].log()).sum() / torch.log(torch.tensor(float(n_exp))))
        sets = {tuple(sorted(r)) for r in ids_l.tolist()}
        item = {"usage_entropy": round(ent, 3), "distinct_sets": len(sets)}
        if l in tid2eid:
            want = tid2eid[l][torch.tensor(ids)]
            item["hash_matches_tid2eid"] = bool(torch.equal(ids_l, want))
        else:
            item["min_gap"] = float(rec.router_gap[l].min())
        ex[l] = item
    out["experts"] = ex
    # indexer
    ix = {}
    for l, sel in rec.indexer_ids.items():
        k = ref.config.index_topk
        ratio = ref.config.compress_rates[R.CSA]
        n_vis = [(t + 1) // ratio for t in range(T)]
        qs = [t for t in range(T) if n_vis[t] > k]
        sets = [frozenset(x for x in sel[t].tolist() if x >= 0) for t in qs]
        newest = [frozenset(range(n_vis[t] - k, n_vis[t])) for t in qs]
        changes = sum(1 for i in range(1, len(sets)) if sets[i] != sets[i - 1])
        g = rec.indexer_gap[l]
        g = g[~torch.isnan(g)]
        ix[l] = {
            "queries_with_selection": len(qs),
            "all_have_k": all(len(s) == k for s in sets),
            "distinct_sets": len(set(sets)),
            "set_changes_between_neighbours": changes,
            "frac_not_newest_k": round(sum(s != nw for s, nw in zip(sets, newest)) / max(1, len(qs)), 3),
            "mean_oldest_row_selected_frac": round(
                sum(min(s) / max(1, n_vis[t] - 1) for s, t in zip(sets, qs)) / max(1, len(qs)), 3),
            "min_gap": float(g.min()) if g.numel() else None,
            "exact_ties": int((g == 0).sum()),
        }
    out["indexer"] = ix

    num = ref.numerics
    ref.numerics = "model"
    mrec = R.Recorder(gaps=True)
    mlp = log_softmax(ref.logits(ids, recorder=mrec))
    ref.numerics = num
    out["dlp_model_max"] = float((mlp - lp).abs().max())
    out["dlp_model_top20_max"] = float(torch.gather((mlp - lp).abs(), 1, lp.topk(20, -1).indices).max())
    out["argmax_agree_model"] = float((mlp.argmax(-1) == am).to(torch.float64).mean())
    out["model_indexer_exact_ties"] = {l: int((g[~torch.isnan(g)] == 0).sum()) for l, g in mrec.indexer_gap.items()}
    out["rounding_calls"] = mrec.rounding_calls

    ref.set_dtype(torch.float32)
    lp32 = log_softmax(ref.logits(ids))
    ref.set_dtype(torch.float64)
    out["dlp_f32_max"] = float((lp32 - lp).abs().max())
    out["argmax_agree_f32"] = float((lp32.argmax(-1) == am).to(torch.float64).mean())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator")
    ap.add_argument("--workdir", default="/tmp/ds4-conditioning")
    ap.add_argument("--gains", default="0.25,0.5,1,2")
    ap.add_argument("--gen-args", default="", help="further generator arguments")
    ap.add_argument("--prompt", default="long", help="prompt name from prompts.py")
    ap.add_argument("--tokens", type=int, default=0, help="cut the prompt ids to this many (0 = all)")
    ap.add_argument("-o", "--out", help="JSON report")
    a = ap.parse_args()
    gen = G.find_generator(a.generator)
    tok, bos = G.load_tokenizer()
    ids = G.prompt_set(tok, bos)[a.prompt]["ids"]
    if a.tokens:
        ids = ids[: a.tokens]
    report = {"prompt": a.prompt, "n_tokens": len(ids), "runs": []}
    for gain in a.gains.split(","):
        path = Path(a.workdir) / f"tiny-gain{gain}.gguf"
        cmd = G.make_gguf(gen, path, "f32", ["--init-gain", gain, *shlex.split(a.gen_args)])
        t0 = time.time()
        ref = R.Reference(path, torch.float64, "plain", hash_file=False)
        m = measure(ref, ids)
        m["gain"] = float(gain)
        m["command"] = shlex.join(cmd)
        m["seconds"] = round(time.time() - t0, 1)
        report["runs"].append(m)
        print(json.dumps(m), flush=True)
        del ref
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
