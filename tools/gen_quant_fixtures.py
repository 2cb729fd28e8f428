#!/usr/bin/env python3
"""Bit-exact dequantisation fixtures for ds4's quant module, from gguf-py.

For each type (F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4) this builds raw blocks
with a fixed seed -- random bytes for codes/scales plus special cases (zero
d/dmin, +-65504, f16 subnormals, negative scales, all-zero and all-ones blocks)
-- decodes them with gguf.quants.dequantize (gguf-py 0.19.0) and writes
tests/data/quant/<TYPE>.bin:

    offset 0   8 bytes  magic b"DS4QFX01"
    offset 8   u32      ggml type id
    offset 12  u32      number of blocks n
    offset 16  u32      bytes per block
    offset 20  u32      elements per block
    offset 24  n*bytes  raw blocks
    then       n*elems  expected values, f32 bit patterns
All little-endian. f16 scale fields never hold inf/NaN patterns, so every
expected value is finite.

Usage: python3 tools/gen_quant_fixtures.py   (from the repository root)
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from importlib.metadata import version

from gguf import GGML_QUANT_SIZES
from gguf.quants import MXFP4, dequantize, quantize

SEED = 0xD54_0001
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "quant")

# Special f16 scale patterns: zero, -0, max, -max, subnormals, smallest
# normal, one, a typical small scale, negatives.
SPECIAL_F16 = [0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x03FF, 0x8001, 0x83FF,
               0x0400, 0x3C00, 0xBC00, 0x1F5C, 0x9F5C, 0x0200]


def random_finite_f16(rng, n):
    """Random f16 bit patterns: half uniformly over all finite patterns, half
    realistic magnitudes (|d| ~ 1e-4..1e-1, random sign)."""
    out = np.empty(n, dtype=np.uint16)
    for i in range(n):
        if rng.random() < 0.5:
            while True:
                b = int(rng.integers(0, 1 << 16))
                if (b >> 10) & 0x1F != 0x1F:
                    break
        else:
            v = np.float16(10 ** rng.uniform(-4, -1) * (1 if rng.random() < 0.8 else -1))
            b = int(v.view(np.uint16))
        out[i] = b
    return out


def scale_fields(rng, n, count):
    """`count` f16 fields per block for n blocks: the first blocks walk through
    combinations of the special values, the rest are random finite."""
    f = random_finite_f16(rng, n * count).reshape(n, count)
    k = 0
    for a in SPECIAL_F16:
        for b in (SPECIAL_F16 if count == 2 else [None]):
            if k >= n // 2:
                break
            if count == 2 and rng.random() < 0.75:
                continue  # keep a sample of the pairs, not all 196
            f[k, 0] = a
            if count == 2:
                f[k, 1] = b
            k += 1
    return f


def f16_bytes(col):
    return col.astype("<u2").view(np.uint8).reshape(-1, 2)


def make_blocks(qtype, rng, n):
    _, nbytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    if qtype == T.Q8_0:
        f = scale_fields(rng, n, 1)
        raw[:, 0:2] = f16_bytes(f[:, 0])
    elif qtype == T.Q2_K:
        f = scale_fields(rng, n, 2)
        raw[:, 80:82] = f16_bytes(f[:, 0])
        raw[:, 82:84] = f16_bytes(f[:, 1])
    elif qtype == T.Q4_K:
        f = scale_fields(rng, n, 2)
        raw[:, 0:2] = f16_bytes(f[:, 0])
        raw[:, 2:4] = f16_bytes(f[:, 1])
    elif qtype == T.IQ2_XXS:
        f = scale_fields(rng, n, 1)
        raw[:, 0:2] = f16_bytes(f[:, 0])
    else:
        raise ValueError(qtype)
    # Last blocks: all-zero, then all 0xFF codes/scales with a finite d
    # (and dmin), then zero codes with d = 1.
    raw[-1, :] = 0
    raw[-2, :] = 0xFF
    raw[-3, :] = 0
    if qtype == T.Q8_0:
        raw[-2, 0:2] = f16_bytes(np.array([0x3C00], dtype=np.uint16))
        raw[-3, 0:2] = f16_bytes(np.array([0x3C00], dtype=np.uint16))
    elif qtype == T.Q2_K:
        raw[-2, 80:84] = f16_bytes(np.array([0x7BFF, 0xFBFF], dtype=np.uint16)).ravel()
        raw[-3, 80:84] = f16_bytes(np.array([0x3C00, 0x3C00], dtype=np.uint16)).ravel()
    elif qtype == T.Q4_K:
        raw[-2, 0:4] = f16_bytes(np.array([0x7BFF, 0x7BFF], dtype=np.uint16)).ravel()
        raw[-3, 0:4] = f16_bytes(np.array([0x3C00, 0x3C00], dtype=np.uint16)).ravel()
    elif qtype == T.IQ2_XXS:
        raw[-2, 0:2] = f16_bytes(np.array([0x7BFF], dtype=np.uint16))
        raw[-3, 0:2] = f16_bytes(np.array([0x3C00], dtype=np.uint16))
    return raw


def make_scalars(qtype, rng, n):
    """F16 / BF16 'blocks' of one value: every special pattern, then random
    finite bit patterns."""
    if qtype == T.F16:
        special = SPECIAL_F16 + [0x7BFE, 0x0002, 0x3555, 0xC000]
        ok = lambda b: (b >> 10) & 0x1F != 0x1F  # noqa: E731
    else:
        special = [0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001, 0x007F, 0x8001, 0x0080, 0x3F80, 0xBF80, 0x4049]
        ok = lambda b: (b >> 7) & 0xFF != 0xFF  # noqa: E731
    vals = list(special)
    while len(vals) < n:
        b = int(rng.integers(0, 1 << 16))
        if ok(b):
            vals.append(b)
    return np.array(vals, dtype="<u2").view(np.uint8).reshape(n, 2)


# MXFP4 scale bytes worth a block of their own: the two subnormal scales, the
# smallest normal, 2^-1 (e = 127), and the top three, where large codes
# overflow to +-inf in f32 (gguf-py's values, kept as they are).
MXFP4_EDGE_E = [0, 1, 2, 127, 253, 254, 255]


def make_mxfp4_blocks(rng, n):
    """Random blocks (scale bytes uniform over 0..255, codes random), the
    first ones with the edge scale bytes, each with every nibble value in
    both halves of the byte (codes 0..15 low, 15..0 high)."""
    raw = rng.integers(0, 256, size=(n, 17), dtype=np.uint8)
    every = np.arange(16, dtype=np.uint8) | (np.arange(15, -1, -1, dtype=np.uint8) << 4)
    for k, e in enumerate(MXFP4_EDGE_E):
        raw[2 * k, 0] = e
        raw[2 * k, 1:] = every
        raw[2 * k + 1, 0] = e  # the same scale with random codes
    return raw


def mxfp4_quantize_inputs(rng, n):
    """f32 blocks for the quantizer fixture: Gaussian rows at several scales,
    exact code values and halfway points (ties), values just below and at
    powers of two (the floor(log2) boundary), zeros, -0, and mixed signs."""
    x = np.empty((n, 32), dtype=np.float32)
    for i in range(n):
        kind = i % 6
        s = np.float32(2.0 ** rng.integers(-30, 30))
        if kind == 0:
            b = rng.standard_normal(32).astype(np.float32) * s
        elif kind == 1:  # exact table values times a power of two
            b = np.array(MXFP4.kvalues * 2, dtype=np.float32) * s
            rng.shuffle(b)
        elif kind == 2:  # midpoints between neighbouring table values (ties)
            k = np.array(sorted(set(MXFP4.kvalues)), dtype=np.float32)
            mids = (k[1:] + k[:-1]) / 2
            b = rng.choice(mids, 32).astype(np.float32) * s
            b[0] = np.float32(12.0) * s
        elif kind == 3:  # amax just below a power of two
            b = (rng.random(32).astype(np.float32) - np.float32(0.5)) * s
            p = np.float32(2.0 ** rng.integers(-40, 40))
            b[rng.integers(0, 32)] = np.nextafter(p, np.float32(0), dtype=np.float32) * (1 if i % 12 < 6 else -1)
            b = np.clip(b, -p, p)
        elif kind == 4:  # amax exactly a power of two, few non-zeros
            b = np.zeros(32, dtype=np.float32)
            b[rng.integers(0, 32, 5)] = rng.standard_normal(5).astype(np.float32) * s
            b[rng.integers(0, 32)] = -np.float32(2.0 ** rng.integers(-40, 40))
            b = np.where(np.abs(b) > np.abs(b).max() / 2, b, b / 4).astype(np.float32)
        else:  # heavy-tailed, like real weights
            b = (rng.standard_t(3, 32) * 0.02).astype(np.float32)
        x[i] = b
    x[-1] = 0
    x[-2] = -0.0
    return x


def write_mxfp4_quantize(x):
    """tests/data/quant/MXFP4_quantize.bin: f32 inputs and gguf-py's bytes.

    offset 0 magic b"DS4QQZ01", then u32 type id, u32 n, u32 bytes per block,
    u32 values per block; n*elems f32 inputs; n*bytes expected blocks."""
    qtype = T.MXFP4
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    n = x.shape[0]
    q = np.asarray(quantize(x, qtype), dtype=np.uint8).reshape(n, nbytes)
    path = os.path.join(OUT, f"{qtype.name}_quantize.bin")
    with open(path, "wb") as f:
        f.write(b"DS4QQZ01")
        f.write(struct.pack("<IIII", int(qtype), n, nbytes, elems))
        f.write(x.astype("<f4").tobytes())
        f.write(q.tobytes())
    print(f"{qtype.name + ' q':8s} {n:5d} blocks  {os.path.getsize(path):8d} bytes  -> {os.path.relpath(path)}")


def write(qtype, raw):
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    n = raw.shape[0]
    with np.errstate(over="ignore"):
        expected = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(n, elems)
    if qtype == T.MXFP4:
        # Scale bytes >= 253 overflow to +-inf with large codes; never NaN.
        assert not np.any(np.isnan(expected)), qtype.name
    else:
        assert np.all(np.isfinite(expected)), qtype.name
    path = os.path.join(OUT, f"{qtype.name}.bin")
    with open(path, "wb") as f:
        f.write(b"DS4QFX01")
        f.write(struct.pack("<IIII", int(qtype), n, nbytes, elems))
        f.write(raw.tobytes())
        f.write(expected.astype("<f4").tobytes())
    print(f"{qtype.name:8s} {n:5d} blocks  {os.path.getsize(path):8d} bytes  -> {os.path.relpath(path)}")


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    print(f"gguf-py {version('gguf')}, numpy {np.__version__}, seed {SEED:#x}")
    write(T.F16, make_scalars(T.F16, rng, 4096))
    write(T.BF16, make_scalars(T.BF16, rng, 4096))
    write(T.Q8_0, make_blocks(T.Q8_0, rng, 512))
    for qt in (T.Q2_K, T.Q4_K, T.IQ2_XXS):
        write(qt, make_blocks(qt, rng, 256))
    # Added after the others so their bytes stay as they were.
    write(T.MXFP4, make_mxfp4_blocks(rng, 1024))
    write_mxfp4_quantize(mxfp4_quantize_inputs(rng, 1200))


if __name__ == "__main__":
    main()
