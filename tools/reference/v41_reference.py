#!/usr/bin/env python3
"""DeepSeek V4.1 float reference in numpy float64, written from the semantics
of the official `inference/model.py` (HF deepseek-ai/DeepSeek-V4.1-Flash @
dba1be0a40aa45a94ad051997016db3960a90277) and its `engram.py` hashing as
reproduced by ds4's `ds4_engram.c`. Only the math is ported: the official
fp8/fp4 GEMMs, activation and KV fake-quantisation and bf16 casts are left
out (plain float64 throughout), as fastllm's pure-torch reference does.

torch was the brief's first choice; this machine reaches PyPI only (the CPU
wheel index is not reachable) and the CUDA wheel is several GB, so numpy
float64 it is (docs/V41.md).

The whole prompt is one prefill at start_pos 0, the official code's only
multi-token mode, which gives logits at every position. Deviations, all
written where they happen:
  * ties in every top-k (router, candidate blocks, indexer rows) go to the
    lowest index (torch.topk leaves that unspecified);
  * the indexer's top-k never takes a row scored -inf (outside the
    candidates): the official code could, when a kept set holds fewer rows
    than top-k; the tiny model's geometry never lets that happen
    ((topk_blocks - 1) * block + 1 >= top-k), so both agree here.

Reads the GGUF with gguf-py (F32/F16 tensors, raw I8 Engram rows).
"""

import json
import math
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("v41_reference.py needs gguf-py: pip install gguf numpy")


# ------------------------------------------------------------------ file

class V41File:
    """Metadata and tensors of a ds4 `deepseek41` GGUF, as float64 arrays in
    HF [out, in] order (GGUF ne reversed)."""

    def __init__(self, path):
        self.r = gguf.GGUFReader(path)
        self.kv = {}
        for f in self.r.fields.values():
            self.kv[f.name] = f.contents()
        if self.kv.get("general.architecture") != "deepseek41":
            raise ValueError("not a deepseek41 file")
        self.tensors = {t.name: t for t in self.r.tensors}
        self.cfg = json.loads(self.kv["deepseek41.config"])["text_config"]

    def k(self, key):
        return self.kv["deepseek41." + key]

    def has(self, name):
        return name in self.tensors

    def t(self, name):
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if t.tensor_type == gguf.GGMLQuantizationType.I8:
            return np.asarray(t.data, dtype=np.uint8).reshape(shape)
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(data, dtype=np.float64).reshape(shape)


# ------------------------------------------------------------------ pieces

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope_freqs(n_rot, base, yarn):
    """official precompute_freqs_cis, frequencies only (YaRN when given)."""
    freqs = 1.0 / (base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
    if yarn is not None:
        factor, orig, beta_fast, beta_slow = yarn

        def corrected_dim(rot):
            return n_rot * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corrected_dim(beta_fast)), 0)
        high = min(math.ceil(corrected_dim(beta_slow)), n_rot - 1)
        ramp = np.clip((np.arange(n_rot // 2, dtype=np.float64) - low) / max(high - low, 1e-3), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def rope(x, pos, freqs, inverse=False):
    """Rotate the last 2*len(freqs) dims of x[..., d] (adjacent pairs) by
    angle pos*freq; pos broadcasts against x's leading axis."""
    n_rot = 2 * len(freqs)
    y = x.copy()
    tail = y[..., -n_rot:]
    a = tail[..., 0::2].copy()
    b = tail[..., 1::2].copy()
    ang = np.multiply.outer(np.asarray(pos, dtype=np.float64), freqs)  # [T, n_rot/2]
    if a.ndim == 3:  # [T, heads, n_rot/2]
        ang = ang[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    if inverse:
        s = -s
    tail[..., 0::2] = a * c - b * s
    tail[..., 1::2] = a * s + b * c
    return y


def topk_low_index(scores, k):
    """Indices of the k largest (ties: lowest index first), descending."""
    order = np.lexsort((np.arange(len(scores)), -scores))
    return order[:k]


def sinkhorn_split(m, scale, base, n, iters, eps):
    pre = sigmoid(m[:n] * scale[0] + base[:n]) + eps
    post = 2 * sigmoid(m[n:2 * n] * scale[1] + base[n:2 * n])
    c = (m[2 * n:] * scale[2] + base[2 * n:]).reshape(n, n)
    c = np.exp(c - c.max(axis=1, keepdims=True))
    c = c / c.sum(axis=1, keepdims=True) + eps
    c = c / (c.sum(axis=0, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=1, keepdims=True) + eps)
        c = c / (c.sum(axis=0, keepdims=True) + eps)
    return pre, post, c


# ------------------------------------------------------------------ Engram

def engram_hash(f, ids):
    """Row ids [T, n_layers, cols] (official engram.py / ds4_engram.c)."""
    cfg = f.cfg
    max_ngram = cfg["engram_max_ngram_size"]
    heads = cfg["engram_n_heads"]
    layers = [int(x) for x in f.k("engram.layer_ids")]
    cols = (max_ngram - 1) * heads
    primes = [int(x) for x in f.k("engram.primes")]
    mults = [int(x) for x in f.k("engram.multipliers")]
    tmap = [int(x) for x in f.k("engram.token_map")]
    pad = int(f.k("engram.pad_id"))
    comp = [tmap[i] for i in ids]
    out = np.zeros((len(ids), len(layers), cols), dtype=np.int64)
    mask64 = (1 << 64) - 1
    for p in range(len(ids)):
        toks = []
        blocked = False
        for s in range(max_ngram):
            blocked |= p - s < 0
            toks.append(pad if blocked else comp[p - s])
        for li in range(len(layers)):
            m = mults[li * max_ngram:(li + 1) * max_ngram]
            pr = primes[li * cols:(li + 1) * cols]
            offs = np.concatenate([[0], np.cumsum(pr)[:-1]])
            h = (toks[0] * m[0]) & mask64
            for s in range(1, max_ngram):
                h ^= (toks[s] * m[s]) & mask64
                for hd in range(heads):
                    c = (s - 1) * heads + hd
                    out[p, li, c] = h % pr[c] + int(offs[c])
    return out


E4M3 = np.array(
    [((-1) ** (b >> 7)) * ((2.0 ** (((b >> 3) & 15) - 7)) * (1 + (b & 7) / 8) if (b >> 3) & 15
                           else (b & 7) / 8 * 2.0 ** -6) for b in range(256)], dtype=np.float64)


def engram_rows(table, rows, head_dim):
    """Dequantised rows [.., head_dim] of a row264 table (bf16 rounding is
    exact for these values: E4M3 times a power of two)."""
    raw = table[rows]
    codes = raw[..., :head_dim]
    scales = raw[..., head_dim:].astype(np.int64)
    if np.any((codes & 0x7F) == 0x7F) or np.any(scales == 255):
        raise ValueError("NaN code or scale in an Engram row")
    v = E4M3[codes]
    s = np.repeat(2.0 ** (scales - 127), 32, axis=-1)
    return v * s


# ------------------------------------------------------------------ model

class V41Reference:
    def __init__(self, path):
        f = self.f = V41File(path)
        self.n_layer = int(f.k("num_hidden_layers"))
        self.d = int(f.k("hidden_size"))
        self.H = int(f.k("num_attention_heads"))
        self.hd = int(f.k("head_dim"))
        self.n_rot = int(f.k("qk_rope_head_dim"))
        self.win = int(f.k("sliding_window"))
        self.ratios = [int(x) for x in f.k("compress_ratios")][: self.n_layer]
        self.kv_src = [int(x) for x in f.k("kv_source_layer_ids")]
        self.ix_src = [int(x) for x in f.k("index_source_layer_ids")]
        self.IH = int(f.k("index_n_heads"))
        self.ID = int(f.k("index_head_dim"))
        self.topk = int(f.k("index_topk"))
        self.cand_src = int(f.k("candidate_source_layer_id"))
        self.cand_blocks = int(f.k("candidate_topk_blocks"))
        self.cand_size = int(f.k("candidate_block_size"))
        self.hc = int(f.k("hc_mult"))
        self.iters = int(f.k("hc_sinkhorn_iters"))
        self.hc_eps = float(f.k("hc_eps"))
        self.eps = float(f.k("rms_norm_eps"))
        self.E = int(f.k("n_routed_experts"))
        self.K = int(f.k("num_experts_per_tok"))
        self.limit = float(f.k("swiglu_limit"))
        self.route_scale = float(f.k("routed_scaling_factor"))
        self.o_groups = int(f.k("o_groups"))
        self.o_rank = int(f.k("o_lora_rank"))
        yarn = (float(f.k("rope_scaling.factor")), float(f.k("rope_scaling.original_max_position_embeddings")),
                float(f.k("rope_scaling.beta_fast")), float(f.k("rope_scaling.beta_slow")))
        self.freqs_window = rope_freqs(self.n_rot, float(f.k("rope_theta")), None)
        self.freqs_comp = rope_freqs(self.n_rot, float(f.k("compress_rope_theta")),
                                     yarn if yarn[0] > 1 else None)
        self.engram_layers = [int(x) for x in f.k("engram.layer_ids")]
        self.engram_hd = f.cfg["engram_head_dim"]
        self.w = {}

    def W(self, name):
        if name not in self.w:
            self.w[name] = self.f.t(name)
        return self.w[name]

    # -- sublayers -------------------------------------------------------

    def mixes(self, x, site, L):
        T = x.shape[0]
        flat = x.reshape(T, -1)
        m = flat @ self.W(f"blk.{L}.hc_{site}_fn.weight").T
        m = m / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + self.eps)
        scale = self.W(f"blk.{L}.hc_{site}_scale.weight")
        base = self.W(f"blk.{L}.hc_{site}_base.weight")
        pre, post, comb = [], [], []
        for t in range(T):
            a, b, c = sinkhorn_split(m[t], scale, base, self.hc, self.iters, self.hc_eps)
            pre.append(a), post.append(b), comb.append(c)
        return np.array(pre), np.array(post), np.array(comb)

    @staticmethod
    def hc_pre(x, pre):
        return np.einsum("th,thd->td", pre, x)

    @staticmethod
    def hc_post(y, res, post, comb):
        # y[j] = post[j]*h + sum_i comb[i][j]*res[i]
        return post[:, :, None] * y[:, None, :] + np.einsum("tij,tid->tjd", comb, res)

    def engram(self, L, x, rows):
        p = f"blk.{L}."
        slot = self.engram_layers.index(L)
        e = engram_rows(self.W(p + "engram_embd.weight"), rows[:, slot, :], self.engram_hd)
        e = e.reshape(e.shape[0], -1)
        kv = e @ self.W(p + "engram_kv.weight").T
        d, hc = self.d, self.hc
        key = kv[:, : hc * d].reshape(-1, hc, d)
        value = kv[:, hc * d:]
        weight = self.W(p + "engram_q_norm.weight") * self.W(p + "engram_k_norm.weight")
        rstd = 1 / np.sqrt(np.mean(x * x, -1) + self.eps) / np.sqrt(np.mean(key * key, -1) + self.eps)
        dot = (x * weight * key).sum(-1) * rstd * d ** -0.5
        gate = sigmoid(np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot))
        self.trace.setdefault("engram_gate", {})[L] = gate
        return x + gate[:, :, None] * value[:, None, :]

    def attention(self, L, x, shared):
        p = f"blk.{L}."
        T = x.shape[0]
        H, hd = self.H, self.hd
        r = self.ratios[L]
        freqs = self.freqs_comp if r else self.freqs_window
        pos = np.arange(T)
        qr = rmsnorm(x @ self.W(p + "attn_q_a.weight").T, self.W(p + "attn_q_a_norm.weight"), self.eps)
        q = (qr @ self.W(p + "attn_q_b.weight").T).reshape(T, H, hd)
        q = rope(q, pos, freqs)  # no per-head q norm in V4.1
        kv = rmsnorm(x @ self.W(p + "attn_kv.weight").T, self.W(p + "attn_kv_a_norm.weight"), self.eps)
        kv = rope(kv, pos, freqs)
        sel = [list(range(max(0, t - self.win + 1), t + 1)) for t in range(T)]
        rows = [kv[s] for s in sel]
        if r:
            if L in self.kv_src:
                lat = self.compressor(L, x, r)  # pre-RoPE latents, one per whole group
                gpos = np.arange(lat.shape[0]) * r
                k = rmsnorm(lat @ self.W(p + "indexer.attn_k.weight").T, self.W(p + "indexer.k_norm.weight"), self.eps)
                shared["index_k"] = rope(k, gpos, freqs)
                shared["kv"] = rope(lat, gpos, freqs)
            if L in self.ix_src:
                shared["topk"] = self.indexer(L, x, qr, r, shared)
            topk = shared["topk"]
            ckv = shared["kv"]
            rows = [np.concatenate([rows[t], ckv[[j for j in topk[t] if j >= 0]]]) for t in range(T)]
            self.trace.setdefault("topk", {})[L] = topk
        sink = self.W(p + "attn_sinks.weight")
        o = np.zeros((T, H, hd))
        for t in range(T):
            s = q[t] @ rows[t].T * hd ** -0.5  # [H, n]
            m = np.maximum(s.max(axis=1), sink)
            e = np.exp(s - m[:, None])
            den = e.sum(axis=1) + np.exp(sink - m)
            o[t] = (e @ rows[t]) / den[:, None]
        o = rope(o, pos, freqs, inverse=True)
        g, orank = self.o_groups, self.o_rank
        o = o.reshape(T, g, -1)
        wo_a = self.W(p + "attn_output_a.weight").reshape(g, orank, -1)
        o = np.einsum("tgd,grd->tgr", o, wo_a).reshape(T, -1)
        return o @ self.W(p + "attn_output_b.weight").T

    def compressor(self, L, x, r):
        p = f"blk.{L}."
        kv = x @ self.W(p + "attn_compressor_kv.weight").T
        norm = self.W(p + "attn_compressor_norm.weight")
        if r == 1:
            return rmsnorm(kv, norm, self.eps)
        score = x @ self.W(p + "attn_compressor_gate.weight").T
        n = x.shape[0] // r
        kv = kv[: n * r].reshape(n, r, -1)
        score = score[: n * r].reshape(n, r, -1)
        w = np.exp(score - score.max(axis=1, keepdims=True))
        w = w / w.sum(axis=1, keepdims=True)
        return rmsnorm((kv * w).sum(axis=1), norm, self.eps)

    def indexer(self, L, x, qr, r, shared):
        p = f"blk.{L}."
        T = x.shape[0]
        q = (qr @ self.W(p + "indexer.attn_q_b.weight").T).reshape(T, self.IH, self.ID)
        q = rope(q, np.arange(T), self.freqs_comp)
        w = x @ self.W(p + "indexer.proj.weight").T * (self.ID ** -0.5 * self.IH ** -0.5)
        k = shared["index_k"]
        n = k.shape[0]
        score = (np.maximum(np.einsum("thd,jd->thj", q, k), 0) * w[:, :, None]).sum(axis=1)  # [T, n]
        lens = (np.arange(T) + 1) // r
        score[np.arange(n)[None, :] >= lens[:, None]] = -np.inf
        if L == self.cand_src:
            shared["cand"] = self.candidate_blocks(score, lens)
            self.trace.setdefault("candidates", {})[L] = shared["cand"]
        elif 0 <= self.cand_src < L:
            score = np.where(shared["cand"], score, -np.inf)
        kk = min(self.topk, T // r)
        out, gaps = [], []
        for t in range(T):
            idx = topk_low_index(score[t], kk) if kk else np.array([], dtype=np.int64)
            finite = np.isfinite(score[t])
            kept = sorted(int(j) for j in idx if j < lens[t] and finite[j])
            out.append(kept + [-1] * (kk - len(kept)))
            vals = np.sort(score[t][finite])[::-1]
            gaps.append(float(vals[kk - 1] - vals[kk]) if len(vals) > kk else None)
        self.trace.setdefault("indexer_gap", {})[L] = gaps
        self.trace.setdefault("index_scores", {})[L] = score
        return out

    def candidate_blocks(self, score, lens):
        T, n = score.shape
        bs = self.cand_size
        nb = -(-n // bs)
        pad = np.full((T, nb * bs), -np.inf)
        pad[:, :n] = score
        blocks = pad.reshape(T, nb, bs).max(axis=2)
        keep = np.zeros((T, n), dtype=bool)
        for t in range(T):
            b = blocks[t].copy()
            last = (lens[t] - 1) // bs
            if lens[t] >= 1:
                b[last] = np.inf
            top = topk_low_index(b, min(self.cand_blocks, nb))
            for j in top:
                if b[j] > -np.inf:
                    keep[t, j * bs:(j + 1) * bs] = True
        return keep

    def moe(self, L, x):
        p = f"blk.{L}."
        T = x.shape[0]
        logits = x @ self.W(p + "ffn_gate_inp.weight").T
        s = np.sqrt(np.logaddexp(0, logits))  # sqrt(softplus)
        bias = self.W(p + "exp_probs_b.bias")
        gate, up, down = (self.W(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
        y = np.zeros_like(x)
        experts, gaps = [], []
        for t in range(T):
            biased = s[t] + bias
            sel = topk_low_index(biased, self.K)
            srt = np.sort(biased)[::-1]
            gaps.append(float(srt[self.K - 1] - srt[self.K]) if self.E > self.K else None)
            w = s[t][sel]
            if self.K > 1:
                w = w / (w.sum() + 1e-20)
            w = w * self.route_scale
            experts.append([int(e) for e in sel])
            for e, we in zip(sel, w):
                y[t] += down[e] @ (we * self.swiglu(gate[e] @ x[t], up[e] @ x[t]))
        sg = self.swiglu(x @ self.W(p + "ffn_gate_shexp.weight").T, x @ self.W(p + "ffn_up_shexp.weight").T)
        y += sg @ self.W(p + "ffn_down_shexp.weight").T
        self.trace.setdefault("experts", {})[L] = experts
        self.trace.setdefault("router_gap", {})[L] = gaps
        return y

    def swiglu(self, g, u):
        if self.limit > 0:
            u = np.clip(u, -self.limit, self.limit)
            g = np.minimum(g, self.limit)
        return g / (1 + np.exp(-g)) * u

    # -- whole model -----------------------------------------------------

    def forward(self, ids, hc_positions=()):
        """Logits [T, vocab] of one prefill of `ids`; the trace holds the
        Engram rows and gates, top-k lists, candidates, experts, gaps and the
        HC state after each sublayer at `hc_positions`."""
        self.trace = {}
        T = len(ids)
        rows = engram_hash(self.f, ids)
        self.trace["engram_rows"] = rows
        h = self.W("token_embd.weight")[ids]
        x = np.repeat(h[:, None, :], self.hc, axis=1)
        pre_mix = np.zeros((T, self.hc))
        pre_mix[:, 0] = 1.0
        shared = {}
        hc_trace = []
        for L in range(self.n_layer):
            p = f"blk.{L}."
            if L in self.engram_layers:
                x = self.engram(L, x, rows)
            res = x
            a_pre, a_post, a_comb = self.mixes(x, "attn", L)
            y = rmsnorm(self.hc_pre(x, pre_mix), self.W(p + "attn_norm.weight"), self.eps)
            y = self.attention(L, y, shared)
            x = self.hc_post(y, res, a_post, a_comb)
            after_attn = x[list(hc_positions)]
            res = x
            f_pre, f_post, f_comb = self.mixes(x, "ffn", L)
            y = rmsnorm(self.hc_pre(x, a_pre), self.W(p + "ffn_norm.weight"), self.eps)
            y = self.moe(L, y)
            x = self.hc_post(y, res, f_post, f_comb)
            pre_mix = f_pre
            hc_trace.append([after_attn, x[list(hc_positions)]])
        self.trace["hc"] = hc_trace
        y = self.hc_pre(x, pre_mix)
        y = rmsnorm(y, self.W("output_norm.weight"), self.eps)
        return y @ self.W("output.weight").T


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="V4.1 float64 reference: logits of one prompt")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    a = ap.parse_args()
    ref = V41Reference(a.gguf)
    ids = [int(x) for x in a.ids.split(",")]
    logits = ref.forward(ids)
    for t, row in enumerate(logits):
        print(t, int(np.argmax(row)), float(row.max()))
