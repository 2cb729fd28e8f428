#!/usr/bin/env python3
"""DeepSeek's DSpark drafter on a V4 target, in numpy float64, for the DSpark golden.

Written from the official `inference/model.py` (`DSparkBlock`, `DSparkAttention`,
`DSparkMarkovHead`, `Transformer.forward_spec`; the V4.1 file, the one DeepSeek
published with DSpark) and ds4's `deepseek4-dspark` layout, independently of
ds4's graph. The stages are V4 blocks (this golden's target is V4), so their
HC mixes, attention and MoE are those of `mtp_reference.py`; what DSpark adds:

    main_x[p] = rmsnorm(main_proj · taps[p], main_norm)     p = 0 … P
    ring_k    = rope(kv_norm_k(wkv_k · main_x[p]), p)       each stage k, the
                last `sliding_window` positions
    block     = [next, noise, …, noise] at positions P+1 … P+bs, embedded
                with the target's table, copied to the HC streams
    attention = the block's queries over ring_k and all the block's own rows
                (kv of the block's normed inputs, RoPE at their positions):
                no causal mask inside the block; per-head sinks
    logits    = output(norm(collapse(x, sigmoid head mix of the last stage)))
    row i    += markov_w2 · markov_w1[token_i]   token_0 = next, token_i+1 =
                argmax of row i (greedy `sample` at temperature 0)

Plain numerics (no simulated rounding).

Inputs: the main GGUF, the DSpark GGUF (gguf-py; quantised tensors
dequantised) and `PREFIX.ids.json` + `PREFIX.taps.bin` (the target's taps,
`[L][taps·D]` f32, written by
`cargo test --release --test speculate_dspark -- --ignored write_dspark_golden_inputs`).
Output: per checkpoint position P (the target holds ids[0..=P], next =
ids[P+1]): the top-k ids and float64 log-probs of the first row (Markov bias
included) and the greedy draft block.

    python3 tools/reference/dspark_reference.py --gguf tiny-q8.gguf \
        --dspark tiny-q8.dspark.gguf --inputs tests/golden/dspark-tiny-q8 \
        -o tests/golden/dspark-tiny-q8.json
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_reference import Mtp, sink_attention  # noqa: E402
from v41_reference import rmsnorm, rope, topk_low_index  # noqa: E402


class DSpark(Mtp):
    def __init__(self, main_path, dspark_path):
        super().__init__(main_path, dspark_path)
        self.bs, self.noise, self.targets, self.stages = dspark_geometry(self.f.kv)
        self.K = int(self.f.kv["dspark.expert_used_count"])
        self.stage = 0

    def W(self, name):
        key = (self.stage, name)
        if key not in self.w:
            self.w[key] = self.f.t(f"mtp.{self.stage}." + name)
        return self.w[key]

    def block_attention(self, x, ring, pos):
        """The block's rows `x` at positions `pos` over the ring rows (already
        roped) and all the block's own rows; V4's per-head q norm."""
        q, kv = self.q_kv(x, pos)
        rows = np.concatenate([ring, kv])
        sink = self.W("attn_sinks.weight")
        o = np.stack([sink_attention(q[t], rows, sink) for t in range(len(pos))])
        return self.attn_output(o, pos)

    def rings(self, taps):
        """Each stage's ring rows (roped at their positions), from the taps of
        positions 0 … P (only the last window's rows are kept)."""
        self.stage = 0
        main = rmsnorm(taps @ self.W("main_proj.weight").T, self.W("main_norm.weight"), self.eps)
        P = taps.shape[0] - 1
        pos = np.arange(max(0, P + 1 - self.win), P + 1)
        out = []
        for k in range(self.stages):
            self.stage = k
            kv = rmsnorm(main[pos] @ self.W("attn_kv.weight").T, self.W("attn_kv_a_norm.weight"), self.eps)
            out.append(rope(kv, pos, self.freqs))
        return out

    def draft(self, taps, next_id):
        """The first row's biased logits and the greedy draft block."""
        rings = self.rings(taps)
        P = taps.shape[0] - 1
        pos = np.arange(P + 1, P + 1 + self.bs)
        ids = np.full(self.bs, self.noise)
        ids[0] = next_id
        x = np.repeat(self.embed[ids][:, None, :], self.hc, axis=1)  # [bs, hc, D]
        for k in range(self.stages):
            self.stage = k
            x = self.sublayers(x, (("attn", lambda h: self.block_attention(h, rings[k], pos)),
                                   ("ffn", self.moe)))
        logits = self.head(x)  # the last stage's head mix and norm
        m_embed = self.W("markov_head.markov_w1.weight")  # [vocab, rank]
        m_head = self.W("markov_head.markov_w2.weight")  # [vocab, rank]
        return markov_drafts(logits, m_embed, m_head, next_id)


def dspark_geometry(kv):
    """Block size, noise token id, tapped target layers and stage count from
    a DSpark file's metadata `kv`."""
    k = lambda x: kv["dspark." + x]  # noqa: E731
    return (int(k("block_size")), int(k("noise_token_id")),
            [int(x) for x in k("target_layer_ids")], int(k("stage_count")))


def markov_drafts(logits, m_embed, m_head, next_id):
    """Row i of the block's logits gains `markov_w2 · markov_w1[token_i]`
    (token 0 = next, token i+1 = the greedy pick of row i): the first row's
    biased logits and the picks."""
    prev, drafts, first = next_id, [], None
    for row in logits:
        row = row + m_head @ m_embed[prev]
        if first is None:
            first = row
        prev = int(topk_low_index(row, 1)[0])
        drafts.append(prev)
    return first, drafts


def write_golden(ref, ids, taps, checkpoints, top, out, script, extra=None):
    """At each checkpoint P (the target holds ids[0..=P], next = ids[P+1]):
    the first row's top-`top` ids and float64 log-probs, and the greedy
    draft block; written to `out` as the DSpark golden."""
    rows = []
    for p in checkpoints:
        row, drafts = ref.draft(taps[:p + 1], ids[p + 1])
        lse = float(np.logaddexp.reduce(row))
        best = topk_low_index(row, top)
        rows.append({"position": p, "next": ids[p + 1], "top_ids": [int(i) for i in best],
                     "top_logprobs": [float(row[i] - lse) for i in best], "logsumexp": lse,
                     "drafts": drafts})
    json.dump({"format": "ds4-dspark-golden-v1", "script": script, **(extra or {}),
               "numerics": "plain", "dtype": "float64", "window": ref.win,
               "block_size": ref.bs, "target_layers": ref.targets,
               "ids": ids, "checkpoints": rows}, open(out, "w"), indent=1)
    print(f"wrote {out}: {len(rows)} checkpoints over {len(ids) - 1} positions")


def golden_cli(doc, inputs):
    """The golden scripts' command line and their ids and checkpoints."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the main model")
    ap.add_argument("--dspark", required=True, help="its DSpark file")
    ap.add_argument("--inputs", required=True, help=inputs)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    inp = json.loads(Path(a.inputs + ".ids.json").read_text())
    return a, inp["ids"], inp["checkpoints"]


def main():
    a, ids, checkpoints = golden_cli(__doc__, "PREFIX of PREFIX.ids.json and PREFIX.taps.bin")
    ref = DSpark(a.gguf, a.dspark)
    L = len(ids) - 1
    taps = np.fromfile(a.inputs + ".taps.bin", dtype="<f4").astype(np.float64)
    taps = taps.reshape(L, len(ref.targets) * ref.d)
    write_golden(ref, ids, taps, checkpoints, a.top, a.out, "tools/reference/dspark_reference.py")


if __name__ == "__main__":
    main()
