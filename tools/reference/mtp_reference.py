#!/usr/bin/env python3
"""V4 Flash's MTP draft block in numpy float64, for the MTP golden.

Written from the official V4 `inference/model.py` `MTPBlock.forward` (as
MODEL.md §6.1 states it) and GGUF.md §7, independently of ds4's graph:

    e    = embed(t)                      token_embd of the main file
    S[s] = e_proj(enorm(e)) + h_proj(hnorm(H[s]))   each HC stream s
    S    = one V4 block with the mtp.0.* tensors: HC mixes (Sinkhorn), RMS
           norm, low-rank q with a per-head RMS norm, one shared K=V row,
           partial interleaved RoPE on the tail (plain theta, no YaRN),
           attention over the last `sliding_window` rows with per-head sinks,
           inverse RoPE, grouped low-rank output; top-k routed experts
           (sqrt-softplus scores, router bias, renormalised, scaled) with the
           clamped SwiGLU, plus the shared expert
    logits = output(norm(collapse(S, sigmoid head mix)))   main `output`

run over a whole sequence: row j pairs the target's final HC state at
position j with the token at j + 1 (DeepSeek-V3's pairing, docs/SPECULATIVE.md)
and sits at position j. Plain numerics (no simulated rounding).

Inputs: the main GGUF, the MTP GGUF (both read with gguf-py, quantised
tensors dequantised), and `PREFIX.ids.json` + `PREFIX.states.bin`: the token
ids (one more than the states: the last is the token after the last state)
and the target's final states ([L][hc][D] f32), written by
`cargo test --release --test speculate_mtp -- --ignored write_mtp_golden_inputs`.
Output: per checkpoint position, the top-k ids and float64 log-probs and the
logsumexp of the block's logits at that row.

    python3 tools/reference/mtp_reference.py --gguf tiny-q8.gguf \
        --mtp tiny-q8.mtp.gguf --inputs tests/golden/mtp-tiny-q8 \
        -o tests/golden/mtp-tiny-q8.json
"""

import argparse
import json
import math
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from v41_reference import rmsnorm, rope, rope_freqs, sigmoid, topk_low_index  # noqa: E402


class File:
    def __init__(self, path):
        self.r = gguf.GGUFReader(str(path))
        self.kv = {f.name: f.contents() for f in self.r.fields.values()}
        self.tensors = {t.name: t for t in self.r.tensors}

    def t(self, name):
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(data, dtype=np.float64).reshape(shape)


def sink_attention(q, rows, sink):
    """One position's heads `q` [H, hd] over `rows` [n, hd] (one row serves as
    key and value), softmax with a per-head sink logit `sink` [H]: [H, hd]."""
    s = q @ rows.T / math.sqrt(q.shape[-1])
    mx = np.maximum(s.max(axis=1), sink)
    e = np.exp(s - mx[:, None])
    return (e @ rows) / (e.sum(axis=1) + np.exp(sink - mx))[:, None]


def grouped_output(o, wo_a, wo_b, groups, rank):
    """The grouped low-rank output projection of the heads `o` [T, H, hd]:
    each of the `groups` head groups through its own `rank` rows of `wo_a`,
    the concatenation through `wo_b`."""
    T = o.shape[0]
    wo_a = wo_a.reshape(groups, rank, -1)
    o = np.einsum("tgd,grd->tgr", o.reshape(T, groups, -1), wo_a).reshape(T, -1)
    return o @ wo_b.T


class Mtp:
    def __init__(self, main_path, mtp_path):
        m, self.f = File(main_path), File(mtp_path)
        k = lambda x: m.kv["deepseek4." + x]  # noqa: E731
        self.n_layer = int(k("block_count"))
        self.d = int(k("embedding_length"))
        self.H = int(k("attention.head_count"))
        self.hd = int(k("attention.key_length"))
        self.n_rot = int(k("rope.dimension_count"))
        self.win = int(k("attention.sliding_window"))
        self.eps = float(k("attention.layer_norm_rms_epsilon"))
        self.hc = int(k("hyper_connection.count"))
        self.iters = int(k("hyper_connection.sinkhorn_iterations"))
        self.hc_eps = float(k("hyper_connection.epsilon"))
        self.K = int(k("expert_used_count"))
        self.route_scale = float(k("expert_weights_scale"))
        self.norm_topk = bool(k("expert_weights_norm"))
        clamps = [float(x) for x in k("swiglu_clamp_exp")]
        # The MTP layer's slot (one past the last layer) when the file has it.
        self.clamp = clamps[self.n_layer] if len(clamps) > self.n_layer else clamps[-1]
        self.o_groups = int(k("attention.output_group_count"))
        self.o_rank = int(k("attention.output_lora_rank"))
        self.freqs = rope_freqs(self.n_rot, float(k("rope.freq_base")), None)
        self.embed = m.t("token_embd.weight")
        self.output = m.t("output.weight")
        self.w = {}

    def W(self, name):
        if name not in self.w:
            self.w[name] = self.f.t("mtp.0." + name)
        return self.w[name]

    def mix(self, x, site):
        """pre, post, comb of sublayer `site` from the n·D state (official hc_pre)."""
        T, n = x.shape[0], self.hc
        flat = x.reshape(T, -1)
        flat = flat / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + self.eps)
        m = flat @ self.W(f"hc_{site}_fn.weight").T
        scale, base = self.W(f"hc_{site}_scale.weight"), self.W(f"hc_{site}_base.weight")
        pre = sigmoid(m[:, :n] * scale[0] + base[:n]) + self.hc_eps
        post = 2 * sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n])
        comb = np.empty((T, n, n))
        for t in range(T):
            c = (m[t, 2 * n:] * scale[2] + base[2 * n:]).reshape(n, n)
            c = np.exp(c - c.max(axis=1, keepdims=True))
            c = c / c.sum(axis=1, keepdims=True) + self.hc_eps
            c = c / (c.sum(axis=0, keepdims=True) + self.hc_eps)
            for _ in range(self.iters - 1):
                c = c / (c.sum(axis=1, keepdims=True) + self.hc_eps)
                c = c / (c.sum(axis=0, keepdims=True) + self.hc_eps)
            comb[t] = c
        return pre, post, comb

    def q_kv(self, x, pos):
        """The attention's roped queries [T, H, hd] and shared K=V rows [T, hd]
        of the rows `x` at positions `pos`."""
        T = x.shape[0]
        xn = rmsnorm(x, self.W("attn_norm.weight"), self.eps)
        qr = rmsnorm(xn @ self.W("attn_q_a.weight").T, self.W("attn_q_a_norm.weight"), self.eps)
        q = (qr @ self.W("attn_q_b.weight").T).reshape(T, self.H, self.hd)
        q = q / np.sqrt(np.mean(q * q, axis=-1, keepdims=True) + self.eps)  # per-head, no weight
        q = rope(q, pos, self.freqs)
        kv = rmsnorm(xn @ self.W("attn_kv.weight").T, self.W("attn_kv_a_norm.weight"), self.eps)
        return q, rope(kv, pos, self.freqs)

    def attn_output(self, o, pos):
        """The heads `o` [T, H, hd] at `pos`: inverse RoPE, grouped output."""
        o = rope(o, pos, self.freqs, inverse=True)
        return grouped_output(o, self.W("attn_output_a.weight"), self.W("attn_output_b.weight"),
                              self.o_groups, self.o_rank)

    def attention(self, x):
        """Causal attention over the last `sliding_window` rows."""
        pos = np.arange(x.shape[0])
        q, kv = self.q_kv(x, pos)
        sink = self.W("attn_sinks.weight")
        o = np.stack([sink_attention(q[t], kv[max(0, t - self.win + 1):t + 1], sink) for t in range(len(pos))])
        return self.attn_output(o, pos)

    def swiglu(self, g, u):
        if self.clamp > 1e-6:
            g, u = np.minimum(g, self.clamp), np.clip(u, -self.clamp, self.clamp)
        return g / (1 + np.exp(-g)) * u

    def moe(self, x):
        xn = rmsnorm(x, self.W("ffn_norm.weight"), self.eps)
        s = np.sqrt(np.logaddexp(0, xn @ self.W("ffn_gate_inp.weight").T))
        bias = self.W("exp_probs_b.bias")
        gate, up, down = (self.W(f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        y = np.zeros_like(xn)
        for t in range(xn.shape[0]):
            sel = topk_low_index(s[t] + bias, self.K)
            w = s[t][sel]
            if self.norm_topk:
                w = w / max(w.sum(), 2.0 ** -14)
            for e, we in zip(sel, w * self.route_scale):
                y[t] += down[e] @ (we * self.swiglu(gate[e] @ xn[t], up[e] @ xn[t]))
        sh = self.swiglu(xn @ self.W("ffn_gate_shexp.weight").T, xn @ self.W("ffn_up_shexp.weight").T)
        return y + sh @ self.W("ffn_down_shexp.weight").T

    def forward(self, states, next_ids):
        """Logits [L, vocab]: row j from the target state at j and token next_ids[j]."""
        e = self.embed[next_ids]
        ep = rmsnorm(e, self.W("enorm.weight"), self.eps) @ self.W("e_proj.weight").T
        hp = rmsnorm(states, self.W("hnorm.weight"), self.eps) @ self.W("h_proj.weight").T
        x = ep[:, None, :] + hp  # [L, hc, D]
        return self.head(self.sublayers(x, (("attn", self.attention), ("ffn", self.moe))))

    def sublayers(self, x, subs):
        """The HC state `x` [T, hc, D] through each (site, sublayer) of `subs`:
        collapse with the site's pre mix, the sublayer, write back with its
        post and comb mixes."""
        for site, sub in subs:
            pre, post, comb = self.mix(x, site)
            y = sub(np.einsum("th,thd->td", pre, x))
            x = post[:, :, None] * y[:, None, :] + np.einsum("tij,tid->tjd", comb, x)
        return x

    def head(self, x):
        """Logits [T, vocab] of the HC state `x`: collapse with the sigmoid
        head mix, final norm, the main model's output."""
        flat = x.reshape(x.shape[0], -1)
        flat = flat / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + self.eps)
        m = flat @ self.W("hc_head_fn.weight").T
        pre = sigmoid(m * self.W("hc_head_scale.weight")[0] + self.W("hc_head_base.weight")) + self.hc_eps
        y = rmsnorm(np.einsum("th,thd->td", pre, x), self.W("norm.weight"), self.eps)
        return y @ self.output.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the main model")
    ap.add_argument("--mtp", required=True, help="its MTP file")
    ap.add_argument("--inputs", required=True, help="PREFIX of PREFIX.ids.json and PREFIX.states.bin")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    ref = Mtp(a.gguf, a.mtp)
    inp = json.loads(Path(a.inputs + ".ids.json").read_text())
    ids, checkpoints = inp["ids"], inp["checkpoints"]
    L = len(ids) - 1
    states = np.fromfile(a.inputs + ".states.bin", dtype="<f4").astype(np.float64)
    states = states.reshape(L, ref.hc, ref.d)
    logits = ref.forward(states, np.asarray(ids[1:]))
    out = []
    for p in checkpoints:
        row = logits[p]
        lse = float(np.logaddexp.reduce(row))
        top = topk_low_index(row, a.top)
        out.append({"position": p, "next": ids[p + 1], "top_ids": [int(i) for i in top],
                    "top_logprobs": [float(row[i] - lse) for i in top], "logsumexp": lse})
    json.dump({"format": "ds4-mtp-golden-v1", "script": "tools/reference/mtp_reference.py",
               "numerics": "plain", "dtype": "float64", "window": ref.win,
               "pairing": "state at j with the token at j + 1, row at position j",
               "ids": ids, "checkpoints": out}, open(a.out, "w"), indent=1)
    print(f"wrote {a.out}: {len(out)} checkpoints over {L} rows")


if __name__ == "__main__":
    main()
