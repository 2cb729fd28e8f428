"""ds4's rounding steps (MODEL.md §3.5.1), written from the spec in plain torch.

Every function works in the dtype of its input (float32 or float64) and is exact
in that dtype: scales are powers of two found with frexp (no log2/ceil on floats),
and rounding to a narrow float format divides by a power-of-two spacing, rounds
half to even with torch.round and multiplies back, so no double rounding happens.

* fp8_kv_round(x, n_rot)   E4M3 round trip with UE8M0 block scales on the non-RoPE
                           dims of a KV row (blocks of 64 from dim 0; a shorter last
                           block when HD - NR is not a multiple of 64, tiny models).
* f16_round(x)             IEEE binary16 round-to-nearest-even (cache storage).
* hadamard_fp4(x)          Sylvester Walsh-Hadamard (orthonormal) then E2M1 round
                           trip in blocks of 32 with power-of-two scales (indexer
                           queries and compressed keys).

Run this file to self-test against torch's own float8/float16 casts.
"""

import math

import torch

from e2m1 import e2m1_magnitude

E4M3_MAX = 448.0
E4M3_MANT_BITS = 3
E4M3_MIN_NORMAL_EXP = -6  # 2^-6; subnormals are m * 2^-9
FP8_BLOCK = 64
FP8_AMAX_FLOOR = 1e-4

F16_MAX = 65504.0
F16_MANT_BITS = 10
F16_MIN_NORMAL_EXP = -14  # subnormals are m * 2^-24

E2M1_MAX = 6.0
FP4_BLOCK = 32
FP4_AMAX_FLOOR = 7.052966104933725e-38  # 6 * 2^-126, as in MODEL.md


def pow2_ceil(r: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= r (r > 0), exactly: 2^ceil(log2 r)."""
    m, e = torch.frexp(r)  # r = m * 2^e, m in [0.5, 1)
    e = torch.where(m == 0.5, e - 1, e)
    return torch.ldexp(torch.ones_like(r), e)


def round_to_format(a: torch.Tensor, mant_bits: int, min_normal_exp: int) -> torch.Tensor:
    """Rounds |values| `a` (>= 0, finite, already clamped to the format's max) to the
    nearest value with `mant_bits` stored mantissa bits and the given minimum normal
    exponent; ties to even mantissa (= even code, since codes are monotonic)."""
    _, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1) => floor(log2 a) = e - 1
    exp = torch.clamp(e - 1, min=min_normal_exp)  # subnormal range shares the min exponent
    spacing = torch.ldexp(torch.ones_like(a), exp - mant_bits)
    return torch.round(a / spacing) * spacing  # torch.round: half to even


def e4m3_round(v: torch.Tensor) -> torch.Tensor:
    """Nearest finite float8 e4m3fn value of v (v already within +-448)."""
    a = v.abs()
    q = round_to_format(a, E4M3_MANT_BITS, E4M3_MIN_NORMAL_EXP)
    return torch.copysign(q, v)


def f16_round(x: torch.Tensor) -> torch.Tensor:
    """IEEE binary16 round to nearest even, returned in x's dtype (no overflow allowed)."""
    a = x.abs()
    if bool((a > F16_MAX).any()):
        raise ValueError("f16_round: value beyond the f16 range")
    q = round_to_format(a, F16_MANT_BITS, F16_MIN_NORMAL_EXP)
    q = torch.where(a == 0, a, q)
    return torch.copysign(q, x)


def fp8_kv_round(x: torch.Tensor, n_rot: int) -> torch.Tensor:
    """E4M3 round trip on dims [0, HD - n_rot) of every row (last dim), in blocks of 64
    with scale 2^ceil(log2(max(amax, 1e-4) / 448)); the RoPE tail is untouched."""
    hd = x.shape[-1]
    n_nope = hd - n_rot
    out = x.clone()
    for b0 in range(0, n_nope, FP8_BLOCK):
        b1 = min(b0 + FP8_BLOCK, n_nope)
        blk = x[..., b0:b1]
        amax = blk.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR)
        scale = pow2_ceil(amax / E4M3_MAX)
        v = torch.clamp(blk / scale, -E4M3_MAX, E4M3_MAX)
        out[..., b0:b1] = e4m3_round(v) * scale
    return out


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value {0, .5, 1, 1.5, 2, 3, 4, 6} (v within +-6), ties to the even
    table index: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4."""
    return torch.copysign(e2m1_magnitude(v.abs(), torch.where).to(v.dtype), v)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform in natural (Sylvester) order on the last
    dim: butterflies (a, b) -> (a + b, a - b) with strides 1, 2, 4, ..., n/2, then a
    multiplication by 1/sqrt(n)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard: width {n} is not a power of two")
    y = x.clone()
    h = 1
    while h < n:
        y = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(x.shape) * (1.0 / math.sqrt(n))


def fp4_round(x: torch.Tensor) -> torch.Tensor:
    """E2M1 round trip in blocks of 32 along the last dim, scale 2^ceil(log2(amax/6))."""
    n = x.shape[-1]
    if n % FP4_BLOCK:
        raise ValueError(f"fp4_round: width {n} is not a multiple of {FP4_BLOCK}")
    blocks = x.reshape(*x.shape[:-1], n // FP4_BLOCK, FP4_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=FP4_AMAX_FLOOR)
    scale = pow2_ceil(amax / E2M1_MAX)
    v = torch.clamp(blocks / scale, -E2M1_MAX, E2M1_MAX)
    return (e2m1_round(v) * scale).reshape(x.shape)


def hadamard_fp4(x: torch.Tensor) -> torch.Tensor:
    """Indexer QAT simulation: Hadamard, then FP4 round trip. The result stays in the
    Hadamard basis (queries and keys both are, so q.k is unchanged up to rounding)."""
    return fp4_round(hadamard(x))


def _self_test() -> None:
    g = torch.Generator().manual_seed(1)
    # E4M3 against torch's cast (float32 input; RNE, saturated by the clamp).
    v = torch.randn(200000, generator=g, dtype=torch.float32) * torch.exp2(
        torch.randint(-12, 10, (200000,), generator=g).float())
    v = v.clamp(-448, 448)
    # add exact ties: midpoints between consecutive e4m3 values
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[:-1] + codes[1:]) / 2
    v = torch.cat([v, mids, -mids, codes, torch.tensor([0.0, -0.0, 448.0, -448.0])])
    ref = v.to(torch.float8_e4m3fn).float()
    got = e4m3_round(v)
    assert torch.equal(got, ref), (v[got != ref][:10], got[got != ref][:10], ref[got != ref][:10])
    got64 = e4m3_round(v.double())
    assert torch.equal(got64.float(), ref)
    # f16 against torch's float32 -> float16 cast
    w = torch.randn(200000, generator=g) * torch.exp2(torch.randint(-30, 14, (200000,), generator=g).float())
    h = torch.arange(0, 0x7bff, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    w = torch.cat([w, (h[:-1] + h[1:]) / 2, h])
    assert torch.equal(f16_round(w), w.half().float())
    assert torch.equal(f16_round(w.double()).float(), w.half().float())
    # E2M1 ties
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 0.74, 5.01, -0.75, -5.0])
    assert e2m1_round(t).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.5, 0.5, 6.0, -1.0, -4.0]
    # Hadamard is orthonormal and matches the Sylvester matrix
    n = 32
    hm = torch.ones(1, 1, dtype=torch.float64)
    while hm.shape[0] < n:
        hm = torch.cat([torch.cat([hm, hm], 1), torch.cat([hm, -hm], 1)], 0)
    xs = torch.randn(5, n, generator=g, dtype=torch.float64)
    assert torch.allclose(hadamard(xs), xs @ hm.T / math.sqrt(n), atol=1e-12)
    # pow2_ceil on exact powers and neighbours
    r = torch.tensor([1.0, 0.5, 0.75, 1.0000001, 3.0, 4.0], dtype=torch.float64)
    assert pow2_ceil(r).tolist() == [1.0, 0.5, 1.0, 2.0, 4.0, 4.0]
    # fp8 kv: rope tail untouched, values on the grid
    kv = torch.randn(3, 64, generator=g, dtype=torch.float64)
    out = fp8_kv_round(kv, 16)
    assert torch.equal(out[:, 48:], kv[:, 48:])
    assert bool(((out[:, :48] - kv[:, :48]).abs() <= kv[:, :48].abs() / 16 + 2.0**-16).all())
    assert not torch.equal(out[:, :48], kv[:, :48])
    print("ds4_numerics self-test ok")


if __name__ == "__main__":
    _self_test()
