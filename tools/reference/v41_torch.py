#!/usr/bin/env python3
"""DeepSeek V4.1 float reference in torch (CPU, float64), ported module by
module from the official `inference/model.py` (HF deepseek-ai/DeepSeek-V4.1-Flash
@ dba1be0a40aa45a94ad051997016db3960a90277): Compressor, Indexer,
select_candidate_blocks, Attention, Gate, Expert, MoE, Engram, Block and
Transformer keep the official names, cache layout and order of operations.
Only the math is ported: the tilelang/fp8/fp4 kernels become plain torch in
float64 (`sparse_attn` is a gather + softmax with the sink, `hc_split_sinkhorn`
the kernel's split and Sinkhorn, every GEMM a float64 matmul), and the act/KV
fake-quantisation and bf16 casts are left out, except the Engram rows' bf16
cast, which is exact (E4M3 times a power of two). Engram hashing follows
`engram.py` as the research note and ds4's `ds4_engram.c` give it.

Unlike `v41_reference.py` (numpy, one prefill), this keeps the official caches,
so it runs both the official modes: a prefill at start_pos 0 and one-token
decode steps after it (window ring, compressor partial-group state, compressed
and index-key caches, the shared runtime). `--decode` compares the two.

Deviations, each written where it happens:
  * every top-k breaks ties toward the lowest index (a stable descending sort;
    torch.topk leaves ties unspecified) -- docs/V41.md;
  * every index-key owner publishes its own key cache at every step; the
    official code does so only when a compression group completes, a known
    defect of its decode path (its prefill is unaffected), which
    `--official-index-slot` reproduces;
  * the indexer asserts that it never keeps a row scored -inf inside the
    visible range (the official code would attend it; the tiny geometry and
    the released one rule it out).

    python3 tools/reference/v41_torch.py --gguf /tmp/ds4-v41-goldens/tiny-v41.gguf \
        --golden tests/golden/v41-tiny.json [--decode] [--hc tests/golden/v41-tiny.hc.bin]

The weights come from a ds4 `deepseek41` GGUF (`Checkpoint`) or from any other
source as a `StateDict` keyed by the same names (checkpoint_v41_reference.py:
an official-format checkpoint, read and mapped on its own).

Needs torch and gguf-py (pip install torch gguf numpy).
"""

import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("v41_torch.py needs gguf-py: pip install gguf")

DT = torch.float64

# True reproduces the released code's index-key slot on decode steps (see
# Indexer.__call__); `--official-index-slot` sets it.
OFFICIAL_INDEX_SLOT = False


# ------------------------------------------------------------------ file

class Checkpoint:
    """A ds4 `deepseek41` GGUF: metadata and float64 tensors in [out, in]
    order (GGUF ne reversed); Engram tables stay raw bytes."""

    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.kv = {f.name: f.contents() for f in r.fields.values()}
        if self.kv.get("general.architecture") != "deepseek41":
            raise ValueError(f"{path}: not a deepseek41 file")
        self.tensors = {t.name: t for t in r.tensors}
        self.cfg = json.loads(self.kv["deepseek41.config"])["text_config"]
        self.cache = {}

    def meta(self, key):
        return self.kv["deepseek41." + key]

    def raw(self, name):
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        return torch.from_numpy(np.asarray(t.data, dtype=np.uint8).reshape(shape).copy())

    def __getitem__(self, name):
        if name not in self.cache:
            t = self.tensors[name]
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            self.cache[name] = torch.from_numpy(np.asarray(data, dtype=np.float64).reshape(shape).copy())
        return self.cache[name]

    def engram_table(self, name, head_dim):
        """An Engram table's rows as float64 [rows, head_dim]: each row's
        E4M3 codes times its E8M0 scale per 32 (ds4's row layout: the codes,
        then the scale bytes)."""
        raw = self.raw(name)  # [rows, head_dim + head_dim / 32] bytes
        values = raw[:, :head_dim].contiguous().view(torch.float8_e4m3fn).to(DT)
        scales = raw[:, head_dim:].contiguous().view(torch.float8_e8m0fnu).to(DT)
        return (values.unflatten(-1, (-1, 32)) * scales.unsqueeze(-1)).flatten(-2)


class StateDict:
    """Weights from another source than a GGUF (tools/reference/
    checkpoint_v41_reference.py: an official-format checkpoint), with the
    interface of `Checkpoint`: `tensors` float64 torch tensors keyed by the
    names this port reads (ds4's GGUF names, in [out, in] order), `tables`
    each Engram table's float64 rows [rows, head_dim] keyed the same way,
    `meta` the metadata values keyed as `Checkpoint.meta` reads them
    (without the `deepseek41.` prefix), `cfg` the official text config.
    Reading a name or key that is not there raises."""

    def __init__(self, tensors, tables, meta, cfg):
        self.tensors, self.tables, self.kv, self.cfg = tensors, tables, meta, cfg
        self.read = set()

    def meta(self, key):
        return self.kv[key]

    def __getitem__(self, name):
        self.read.add(name)
        return self.tensors[name]

    def engram_table(self, name, head_dim):
        self.read.add(name)
        t = self.tables[name]
        if t.shape[1] != head_dim:
            raise ValueError(f"{name}: rows of {t.shape[1]}, head_dim {head_dim}")
        return t


class Args:
    """The official ModelArgs fields this port reads, from the GGUF metadata."""

    def __init__(self, ck):
        m = ck.meta
        self.n_layers = int(m("num_hidden_layers"))
        self.dim = int(m("hidden_size"))
        self.n_heads = int(m("num_attention_heads"))
        self.head_dim = int(m("head_dim"))
        self.rope_head_dim = int(m("qk_rope_head_dim"))
        self.window_size = int(m("sliding_window"))
        self.compress_ratios = [int(x) for x in m("compress_ratios")][: self.n_layers]
        self.kv_source_layers = [int(x) for x in m("kv_source_layer_ids")]
        self.index_source_layers = [int(x) for x in m("index_source_layer_ids")]
        self.index_n_heads = int(m("index_n_heads"))
        self.index_head_dim = int(m("index_head_dim"))
        self.index_topk = int(m("index_topk"))
        c = int(m("candidate_source_layer_id"))
        self.candidate_source_layer = c if c < self.n_layers else -1  # ds4 stores "none" as >= n_layers
        self.candidate_topk_blocks = int(m("candidate_topk_blocks"))
        self.candidate_block_size = int(m("candidate_block_size"))
        self.hc_mult = int(m("hc_mult"))
        self.hc_sinkhorn_iters = int(m("hc_sinkhorn_iters"))
        self.hc_eps = float(m("hc_eps"))
        self.norm_eps = float(m("rms_norm_eps"))
        self.n_routed_experts = int(m("n_routed_experts"))
        self.n_activated_experts = int(m("num_experts_per_tok"))
        self.norm_topk_prob = bool(m("norm_topk_prob"))
        self.swiglu_limit = float(m("swiglu_limit"))
        self.route_scale = float(m("routed_scaling_factor"))
        self.o_groups = int(m("o_groups"))
        self.o_lora_rank = int(m("o_lora_rank"))
        self.rope_theta = float(m("rope_theta"))
        self.compress_rope_theta = float(m("compress_rope_theta"))
        self.rope_factor = float(m("rope_scaling.factor"))
        self.original_seq_len = int(m("rope_scaling.original_max_position_embeddings"))
        self.beta_fast = float(m("rope_scaling.beta_fast"))
        self.beta_slow = float(m("rope_scaling.beta_slow"))
        self.engram_layer_ids = [int(x) for x in m("engram.layer_ids")]
        self.engram_max_ngram_size = int(ck.cfg["engram_max_ngram_size"])
        self.engram_n_heads = int(ck.cfg["engram_n_heads"])
        self.engram_head_dim = int(ck.cfg["engram_head_dim"])


# ------------------------------------------------------------------ kernels, in plain torch

def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))


def precompute_freqs_cis(dim, seqlen, original_seq_len, base, factor, beta_fast, beta_slow):
    """Official precompute_freqs_cis in float64: YaRN when original_seq_len > 0."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=DT) / dim))
    if original_seq_len > 0:
        def corrected_dim(rotations):
            return dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corrected_dim(beta_fast)), 0)
        high = min(math.ceil(corrected_dim(beta_slow)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=DT) - low) / max(high - low, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    freqs = torch.outer(torch.arange(seqlen, dtype=DT), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(x, freqs_cis, inverse=False):
    """Rotate adjacent pairs of x's last dim as complex numbers; freqs_cis
    has one row per position on x's sequence axis (axis 1). Returns a new
    tensor (the official one writes in place)."""
    z = torch.view_as_complex(x.contiguous().unflatten(-1, (-1, 2)))
    if inverse:
        freqs_cis = freqs_cis.conj()
    shape = [1, z.size(1)] + [1] * (z.ndim - 3) + [z.size(-1)]
    return torch.view_as_real(z * freqs_cis.view(shape)).flatten(-2)


def rope_tail(x, freqs_cis, rd, inverse=False):
    y = x.clone()
    y[..., -rd:] = apply_rotary_emb(x[..., -rd:], freqs_cis, inverse)
    return y


def topk_indices(scores, k):
    """torch.topk(..., dim=-1).indices with ties to the lowest index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """The tilelang kernel's math: q [b,s,h,d], kv [b,n,d] (K = V), topk_idxs
    [b,s,k] (-1 = empty slot), one sink logit per head in the softmax's
    denominator."""
    b, s, h, _ = q.shape
    valid = topk_idxs >= 0
    idx = topk_idxs.clamp_min(0).long()
    rows = torch.stack([kv[i][idx[i]] for i in range(b)])  # [b, s, k, d]
    scores = torch.einsum("bshd,bskd->bshk", q, rows) * softmax_scale
    scores = scores.masked_fill(~valid.unsqueeze(2), -torch.inf)
    sink = attn_sink.view(1, 1, h, 1).expand(b, s, h, 1)
    weights = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("bshk,bskd->bshd", weights, rows)


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc, iters, eps):
    """The kernel's split: pre = sigmoid + eps, post = 2 sigmoid, comb = row
    softmax + eps, a column normalisation, then iters - 1 row/column rounds."""
    pre = torch.sigmoid(mixes[..., :hc] * hc_scale[0] + hc_base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * hc_scale[1] + hc_base[hc:2 * hc])
    comb = (mixes[..., 2 * hc:] * hc_scale[2] + hc_base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def get_window_topk_idxs(window_size, bsz, seqlen, start_pos):
    if start_pos == 0:
        end = torch.arange(seqlen).unsqueeze(1)
        idxs = (end - window_size + 1).clamp(0) + torch.arange(min(seqlen, window_size))
        idxs = torch.where(idxs > end, -1, idxs)
    else:
        oldest = start_pos % window_size + 1
        idxs = torch.cat([torch.arange(oldest, window_size), torch.arange(oldest)])
        idxs = torch.where(idxs > start_pos, -1, idxs)
    return idxs.unsqueeze(0).expand(bsz, -1, -1)


# ------------------------------------------------------------------ Engram

class NgramHash:
    """engram.py's hashing: compressed ids, the last max_ngram - 1 of them
    carried across calls; shifts reaching before the sequence take the pad.
    int64 is exact: every multiplier is at most INT64_MAX / compressed_vocab."""

    def __init__(self, ck, args):
        self.n = args.engram_max_ngram_size
        heads = args.engram_n_heads
        self.cols = (self.n - 1) * heads
        layers = len(args.engram_layer_ids)
        self.token_map = torch.tensor([int(x) for x in ck.meta("engram.token_map")], dtype=torch.int64)
        self.pad = int(ck.meta("engram.pad_id"))
        primes = torch.tensor([int(x) for x in ck.meta("engram.primes")], dtype=torch.int64).view(layers, self.cols)
        self.primes = primes
        self.offsets = torch.cumsum(primes, -1) - primes
        self.mults = torch.tensor([int(x) for x in ck.meta("engram.multipliers")], dtype=torch.int64).view(layers, self.n)
        self.history = []

    def __call__(self, ids, start_pos):
        if start_pos == 0:
            self.history = []
        comp = self.token_map[ids].tolist()
        seq = self.history + comp
        base = len(self.history)
        T = len(comp)
        toks = torch.empty(T, self.n, dtype=torch.int64)
        for p in range(T):
            for s in range(self.n):
                j = base + p - s
                toks[p, s] = seq[j] if j >= 0 else self.pad
        self.history = seq[-(self.n - 1):] if self.n > 1 else []
        out = torch.empty(T, self.primes.size(0), self.cols, dtype=torch.int64)
        for li in range(self.primes.size(0)):
            m = self.mults[li]
            rolling = toks[:, 0] * m[0]
            for s in range(1, self.n):
                rolling = rolling ^ (toks[:, s] * m[s])
                c = slice((s - 1) * (self.cols // (self.n - 1)), s * (self.cols // (self.n - 1)))
                out[:, li, c] = rolling.unsqueeze(-1) % self.primes[li, c] + self.offsets[li, c]
        return out


class Engram:
    def __init__(self, ck, args, layer_id, trace):
        p = f"blk.{layer_id}."
        self.layer_id = layer_id
        self.slot = args.engram_layer_ids.index(layer_id)
        self.dim, self.hc_mult, self.eps = args.dim, args.hc_mult, args.norm_eps
        self.head_dim = args.engram_head_dim
        self.table = ck.engram_table(p + "engram_embd.weight", self.head_dim)  # [rows, head_dim]
        self.wkv = ck[p + "engram_kv.weight"]
        self.weight = ck[p + "engram_q_norm.weight"] * ck[p + "engram_k_norm.weight"]  # q_weight * k_weight
        self.trace = trace

    def embed(self, rows):
        """ParallelEngramEmbedding on one rank: the rows (E4M3 codes x E8M0
        scale per 32, decoded by the source), then the official bf16 cast;
        rows past the table read as zeros."""
        n = self.table.size(0)
        mask = rows >= n
        values = self.table[rows.masked_fill(mask, 0)]
        values = values.to(torch.bfloat16).to(DT)
        return values.masked_fill(mask.unsqueeze(-1), 0)

    def __call__(self, x, hash_ids):
        kv = self.embed(hash_ids[:, :, self.slot, :]).flatten(-2) @ self.wkv.T
        key, value = kv.split([self.hc_mult * self.dim, self.dim], dim=-1)
        key = key.unflatten(-1, (self.hc_mult, self.dim))
        rstd = torch.rsqrt(x.square().mean(-1) + self.eps) * torch.rsqrt(key.square().mean(-1) + self.eps)
        dot = (x * self.weight * key).sum(-1) * rstd * self.dim ** -0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        self.trace.setdefault("engram_gate", {}).setdefault(self.layer_id, []).append(gate[0])
        return x + gate.unsqueeze(-1) * value.unsqueeze(-2)


# ------------------------------------------------------------------ attention

class Shared:
    """The official SharedAttentionRuntime: what sources hand down the stack."""

    compress_kv = None
    index_k = None
    topk_idxs = None
    candidates = None


class Compressor:
    def __init__(self, ck, args, layer_id, max_seq_len):
        p = f"blk.{layer_id}."
        self.ratio = args.compress_ratios[layer_id]
        self.eps = args.norm_eps
        self.norm = ck[p + "attn_compressor_norm.weight"]
        self.wkv = ck[p + "attn_compressor_kv.weight"]
        if self.ratio > 1:
            self.wgate = ck[p + "attn_compressor_gate.weight"]
            self.kv_state = torch.zeros(1, self.ratio, args.head_dim, dtype=DT)
            self.score_state = torch.full((1, self.ratio, args.head_dim), -torch.inf, dtype=DT)

    def __call__(self, x, start_pos):
        bsz, seqlen, _ = x.shape
        ratio = self.ratio
        if ratio == 1:
            return rms_norm(x @ self.wkv.T, self.norm, self.eps)
        kv, score = x @ self.wkv.T, x @ self.wgate.T
        if start_pos == 0:
            should_compress = seqlen >= ratio
            remainder = seqlen % ratio
            cutoff = seqlen - remainder
            if remainder:
                self.kv_state[:bsz, :remainder] = kv[:, cutoff:]
                self.score_state[:bsz, :remainder] = score[:, cutoff:]
                kv, score = kv[:, :cutoff], score[:, :cutoff]
            kv = kv.unflatten(1, (-1, ratio))
            score = score.unflatten(1, (-1, ratio))
            kv = (kv * score.softmax(dim=2)).sum(dim=2)
        else:
            should_compress = (start_pos + 1) % ratio == 0
            slot = start_pos % ratio
            self.kv_state[:bsz, slot] = kv.squeeze(1)
            self.score_state[:bsz, slot] = score.squeeze(1)
            if should_compress:
                kv = (self.kv_state[:bsz] * self.score_state[:bsz].softmax(dim=1)).sum(dim=1, keepdim=True)
        if not should_compress:
            return None
        return rms_norm(kv, self.norm, self.eps)


def select_candidate_blocks(logits, compress_lens, topk_blocks, block_size):
    width = logits.size(-1)
    scores = F.pad(logits, (0, -width % block_size), value=-torch.inf)
    scores = scores.unflatten(-1, (-1, block_size)).amax(dim=-1)
    num_blocks = scores.size(-1)
    last = (compress_lens - 1) // block_size  # -1 pins nothing when nothing is visible
    scores = scores.masked_fill(torch.arange(num_blocks) == last, torch.inf)
    idx = topk_indices(scores, min(topk_blocks, num_blocks))
    vals = scores.gather(-1, idx)
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, vals > -torch.inf)
    return keep.repeat_interleave(block_size, dim=-1)[..., :width]


class Indexer:
    def __init__(self, ck, args, layer_id, max_seq_len, shared, trace):
        p = f"blk.{layer_id}."
        self.layer_id = layer_id
        self.owns_k = layer_id in args.kv_source_layers
        self.ratio = args.compress_ratios[layer_id]
        self.is_candidate_source = layer_id == args.candidate_source_layer
        self.uses_candidates = 0 <= args.candidate_source_layer < layer_id
        self.topk_blocks = args.candidate_topk_blocks
        self.block_size = args.candidate_block_size
        self.n_heads = args.index_n_heads
        self.head_dim = args.index_head_dim
        self.rd = args.rope_head_dim
        self.index_topk = args.index_topk
        self.softmax_scale = self.head_dim ** -0.5
        self.eps = args.norm_eps
        self.wq_b = ck[p + "indexer.attn_q_b.weight"]
        self.weights_proj = ck[p + "indexer.proj.weight"]
        self.shared, self.trace = shared, trace
        self.freqs_cis = None
        if self.owns_k:
            self.wk = ck[p + "indexer.attn_k.weight"]
            self.k_norm = ck[p + "indexer.k_norm.weight"]
            self.k_cache = torch.zeros(1, max_seq_len // self.ratio, self.head_dim, dtype=DT)

    def __call__(self, x, qr, latent, start_pos, offset):
        bsz, seqlen, _ = x.shape
        ratio, rd, end_pos = self.ratio, self.rd, start_pos + seqlen
        if self.owns_k and not OFFICIAL_INDEX_SLOT:
            # Deviation: an owner publishes its own keys every step. The
            # official code publishes only when a group completes, so on a
            # decode step where a ratio-2 source's group is still filling it
            # scores against the last publisher's keys (layer 20's ratio-1
            # rows in the release) -- unlike its own prefill (docs/V41.md).
            self.shared.index_k = self.k_cache
        if self.owns_k and latent is not None:
            freqs = (self.freqs_cis[: seqlen - seqlen % ratio: ratio] if start_pos == 0
                     else self.freqs_cis[start_pos + 1 - ratio].unsqueeze(0))
            k = rope_tail(rms_norm(latent @ self.wk.T, self.k_norm, self.eps), freqs, rd)
            self.k_cache[:bsz, start_pos // ratio: start_pos // ratio + k.size(1)] = k
            self.shared.index_k = self.k_cache
        q = (qr @ self.wq_b.T).unflatten(-1, (self.n_heads, self.head_dim))
        q = rope_tail(q, self.freqs_cis[start_pos:end_pos], rd)
        index_k = self.shared.index_k[:bsz, : end_pos // ratio]
        weights = (x @ self.weights_proj.T) * (self.softmax_scale * self.n_heads ** -0.5)
        index_score = torch.einsum("bshd,btd->bsht", q, index_k)
        index_score = (index_score.relu() * weights.unsqueeze(-1)).sum(dim=2)
        if start_pos == 0:
            compress_lens = (torch.arange(1, seqlen + 1) // ratio).unsqueeze(-1)
            index_score = index_score.masked_fill(torch.arange(seqlen // ratio) >= compress_lens, -torch.inf)
        else:
            compress_lens = torch.tensor(end_pos // ratio)
        if self.is_candidate_source:
            self.shared.candidates = select_candidate_blocks(index_score, compress_lens, self.topk_blocks,
                                                             self.block_size)
            self.trace.setdefault("candidates", {}).setdefault(self.layer_id, []).append(self.shared.candidates[0])
        elif self.uses_candidates:
            index_score = index_score.masked_fill(~self.shared.candidates, -torch.inf)
        topk = min(self.index_topk, end_pos // ratio)
        picked = topk_indices(index_score, topk)
        # Deviation check: a kept (visible) row must carry a finite score.
        got = index_score.gather(-1, picked)
        visible = picked < compress_lens
        assert not bool((visible & torch.isinf(got)).any()), f"layer {self.layer_id}: indexer kept a -inf row"
        idxs = picked.sort(dim=-1).values
        idxs = torch.where(idxs < compress_lens, idxs, -1)
        self.record(index_score[0], idxs[0], topk)
        return torch.where(idxs >= 0, idxs + offset, -1)

    def record(self, score, idxs, k):
        gaps = []
        for row in score:
            vals = torch.sort(row[torch.isfinite(row)], descending=True).values
            gaps.append(float(vals[k - 1] - vals[k]) if vals.numel() > k else None)
        self.trace.setdefault("indexer_gap", {}).setdefault(self.layer_id, []).extend(gaps)
        self.trace.setdefault("topk", {}).setdefault(self.layer_id, []).extend(idxs.tolist())


class Attention:
    def __init__(self, ck, args, layer_id, max_seq_len, shared, trace):
        p = f"blk.{layer_id}."
        self.layer_id = layer_id
        self.n_heads, self.head_dim, self.rd = args.n_heads, args.head_dim, args.rope_head_dim
        self.n_groups, self.o_lora_rank = args.o_groups, args.o_lora_rank
        self.window_size = args.window_size
        self.ratio = args.compress_ratios[layer_id]
        self.eps = args.norm_eps
        self.shared, self.trace = shared, trace
        self.attn_sink = ck[p + "attn_sinks.weight"]
        self.wq_a, self.q_norm = ck[p + "attn_q_a.weight"], ck[p + "attn_q_a_norm.weight"]
        self.wq_b = ck[p + "attn_q_b.weight"]
        self.wkv, self.kv_norm = ck[p + "attn_kv.weight"], ck[p + "attn_kv_a_norm.weight"]
        self.wo_a, self.wo_b = ck[p + "attn_output_a.weight"], ck[p + "attn_output_b.weight"]
        self.softmax_scale = self.head_dim ** -0.5
        self.is_kv_source = layer_id in args.kv_source_layers
        self.is_index_source = layer_id in args.index_source_layers
        self.compressor = Compressor(ck, args, layer_id, max_seq_len) if self.is_kv_source else None
        self.indexer = Indexer(ck, args, layer_id, max_seq_len, shared, trace) if self.is_index_source else None
        self.window_kv_cache = torch.zeros(1, self.window_size, self.head_dim, dtype=DT)
        if self.is_kv_source:
            self.compress_kv_cache = torch.zeros(1, max_seq_len // self.ratio, self.head_dim, dtype=DT)
        if self.ratio:
            self.freqs_cis = precompute_freqs_cis(self.rd, max_seq_len, args.original_seq_len,
                                                  args.compress_rope_theta, args.rope_factor,
                                                  args.beta_fast, args.beta_slow)
        else:  # pure sliding window: no YaRN, base theta
            self.freqs_cis = precompute_freqs_cis(self.rd, max_seq_len, 0, args.rope_theta, args.rope_factor,
                                                  args.beta_fast, args.beta_slow)
        if self.indexer is not None:
            self.indexer.freqs_cis = self.freqs_cis

    def window_kv(self, x, freqs_cis, start_pos):
        bsz, seqlen, _ = x.shape
        win = self.window_size
        kv = rope_tail(rms_norm(x @ self.wkv.T, self.kv_norm, self.eps), freqs_cis, self.rd)
        if start_pos == 0:
            if seqlen <= win:
                self.window_kv_cache[:bsz, :seqlen] = kv
            else:
                cutoff = seqlen % win
                tail = kv[:, -win:]
                self.window_kv_cache[:bsz, cutoff:win] = tail[:, : win - cutoff]
                self.window_kv_cache[:bsz, :cutoff] = tail[:, win - cutoff:]
            window = kv
        else:
            self.window_kv_cache[:bsz, start_pos % win] = kv.squeeze(1)
            window = self.window_kv_cache[:bsz]
        return window, get_window_topk_idxs(win, bsz, seqlen, start_pos)

    def compress_kv(self, x, qr, start_pos, offset):
        bsz, seqlen, _ = x.shape
        ratio = self.ratio
        compress_len = (start_pos + seqlen) // ratio
        latent = None
        if self.is_kv_source:
            latent = self.compressor(x, start_pos)
            self.shared.compress_kv = self.compress_kv_cache
        if self.is_index_source:
            if compress_len == 0:
                idxs = torch.empty(bsz, seqlen, 0, dtype=torch.int64)
            else:
                idxs = self.indexer(x, qr, latent, start_pos, offset)
            self.shared.topk_idxs = idxs
        idxs = self.shared.topk_idxs
        if latent is not None:
            freqs = (self.freqs_cis[: seqlen - seqlen % ratio: ratio] if start_pos == 0
                     else self.freqs_cis[start_pos + 1 - ratio].unsqueeze(0))
            latent = rope_tail(latent, freqs, self.rd)
            self.compress_kv_cache[:bsz, start_pos // ratio: start_pos // ratio + latent.size(1)] = latent
        return self.shared.compress_kv[:bsz, :compress_len], idxs

    def __call__(self, x, start_pos):
        bsz, seqlen, _ = x.shape
        freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]
        qr = rms_norm(x @ self.wq_a.T, self.q_norm, self.eps)
        q = (qr @ self.wq_b.T).unflatten(-1, (self.n_heads, self.head_dim))
        q = rope_tail(q, freqs_cis, self.rd)  # no per-head q norm in V4.1
        kv, topk_idxs = self.window_kv(x, freqs_cis, start_pos)
        if self.ratio:
            ckv, cidx = self.compress_kv(x, qr, start_pos, kv.size(1))
            kv = torch.cat([kv, ckv], dim=1)
            topk_idxs = torch.cat([topk_idxs, cidx], dim=-1)
        o = sparse_attn(q, kv, self.attn_sink, topk_idxs, self.softmax_scale)
        o = rope_tail(o, freqs_cis, self.rd, inverse=True)
        o = o.view(bsz, seqlen, self.n_groups, -1)
        wo_a = self.wo_a.view(self.n_groups, self.o_lora_rank, -1)
        o = torch.einsum("bsgd,grd->bsgr", o, wo_a)
        return o.flatten(2) @ self.wo_b.T


# ------------------------------------------------------------------ MoE

class MoE:
    def __init__(self, ck, args, layer_id, trace):
        p = f"blk.{layer_id}."
        self.layer_id = layer_id
        self.topk = args.n_activated_experts
        self.n_experts = args.n_routed_experts
        self.norm_topk_prob, self.route_scale = args.norm_topk_prob, args.route_scale
        self.limit = args.swiglu_limit
        self.gate_w, self.bias = ck[p + "ffn_gate_inp.weight"], ck[p + "exp_probs_b.bias"]
        self.w1, self.w3, self.w2 = (ck[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        self.s1, self.s3, self.s2 = (ck[p + f"ffn_{n}_shexp.weight"] for n in ("gate", "up", "down"))
        self.trace = trace

    def expert(self, x, w1, w3, w2, weights=None):
        gate, up = x @ w1.T, x @ w3.T
        if self.limit > 0:
            up = up.clamp(-self.limit, self.limit)
            gate = gate.clamp(max=self.limit)
        h = F.silu(gate) * up
        if weights is not None:
            h = weights * h
        return h @ w2.T

    def __call__(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = F.softplus(x @ self.gate_w.T).sqrt()  # sqrtsoftplus
        biased = scores + self.bias  # the bias picks, the raw scores weigh
        indices = topk_indices(biased, self.topk)
        weights = scores.gather(1, indices)
        if self.norm_topk_prob and self.topk > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.route_scale
        y = torch.zeros_like(x)
        for i in range(self.n_experts):
            idx, top = torch.where(indices == i)
            if idx.numel():
                y[idx] += self.expert(x[idx], self.w1[i], self.w3[i], self.w2[i], weights[idx, top, None])
        y += self.expert(x, self.s1, self.s3, self.s2)
        srt = torch.sort(biased, dim=-1, descending=True).values
        gaps = (srt[:, self.topk - 1] - srt[:, self.topk]).tolist() if self.n_experts > self.topk else [None] * len(x)
        self.trace.setdefault("experts", {}).setdefault(self.layer_id, []).extend(indices.tolist())
        self.trace.setdefault("router_gap", {}).setdefault(self.layer_id, []).extend(gaps)
        return y.view(shape)


# ------------------------------------------------------------------ blocks

class Block:
    def __init__(self, ck, args, layer_id, max_seq_len, shared, trace):
        p = f"blk.{layer_id}."
        self.norm_eps, self.hc_mult = args.norm_eps, args.hc_mult
        self.iters, self.hc_eps = args.hc_sinkhorn_iters, args.hc_eps
        self.attn = Attention(ck, args, layer_id, max_seq_len, shared, trace)
        self.ffn = MoE(ck, args, layer_id, trace)
        self.engram = Engram(ck, args, layer_id, trace) if layer_id in args.engram_layer_ids else None
        self.attn_norm, self.ffn_norm = ck[p + "attn_norm.weight"], ck[p + "ffn_norm.weight"]
        self.hc = {site: (ck[p + f"hc_{site}_fn.weight"], ck[p + f"hc_{site}_scale.weight"],
                          ck[p + f"hc_{site}_base.weight"]) for site in ("attn", "ffn")}

    def hc_mixes(self, x, site):
        fn, scale, base = self.hc[site]
        x = x.flatten(2)
        mixes = (x @ fn.T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.norm_eps)
        return hc_split_sinkhorn(mixes, scale, base, self.hc_mult, self.iters, self.hc_eps)

    @staticmethod
    def hc_pre(x, pre_mix):
        return torch.sum(pre_mix.unsqueeze(-1) * x, dim=2)

    @staticmethod
    def hc_post(x, residual, post, comb):
        return post.unsqueeze(-1) * x.unsqueeze(-2) + torch.sum(comb.unsqueeze(-1) * residual.unsqueeze(-2), dim=2)

    def __call__(self, x, start_pos, pre_mix):
        """Lagged hyper-connections: the attention collapses with the mix the
        previous FFN produced, the FFN with the one this attention produced."""
        residual = x
        attn_pre, attn_post, attn_comb = self.hc_mixes(x, "attn")
        y = rms_norm(self.hc_pre(x, pre_mix), self.attn_norm, self.norm_eps)
        x = self.hc_post(self.attn(y, start_pos), residual, attn_post, attn_comb)
        after_attn = x
        residual = x
        ffn_pre, ffn_post, ffn_comb = self.hc_mixes(x, "ffn")
        y = rms_norm(self.hc_pre(x, attn_pre), self.ffn_norm, self.norm_eps)
        x = self.hc_post(self.ffn(y), residual, ffn_post, ffn_comb)
        return x, ffn_pre, after_attn


class Transformer:
    """embed -> hc_mult copies -> (Engram) blocks -> collapse -> logits, with
    the official caches, so forward(ids, start_pos) is prefill at 0 and a
    decode step after it."""

    def __init__(self, path, max_seq_len=4096):
        """`path`: a deepseek41 GGUF, or a `StateDict`."""
        ck = self.ck = path if isinstance(path, StateDict) else Checkpoint(path)
        self.args = args = Args(ck)
        self.trace = {}
        self.shared = Shared()
        self.hash = NgramHash(ck, args)
        self.layers = [Block(ck, args, L, max_seq_len, self.shared, self.trace) for L in range(args.n_layers)]
        self.embed, self.norm, self.head = ck["token_embd.weight"], ck["output_norm.weight"], ck["output.weight"]

    def forward(self, ids, start_pos=0, hc_positions=()):
        """Logits [len(ids), vocab] for the ids at start_pos..; the trace
        accumulates per position across calls (reset at start_pos 0)."""
        if start_pos == 0:
            self.trace.clear()
        args = self.args
        input_ids = torch.tensor([ids], dtype=torch.int64)
        hashes = self.hash(input_ids[0], start_pos).unsqueeze(0)
        self.trace.setdefault("engram_rows", []).extend(hashes[0].tolist())
        h = self.embed[input_ids].unsqueeze(2).repeat(1, 1, args.hc_mult, 1)
        pre_mix = torch.zeros(1, len(ids), args.hc_mult, dtype=DT)
        pre_mix[:, :, 0] = 1.0
        hc = []
        pos = [p - start_pos for p in hc_positions if start_pos <= p < start_pos + len(ids)]
        for layer in self.layers:
            if layer.engram is not None:
                h = layer.engram(h, hashes)
            h, pre_mix, after_attn = layer(h, start_pos, pre_mix)
            hc.append([after_attn[0, pos], h[0, pos]])
        self.trace.setdefault("hc", []).append(hc)
        h = Block.hc_pre(h, pre_mix)
        return (rms_norm(h, self.norm, args.norm_eps) @ self.head.T)[0]


class TorchReference:
    """The interface make_v41_goldens.py uses (the numpy V41Reference's):
    forward(ids, hc_positions) -> float64 numpy logits, and a trace of plain
    Python/numpy values keyed the same way."""

    def __init__(self, path, max_seq_len=4096):
        self.model = Transformer(path, max_seq_len)
        self.ix_src = self.model.args.index_source_layers

    def forward(self, ids, hc_positions=()):
        logits = self.model.forward(ids, 0, hc_positions).numpy()
        self.trace = flat_trace(self.model.trace, hc_positions)
        return logits


def candidate_mask(masks):
    """The per-call [rows, width] masks as one [positions, widest] bool array
    (decode steps see a growing width)."""
    rows = [r for m in masks for r in m]
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r.numpy()
    return out


def flat_trace(tr, hc_positions=()):
    out = {
        "engram_rows": np.array(tr["engram_rows"], dtype=np.int64),
        "engram_gate": {L: torch.cat(v).numpy() for L, v in tr.get("engram_gate", {}).items()},
        "topk": {L: v for L, v in tr.get("topk", {}).items()},
        "candidates": {L: candidate_mask(v) for L, v in tr.get("candidates", {}).items()},
        "experts": tr["experts"],
        "router_gap": tr["router_gap"],
        "indexer_gap": tr.get("indexer_gap", {}),
    }
    if hc_positions:
        # [layer][sublayer][pos][stream][dim], from the one prefill call
        out["hc"] = np.array([[a.numpy(), b.numpy()] for a, b in tr["hc"][0]])
    return out


# ------------------------------------------------------------------ comparison with goldens

def log_softmax(logits):
    return torch.log_softmax(torch.as_tensor(logits, dtype=DT), -1).numpy()


def compare_prompt(p, logits, trace, ratios):
    """Worst |Δ log-prob| over the golden's top ids at every position, and
    whether every discrete choice equals the golden's."""
    lp = log_softmax(logits)
    worst = 0.0
    for t, (ids, ref) in enumerate(zip(p["top_ids"], p["top_logprobs"])):
        worst = max(worst, float(np.max(np.abs(lp[t, ids] - np.array(ref)))))
    lse = torch.logsumexp(torch.as_tensor(logits), -1).numpy()
    d_lse = float(np.max(np.abs(lse - np.array(p["logsumexp"]))))
    argmax_eq = int(np.sum(np.argmax(logits, -1) == np.array(p["argmax"])))
    out = {"prompt": p["name"], "positions": len(p["ids"]), "worst_dlogprob": worst, "worst_dlse": d_lse,
           "argmax_equal": argmax_eq}
    if "engram_rows" in p:
        out["engram_rows_equal"] = trace["engram_rows"].tolist() == p["engram_rows"]
        out["engram_gate_worst"] = max(float(np.max(np.abs(trace["engram_gate"][int(L)] - np.array(v))))
                                       for L, v in p["engram_gate"].items())
        # Kept rows only, visible ones only: a decode step records nothing
        # before its source has a row, and its masks end at the visible width.
        def kept(rows, T):
            rows = [[j for j in r if j >= 0] for r in rows]
            return [[]] * (T - len(rows)) + rows

        T = len(p["ids"])
        out["topk_equal"] = all(kept(trace["topk"][int(L)], T) == kept(v, T) for L, v in p["topk"].items())
        out["candidates_equal"] = all(
            [[int(j) for j in np.nonzero(row)[0] if j < (t + 1) // ratios[int(L)]]
             for t, row in enumerate(trace["candidates"][int(L)])]
            == [[j for j in r if j < (t + 1) // ratios[int(L)]] for t, r in enumerate(v)]
            for L, v in p["candidates"].items())
        out["experts_equal"] = all(trace["experts"][int(L)] == v for L, v in p["experts"].items())
    return out


def main():
    import argparse

    ap = argparse.ArgumentParser(description="V4.1 torch float64 reference")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", help="comma-separated token ids: print argmax and max logit per position")
    ap.add_argument("--golden", action="append", default=[], help="a v41 golden JSON to compare with")
    ap.add_argument("--hc", help="the golden's HC trace (v41-tiny.hc.bin) to compare with")
    ap.add_argument("--decode", action="store_true",
                    help="also run every prompt token by token (official decode path) and compare")
    ap.add_argument("--official-index-slot", action="store_true",
                    help="decode with the released code's index-key slot (stale keys on incomplete groups)")
    a = ap.parse_args()
    global OFFICIAL_INDEX_SLOT
    OFFICIAL_INDEX_SLOT = a.official_index_slot
    if a.ids:
        model = Transformer(a.gguf)
        logits = model.forward([int(x) for x in a.ids.split(",")]).numpy()
        for t, row in enumerate(logits):
            print(t, int(np.argmax(row)), float(row.max()))
    for path in a.golden:
        g = json.load(open(path))
        prompts = g["prompts"] if "prompts" in g else [g["prompt"]]
        for p in prompts:
            ref = TorchReference(a.gguf, max_seq_len=max(4096, len(p["ids"]) + 8))
            positions = g.get("hc_positions", p.get("hc_positions", ()))
            logits = ref.forward(p["ids"], hc_positions=positions)
            res = compare_prompt(p, logits, ref.trace, ref.model.args.compress_ratios)
            res["mode"] = "prefill"
            print(json.dumps(res))
            if a.hc and positions:
                hc = np.fromfile(a.hc, dtype="<f8").reshape(ref.trace["hc"].shape)
                print(json.dumps({"prompt": p["name"], "hc_worst_abs": float(np.max(np.abs(hc - ref.trace["hc"]))),
                                  "hc_max_abs": float(np.max(np.abs(hc)))}))
            if a.decode:
                m = ref.model
                rows = [m.forward(p["ids"][:1], 0).numpy()[0]]
                for t in range(1, len(p["ids"])):
                    rows.append(m.forward([p["ids"][t]], t).numpy()[0])
                dec = np.array(rows)
                res = compare_prompt(p, dec, flat_trace(m.trace), m.args.compress_ratios)
                res["mode"] = "decode"
                res["worst_vs_prefill_logit"] = float(np.max(np.abs(dec - logits)))
                print(json.dumps(res))


if __name__ == "__main__":
    main()
