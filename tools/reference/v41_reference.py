#!/usr/bin/env python3
"""DeepSeek V4.1 float reference in numpy float64, written from the semantics
of the official `inference/model.py` (HF deepseek-ai/DeepSeek-V4.1-Flash @
dba1be0a40aa45a94ad051997016db3960a90277) and its `engram.py` hashing as
reproduced by ds4's `ds4_engram.c`. Only the math is ported: the official
fp8/fp4 GEMMs, activation and KV fake-quantisation and bf16 casts are left
out (plain float64 throughout), as fastllm's pure-torch reference does.

`numerics="model"` (`--numerics model`) adds the official graph's simulated
quantisation, five steps selectable with `steps=` / `--steps` (docs/V41.md
§ Numerics, tools/reference/README.md):
  act         FP8 E4M3 act quant (blocks of 32, UE8M0 scales) of the input of
              every GEMM whose official weight is FP8/FP4: wq_a and wkv (one
              rounding of the attention-norm output), wq_b and indexer.wq_b (one
              rounding of qr), wo_b, Engram wkv, the experts' w1/w3 (routed and
              shared), the shared expert's w2;
  expert_mid  the routed experts' w2 input: act_fp8(route_weight * silu(g)*u);
  kv          FP8 act quant of the whole window KV row after kv_norm and RoPE;
  latent      FP4 E2M1 with E4M3 block scales, blocks of 16, of the compressed
              latent after its RoPE;
  index       FP4 E2M1 with UE8M0 scales, blocks of 32, of the index keys and
              the indexer queries (per head) after their RoPE.
The quantisers read float32 (the kernels' `x.float()`), compute in float32 and
return grid values; a row whose width is not a multiple of the block ends in a
shorter block (the tiny model: index rows of 16 under blocks of 32).
`python3 v41_reference.py --self-test` checks them.

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

from e2m1 import e2m1_magnitude


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


# ------------------------------------------------------------------ model numerics

STEPS = ("act", "expert_mid", "kv", "latent", "index")
F32 = np.float32
E4M3_MAX = F32(448.0)
E2M1_MAX = F32(6.0)
ACT_BLOCK, ACT_AMAX_FLOOR = 32, F32(1e-4)
INDEX_BLOCK, INDEX_AMAX_FLOOR = 32, F32(6.0 * 2.0 ** -126)
LATENT_BLOCK, LATENT_AMAX_FLOOR = 16, F32(6.0 * 2.0 ** -9)

# How often the literal float32 2^ceil(log2 r) differs from the exact smallest
# power of two >= r (frexp), per quantiser; reported by make_v41_goldens.py.
POW2_STATS = {"act": [0, 0], "index": [0, 0]}  # [scales computed, literal != exact]


def pow2_ceil_f32(r, stat=None):
    """2^ceil(log2 r) evaluated literally in float32 (float32 log2, ceil, exp2),
    as the brief states the official scale; r float32 > 0."""
    r = np.asarray(r, dtype=F32)
    s = np.exp2(np.ceil(np.log2(r))).astype(F32)
    if stat is not None:
        m, e = np.frexp(r)
        exact = np.ldexp(F32(1), np.where(m == 0.5, e - 1, e)).astype(F32)
        POW2_STATS[stat][0] += s.size
        POW2_STATS[stat][1] += int(np.count_nonzero(s != exact))
    return s


def e4m3_round(v):
    """Nearest float8 e4m3fn value of float32 `v` (|v| <= 448), ties to the
    even code; float32 out (exact: power-of-two spacing, np.round = half-even)."""
    v = np.asarray(v, dtype=F32)
    a = np.abs(v)
    _, e = np.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    exp = np.maximum(e - 1, -6)  # subnormals share 2^-6, spacing 2^-9
    spacing = np.ldexp(F32(1), exp - 3).astype(F32)
    return np.copysign((np.round(a / spacing) * spacing).astype(F32), v)


def e2m1_round(v):
    """Nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6} of `v` (|v| <= 6), ties to
    the even table index: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4."""
    v = np.asarray(v)
    return np.copysign(e2m1_magnitude(np.abs(v), np.where).astype(v.dtype), v)


def _blockwise(x, block, fn):
    """fn on consecutive blocks of the last dim of float32(x); a width that is
    not a multiple of `block` ends in a shorter block. float64 out."""
    x32 = np.asarray(x, dtype=F32)
    out = np.empty_like(x32)
    for b0 in range(0, x32.shape[-1], block):
        out[..., b0:b0 + block] = fn(x32[..., b0:b0 + block])
    return out.astype(np.float64)


def _amax(b, floor):
    return np.maximum(np.abs(b).max(axis=-1, keepdims=True), floor)


def act_fp8(x, block=ACT_BLOCK):
    """The official act quant round trip: per block amax (>= 1e-4), scale
    2^ceil(log2(amax/448)), q = clip(x/scale, +-448), E4M3(q) * scale."""
    def f(b):
        scale = pow2_ceil_f32(_amax(b, ACT_AMAX_FLOOR) / E4M3_MAX, "act")
        return e4m3_round(np.clip(b / scale, -E4M3_MAX, E4M3_MAX)) * scale
    return _blockwise(x, block, f)


def fp4_index(x, block=INDEX_BLOCK):
    """FP4 with UE8M0 scales: amax >= 6*2^-126, scale 2^ceil(log2(amax/6)),
    q = clip(x/scale, +-6), E2M1(q) * scale."""
    def f(b):
        scale = pow2_ceil_f32(_amax(b, INDEX_AMAX_FLOOR) / E2M1_MAX, "index")
        return e2m1_round(np.clip(b / scale, -E2M1_MAX, E2M1_MAX)) * scale
    return _blockwise(x, block, f)


def fp4_latent(x, block=LATENT_BLOCK):
    """FP4 with E4M3 scales: amax >= 6*2^-9, scale = E4M3(amax/6) (torch's
    float8_e4m3fn cast: nearest, ties even; above 464 it is NaN, 464 ties to 448),
    q = clip(x/scale, +-6) by true float32 division, E2M1(q) * scale."""
    def f(b):
        r = _amax(b, LATENT_AMAX_FLOOR) / E2M1_MAX
        if np.any(r > 464):
            raise ValueError("fp4_latent: amax/6 beyond E4M3's range (NaN in the official cast)")
        scale = e4m3_round(np.minimum(r, E4M3_MAX))  # (448, 464] rounds to 448 in the cast too
        return (e2m1_round(np.clip(b / scale, -E2M1_MAX, E2M1_MAX)) * scale).astype(F32)
    return _blockwise(x, block, f)


def parse_steps(numerics="plain", steps=None):
    """The set of steps: `steps` (names or a comma list) when given, else all
    five for numerics "model" and none for "plain"."""
    if numerics not in ("plain", "model"):
        raise ValueError(f"numerics must be plain or model, not {numerics!r}")
    if steps is None:
        return frozenset(STEPS if numerics == "model" else ())
    if isinstance(steps, str):
        steps = [s for s in steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        raise ValueError(f"unknown numerics steps {bad}; known: {', '.join(STEPS)}")
    if numerics == "plain" and steps:
        raise ValueError("steps given with numerics plain")
    return frozenset(steps)


def _self_test():
    rng = np.random.default_rng(1)
    # --- E4M3: against an independent oracle (nearest in the table of all
    # finite codes, ties to the even code), and torch's / ml_dtypes' casts.
    pos = E4M3[:127].astype(F32)  # codes 0..126, ascending
    mids = (pos[:-1] + pos[1:]) / 2  # exact ties (in float32)
    v = (rng.standard_normal(100000) * np.exp2(rng.integers(-12, 10, 100000))).astype(F32)
    v = np.concatenate([np.clip(v, -448, 448), mids, -mids, pos, -pos,
                        np.nextafter(mids, F32(0)), np.nextafter(mids, F32(500)),
                        np.array([0.0, -0.0, 448.0, -448.0, 2.0 ** -10, 3 * 2.0 ** -11], F32)]).astype(F32)
    a = np.abs(v).astype(np.float64)
    i = np.clip(np.searchsorted(pos.astype(np.float64), a), 1, 126)
    lo, hi = pos[i - 1].astype(np.float64), pos[i].astype(np.float64)
    pick = np.where(a - lo < hi - a, i - 1, np.where(a - lo > hi - a, i, np.where((i - 1) % 2 == 0, i - 1, i)))
    oracle = np.copysign(pos[pick], v)
    got = e4m3_round(v)
    assert np.array_equal(got, oracle), (v[got != oracle][:5], got[got != oracle][:5])
    assert np.array_equal(np.signbit(got[v == 0]), np.signbit(v[v == 0]))
    oracles = ["table"]
    try:
        import torch
        tv = torch.from_numpy(v)
        assert np.array_equal(tv.to(torch.float8_e4m3fn).float().numpy(), got)
        oracles.append(f"torch {torch.__version__} float8_e4m3fn")
    except ImportError:
        pass
    try:
        import ml_dtypes
        assert np.array_equal(v.astype(ml_dtypes.float8_e4m3fn).astype(F32), got)
        oracles.append(f"ml_dtypes {ml_dtypes.__version__} float8_e4m3fn")
    except ImportError:
        pass
    # --- E2M1: ties and neighbours
    t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 0.74, 1.26, 1.74, 2.51, 3.49, 5.01,
                  -0.25, -0.75, -5.0, 6.0, -6.0, 0.0], F32)
    want = [0, 1, 1, 2, 2, 4, 4, .5, .5, 1.5, 1.5, 3, 3, 6, -0.0, -1, -4, 6, -6, 0]
    assert e2m1_round(t).tolist() == want, e2m1_round(t).tolist()
    try:
        import ml_dtypes
        w = np.clip(rng.standard_normal(100000).astype(F32) * 3, -6, 6)
        grid = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], F32)
        w = np.concatenate([w, (grid[:-1] + grid[1:]) / 2, -(grid[:-1] + grid[1:]) / 2]).astype(F32)
        assert np.array_equal(w.astype(ml_dtypes.float4_e2m1fn).astype(F32), e2m1_round(w))
        oracles.append("ml_dtypes float4_e2m1fn")
    except ImportError:
        pass
    # --- the literal float32 scale: exact powers of two over the range used
    k = np.arange(-126, 21)
    assert np.array_equal(pow2_ceil_f32(np.ldexp(F32(1), k).astype(F32)), np.ldexp(F32(1), k).astype(F32))
    r = np.array([1.0, 0.5, 0.75, 3.0, 4.0, 1 / 448, 1e-4 / 448], F32)
    assert pow2_ceil_f32(r).tolist() == [1.0, 0.5, 1.0, 4.0, 4.0, 2.0 ** -8, 2.0 ** -22]
    # --- act: zeros, the amax floor, values on the grid, the shorter last block
    z = act_fp8(np.zeros((2, 40)))
    assert np.array_equal(z, np.zeros((2, 40)))
    tiny = np.full((1, 32), 1e-6)  # amax floored to 1e-4: scale 2^-22, 1e-6 = 4.19 * 2^-22 -> 4
    assert np.allclose(act_fp8(tiny), 4 * 2.0 ** -22, rtol=0, atol=0)
    x = rng.standard_normal((5, 70)) * np.exp2(rng.integers(-6, 6, (5, 1)))
    y = act_fp8(x)
    for b0 in (0, 32, 64):  # last block: 6 wide
        b = x[:, b0:b0 + 32].astype(F32)
        amax = np.maximum(np.abs(b).max(1, keepdims=True), F32(1e-4))
        s = np.exp2(np.ceil(np.log2(amax.astype(np.float64) / 448)))
        assert np.all(np.abs(y[:, b0:b0 + 32] / s) <= 448)
        assert np.array_equal(e4m3_round((y[:, b0:b0 + 32] / s).astype(F32)), (y[:, b0:b0 + 32] / s).astype(F32))
        assert np.all(np.abs(y[:, b0:b0 + 32] - b) <= np.abs(b) / 16 + s * 2.0 ** -10)
    assert not np.array_equal(y, x)
    # a block's result depends only on its own values: the 6-wide tail alone
    assert np.array_equal(act_fp8(x[:, 64:]), y[:, 64:])
    # --- index FP4 (UE8M0): zeros, floor, ties, shorter last block
    assert np.array_equal(fp4_index(np.zeros((1, 16))), np.zeros((1, 16)))
    row = np.array([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 0.1]])  # amax 6: scale 1
    assert fp4_index(row).tolist() == [[6, 0, 1, 1, 2, 2, 4, 4, -4, 0]]
    row2 = np.concatenate([np.full((1, 32), 0.5), row * 0.5], axis=1)  # block 2: 10 wide, scale 0.5
    assert fp4_index(row2)[0, 32:].tolist() == (np.array([6, 0, 1, 1, 2, 2, 4, 4, -4, 0]) * 0.5).tolist()
    assert fp4_index(row2)[0, :32].tolist() == [0.5] * 32  # amax .5: scale 2^ceil(log2(1/12)) = 1/8
    sub = np.full((1, 32), 2.0 ** -129)  # below the floor: scale 2^-126, q = 1/8 -> 0
    assert np.array_equal(fp4_index(sub), np.zeros((1, 32)))
    sub = np.full((1, 32), 3.0 * 2.0 ** -128)  # scale 2^-126, q = 0.75 -> 1 (tie to even index)
    assert np.array_equal(fp4_index(sub), np.full((1, 32), 2.0 ** -126))
    # agrees with V4's fp4_round (ds4_numerics.py, without the Hadamard) where torch exists
    xi = rng.standard_normal((7, 64)) * np.exp2(rng.integers(-8, 8, (7, 1)))
    try:
        import torch
        import ds4_numerics
        v4 = ds4_numerics.fp4_round(torch.from_numpy(xi.astype(F32))).double().numpy()
        assert np.array_equal(v4, fp4_index(xi))
        v4e = ds4_numerics.e4m3_round(torch.from_numpy(v)).numpy()
        assert np.array_equal(v4e, e4m3_round(v))
        oracles.append("ds4_numerics fp4_round / e4m3_round")
    except ImportError:
        pass
    # --- latent FP4 (E4M3 scale)
    assert np.array_equal(fp4_latent(np.zeros((1, 16))), np.zeros((1, 16)))
    # floor: amax 1e-3 -> 6*2^-9, scale E4M3(2^-9) = 2^-9; 1e-3 / 2^-9 = 0.512 -> 0.5
    assert np.array_equal(fp4_latent(np.full((1, 16), 1e-3)), np.full((1, 16), 0.5 * 2.0 ** -9))
    # amax 7: amax/6 = 1.1666.. -> E4M3 1.125 (between 1.125 and 1.25, nearer 1.125)
    lat = np.array([[7.0, 1.0, -2.0, 0.3] + [0.0] * 12 + [0.9] * 3], dtype=np.float64)  # 2nd block: 3 wide
    got = fp4_latent(lat)
    sc = F32(1.125)
    q = np.clip(lat[0, :4].astype(F32) / sc, -6, 6)  # 6.22->6, 0.889->1, -1.78->-2, 0.267->0.5
    assert got[0, :4].tolist() == [6 * 1.125, 1.125, -2 * 1.125, 0.5 * 1.125], (got, q)
    # 2nd block (3 wide) amax .9: .15 -> E4M3 0.15625 (of .140625 / .15625); .9 / .15625 = 5.76 -> 6
    assert np.array_equal(got[0, 16:], np.full(3, 6 * 0.15625))
    xs = (rng.standard_normal((50, 48)) * np.exp2(rng.integers(-7, 4, (50, 1)))).astype(np.float64)
    gl = fp4_latent(xs)
    for b0 in (0, 16, 32):
        b = xs[:, b0:b0 + 16].astype(F32)
        r = np.maximum(np.abs(b).max(1, keepdims=True), LATENT_AMAX_FLOOR) / F32(6)
        s = e4m3_round(r)
        try:
            import torch
            assert np.array_equal(torch.from_numpy(r).to(torch.float8_e4m3fn).float().numpy(), s)
        except ImportError:
            pass
        try:
            import ml_dtypes
            assert np.array_equal(r.astype(ml_dtypes.float8_e4m3fn).astype(F32), s)
        except ImportError:
            pass
        assert np.array_equal(gl[:, b0:b0 + 16], (e2m1_round(np.clip(b / s, -6, 6)) * s).astype(np.float64))
    # the largest scales: amax/6 = 464 ties to 448 (the cast's NaN code 0x7f is odd), beyond raises
    big = np.zeros((1, 16))
    big[0, 0] = 464 * 6
    assert fp4_latent(big)[0, 0] == 6 * 448
    big[0, 0] = 470 * 6
    try:
        fp4_latent(big)
        raise AssertionError("fp4_latent beyond E4M3")
    except ValueError:
        pass
    # --- steps
    assert parse_steps("model") == frozenset(STEPS) and parse_steps("plain") == frozenset()
    assert parse_steps("model", "kv,latent") == {"kv", "latent"}
    for bad in (("model", "kv,nope"), ("plain", "kv")):
        try:
            parse_steps(*bad)
            raise AssertionError(bad)
        except ValueError:
            pass
    print("v41 numerics self-test ok (E4M3 checked against: " + ", ".join(oracles) + ")")


# ------------------------------------------------------------------ model

class V41Reference:
    def __init__(self, path, numerics="plain", steps=None):
        self.steps = parse_steps(numerics, steps)
        self.numerics = "model" if self.steps else "plain"
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

    def rq(self, step, fn, x):
        """`fn(x)` when `step` is on, else `x` itself (plain stays bit-identical)."""
        return fn(x) if step in self.steps else x

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
        kv = self.rq("act", act_fp8, e) @ self.W(p + "engram_kv.weight").T
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
        xa = self.rq("act", act_fp8, x)  # wq_a and wkv read one rounding; the compressor and indexer weights x
        qr = rmsnorm(xa @ self.W(p + "attn_q_a.weight").T, self.W(p + "attn_q_a_norm.weight"), self.eps)
        qr = self.rq("act", act_fp8, qr)  # wq_b and indexer.wq_b read one rounding
        q = (qr @ self.W(p + "attn_q_b.weight").T).reshape(T, H, hd)
        q = rope(q, pos, freqs)  # no per-head q norm in V4.1
        kv = rmsnorm(xa @ self.W(p + "attn_kv.weight").T, self.W(p + "attn_kv_a_norm.weight"), self.eps)
        kv = self.rq("kv", act_fp8, rope(kv, pos, freqs))  # whole row, RoPE tail included
        sel = [list(range(max(0, t - self.win + 1), t + 1)) for t in range(T)]
        rows = [kv[s] for s in sel]
        if r:
            if L in self.kv_src:
                lat = self.compressor(L, x, r)  # pre-RoPE latents, one per whole group
                gpos = np.arange(lat.shape[0]) * r
                k = rmsnorm(lat @ self.W(p + "indexer.attn_k.weight").T, self.W(p + "indexer.k_norm.weight"), self.eps)
                shared["index_k"] = self.rq("index", fp4_index, rope(k, gpos, freqs))
                shared["kv"] = self.rq("latent", fp4_latent, rope(lat, gpos, freqs))
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
        return self.rq("act", act_fp8, o) @ self.W(p + "attn_output_b.weight").T

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
        q = self.rq("index", fp4_index, rope(q, np.arange(T), self.freqs_comp))  # per head
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
        xe = self.rq("act", act_fp8, x)  # experts' w1/w3 input; the router read x above
        mid = "expert_mid" in self.steps
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
                # the official Expert weighs before w2, whose act quant rounds the product
                h = we * self.swiglu(gate[e] @ xe[t], up[e] @ xe[t])
                y[t] += down[e] @ (act_fp8(h) if mid else h)
        sg = self.swiglu(xe @ self.W(p + "ffn_gate_shexp.weight").T, xe @ self.W(p + "ffn_up_shexp.weight").T)
        y += self.rq("act", act_fp8, sg) @ self.W(p + "ffn_down_shexp.weight").T
        self.trace.setdefault("experts", {})[L] = experts
        self.trace.setdefault("router_gap", {})[L] = gaps
        return y

    def swiglu(self, g, u):
        if self.limit > 0:
            u = np.clip(u, -self.limit, self.limit)
            g = np.minimum(g, self.limit)
        return g / (1 + np.exp(-g)) * u

    # -- whole model -----------------------------------------------------

    def forward(self, ids, hc_positions=(), taps_at=()):
        """Logits [T, vocab] of one prefill of `ids`; the trace holds the
        Engram rows and gates, top-k lists, candidates, experts, gaps, the
        HC state after each sublayer at `hc_positions` and, under "taps", the
        mean over the HC streams of the state entering each layer of
        `taps_at` after its Engram module (DSpark's `main_hiddens`)."""
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
            if L in taps_at:
                self.trace.setdefault("taps", []).append(x.mean(axis=1))
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
    ap.add_argument("--gguf")
    ap.add_argument("--ids", help="comma-separated token ids")
    ap.add_argument("--numerics", choices=("plain", "model"), default="plain",
                    help="plain (default): no simulated quantisation; model: the official graph's steps")
    ap.add_argument("--steps", help="with --numerics model: a comma list of " + ",".join(STEPS)
                    + " (default all five)")
    ap.add_argument("--self-test", action="store_true", help="check the quantisers and exit")
    a = ap.parse_args()
    if a.self_test:
        _self_test()
        sys.exit(0)
    if not a.gguf or not a.ids:
        ap.error("--gguf and --ids are required (or --self-test)")
    if a.steps and a.numerics != "model":
        ap.error("--steps needs --numerics model")
    ref = V41Reference(a.gguf, a.numerics, a.steps)
    ids = [int(x) for x in a.ids.split(",")]
    logits = ref.forward(ids)
    for t, row in enumerate(logits):
        print(t, int(np.argmax(row)), float(row.max()))
