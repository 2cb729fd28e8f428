#!/usr/bin/env python3
"""DeepSeek's DSpark drafter on a V4.1 target, in numpy float64, for the V4.1 DSpark golden.

Written from the official V4.1 `inference/model.py` (`DSparkBlock`, whose parent is
V4.1's `Block`; `DSparkAttention`, `DSparkMarkovHead`, `make_identity_pre_mix`,
`Transformer.forward` and `forward_spec`) and ds4's `deepseek41-dspark` layout,
independently of ds4's graph. The target and the stages' sublayers are those of
`v41_reference.py` (stage k is read as layer n_layer + k, its tensors from the
drafter's `mtp.{k}.`); what DSpark adds on V4.1:

    taps[p]   = concat over the target layers L of mean_s(h_L[p][s]), h_L the
                state entering layer L after its Engram module (computed here by
                the reference's own forward: nothing is read from ds4)
    main_x[p] = rmsnorm(main_proj · taps[p], main_norm)
    ring_k    = rope(kv_norm_k(wkv_k · main_x[p]), p)  (the last `sliding_window`)
    block     = [next, noise, …] at P+1 … P+bs, embedded, copied to the streams
    stages    : V4.1 blocks with lagged mixes, the first attention collapsing with
                a one-hot on stream 0; attention over ring_k and all the block's
                rows (no causal mask), no per-head q norm; the drafter's experts
                and top-k, the text routing bias
    logits    = output(norm(collapse(x, the last stage's FFN mix)))   (no hc_head)
    row i    += markov_w2 · markov_w1[token_i]   (greedy picks, as V4's golden)

Plain numerics (no simulated rounding).

    ds4-make-test-model --arch deepseek41 --dspark -o DIR/tiny-v41.gguf
    python3 tools/reference/dspark_v41_reference.py --gguf DIR/tiny-v41.gguf \
        --dspark DIR/tiny-v41.dspark.gguf --inputs tests/golden/dspark-v41-tiny \
        -o tests/golden/dspark-v41-tiny.json

`PREFIX.ids.json` ({"ids": [...], "checkpoints": [...]}) is written by
`cargo test --release --test speculate_dspark -- --ignored write_v41_dspark_golden_inputs`.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dspark_reference import dspark_geometry, golden_cli, markov_drafts, write_golden  # noqa: E402
from mtp_reference import File, grouped_output, sink_attention  # noqa: E402
from v41_reference import V41Reference, rmsnorm, rope  # noqa: E402


class DSparkV41(V41Reference):
    def __init__(self, main_path, dspark_path):
        super().__init__(main_path, "plain")
        self.ds = File(dspark_path)
        if self.ds.kv.get("general.architecture") != "deepseek41-dspark":
            raise ValueError(f"{dspark_path}: not a deepseek41-dspark file")
        self.bs, self.noise, self.targets, self.stages = dspark_geometry(self.ds.kv)
        self.ds_E = int(self.ds.kv["dspark.expert_count"])
        self.ds_K = int(self.ds.kv["dspark.expert_used_count"])

    def W(self, name):
        """Layer n_layer + k is the drafter's stage k (`mtp.{k}.`)."""
        parts = name.split(".", 2)
        if parts[0] == "blk" and int(parts[1]) >= self.n_layer:
            if name not in self.w:
                self.w[name] = self.ds.t(f"mtp.{int(parts[1]) - self.n_layer}.{parts[2]}")
            return self.w[name]
        return super().W(name)

    def taps(self, ids):
        """[len(ids), taps·D]: the target's taps at every position."""
        self.forward(ids, taps_at=self.targets)
        return np.concatenate(self.trace["taps"], axis=-1)

    def block_attention(self, L, x, ring, pos):
        """The block's rows `x` (normed) at positions `pos` over the ring rows
        and all the block's own rows: V4.1's projections, no per-head norm."""
        p = f"blk.{L}."
        T, H, hd = x.shape[0], self.H, self.hd
        qr = rmsnorm(x @ self.W(p + "attn_q_a.weight").T, self.W(p + "attn_q_a_norm.weight"), self.eps)
        q = rope((qr @ self.W(p + "attn_q_b.weight").T).reshape(T, H, hd), pos, self.freqs_window)
        kv = rmsnorm(x @ self.W(p + "attn_kv.weight").T, self.W(p + "attn_kv_a_norm.weight"), self.eps)
        rows = np.concatenate([ring, rope(kv, pos, self.freqs_window)])
        sink = self.W(p + "attn_sinks.weight")
        o = np.stack([sink_attention(q[t], rows, sink) for t in range(T)])
        o = rope(o, pos, self.freqs_window, inverse=True)
        return grouped_output(o, self.W(p + "attn_output_a.weight"), self.W(p + "attn_output_b.weight"),
                              self.o_groups, self.o_rank)

    def draft(self, taps, next_id):
        """The first row's biased logits and the greedy draft block, for a
        target holding positions 0 … P (`taps[:P+1]`)."""
        n = self.n_layer
        m0 = f"blk.{n}."
        main = rmsnorm(taps @ self.W(m0 + "main_proj.weight").T, self.W(m0 + "main_norm.weight"), self.eps)
        P = taps.shape[0] - 1
        ring_pos = np.arange(max(0, P + 1 - self.win), P + 1)
        rings = []
        for k in range(self.stages):
            p = f"blk.{n + k}."
            kv = rmsnorm(main[ring_pos] @ self.W(p + "attn_kv.weight").T,
                         self.W(p + "attn_kv_a_norm.weight"), self.eps)
            rings.append(rope(kv, ring_pos, self.freqs_window))
        pos = np.arange(P + 1, P + 1 + self.bs)
        ids = np.full(self.bs, self.noise)
        ids[0] = next_id
        x = np.repeat(self.W("token_embd.weight")[ids][:, None, :], self.hc, axis=1)
        pre_mix = np.zeros((self.bs, self.hc))
        pre_mix[:, 0] = 1.0
        E, K = self.E, self.K
        self.E, self.K = self.ds_E, self.ds_K  # the drafter's own experts
        self.trace = {}
        for k in range(self.stages):
            L = n + k
            p = f"blk.{L}."
            res = x
            a_pre, a_post, a_comb = self.mixes(x, "attn", L)
            y = rmsnorm(self.hc_pre(x, pre_mix), self.W(p + "attn_norm.weight"), self.eps)
            x = self.hc_post(self.block_attention(L, y, rings[k], pos), res, a_post, a_comb)
            res = x
            f_pre, f_post, f_comb = self.mixes(x, "ffn", L)
            y = rmsnorm(self.hc_pre(x, a_pre), self.W(p + "ffn_norm.weight"), self.eps)
            x = self.hc_post(self.moe(L, y), res, f_post, f_comb)
            pre_mix = f_pre
        self.E, self.K = E, K
        last = f"blk.{n + self.stages - 1}."
        y = rmsnorm(self.hc_pre(x, pre_mix), self.W(last + "norm.weight"), self.eps)
        logits = y @ self.W("output.weight").T
        m_embed = self.W(last + "markov_head.markov_w1.weight")  # [vocab, rank]
        m_head = self.W(last + "markov_head.markov_w2.weight")  # [vocab, rank]
        return markov_drafts(logits, m_embed, m_head, next_id)

def main():
    a, ids, checkpoints = golden_cli(__doc__, "PREFIX of PREFIX.ids.json")
    ref = DSparkV41(a.gguf, a.dspark)
    taps = ref.taps(ids[:-1])
    write_golden(ref, ids, taps, checkpoints, a.top, a.out, "tools/reference/dspark_v41_reference.py",
                 {"family": "deepseek41"})


if __name__ == "__main__":
    main()
