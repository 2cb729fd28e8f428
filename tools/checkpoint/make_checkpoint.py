#!/usr/bin/env python3
"""A tiny checkpoint in DeepSeek's official safetensors layout, and its exact
values decoded on this side (for tests/convert_checkpoint.rs).

    make_checkpoint.py --out DIR [--block 128] [--seed 1]

Writes into DIR:

* `config.json` with the release's `quantization_config` (fp8 E4M3 weights,
  UE8M0 scales over `--block` x `--block` blocks: 128 for V4 Flash, 32 for
  V4.1, FP4 routed experts);
* two shards `model-00001-of-00002.safetensors`, `model-00002-of-00002...`
  (globals and layer 0 in the first, layer 1 in the second) and
  `model.safetensors.index.json` (`metadata.total_size`, `weight_map`);
* `expected.json` + `expected.bin`: every tensor as this script decodes it (`shape` the logical one: `[out, in]`
  for packed FP4),
  from the spec (../shared/spec/GGUF.md sections 9-10, QUANTS.md section 10)
  and independently of the Rust reader: float tensors as little-endian f32,
  the I64 table as i32. `expected.json` maps each name to its `shape`, `kind`
  ("f32" or "i32"), byte `offset` into `expected.bin` and element `count`.

Storage follows the release: FP8 E4M3 projections with an F8_E8M0 `.scale`
per block (`[ceil(out/B), ceil(in/B)]`), routed experts as I8 `[out, in/2]`
(element 2j in the low nibble of byte j, 2j+1 in the high one) with an
F8_E8M0 `.scale` `[out, in/32]`, BF16 / F16 / F32 others, an I64 `tid2eid`.
The codes are random bytes, so every E4M3 pattern (NaN ones included, read as
0) and every E2M1 code (-0 included) occurs; the `wq_b` and expert-1 scales
include the extreme bytes 0 and 254. Scale byte 255 (NaN) is never written.

Decoding here: values are exact products in Python floats (binary64),
narrowed once to f32 (round to nearest even; an overflow is +-inf), which is
what one f32 product of the two exact factors gives.

Python standard library only; the same seed gives the same bytes.
"""

import argparse
import json
import math
import random
import struct
from pathlib import Path

# Shapes: small, with FP8 matrices that do not fill their last block, one
# of them several blocks wide at 128 (`wo_b`) and one several high (`wq_b`).
DIM = 96
VOCAB = 50
EXPERT_FF = 64
N_EXPERTS = 2
N_LAYERS = 2


# ------------------------------------------------------------------ small floats


def e4m3_value(b):
    """E4M3FN byte -> float (GGUF.md section 10; the NaN pattern reads as 0)."""
    if b & 0x7F == 0x7F:
        return 0.0
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_value(n):
    """4-bit E2M1 code -> float (bit 3 = sign; code 8 is -0)."""
    v = E2M1[n & 7]
    return -v if n & 8 else v


def e8m0_value(e):
    assert e != 255, "E8M0 NaN is never written"
    return 2.0 ** (e - 127)


def f32_bits(x):
    """Round a binary64 to the nearest f32 (ties to even) and give its bits."""
    try:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return 0xFF800000 if x < 0 else 0x7F800000


def bf16_value(h):
    return struct.unpack("<f", struct.pack("<I", h << 16))[0]


def f16_value(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


# ------------------------------------------------------------------ tensors


class Tensor:
    def __init__(self, name, dtype, shape, data, expect, kind="f32", logical=None):
        self.name, self.dtype, self.shape, self.data = name, dtype, shape, data
        # expect: f32 bit patterns (kind f32) or ints (kind i32), row-major,
        # of the logical shape (packed FP4 holds two values a byte).
        self.expect, self.kind, self.logical = expect, kind, logical or shape


def rng_for(seed, name):
    return random.Random(f"{seed}:{name}")


def f32_tensor(seed, name, shape, scale=1.0):
    r = rng_for(seed, name)
    n = math.prod(shape)
    vals = [r.gauss(0.0, scale) for _ in range(n)]
    bits = [f32_bits(v) for v in vals]
    return Tensor(name, "F32", shape, struct.pack(f"<{n}I", *bits), bits)


def bf16_tensor(seed, name, shape):
    r = rng_for(seed, name)
    n = math.prod(shape)
    hs = [f32_bits(r.gauss(0.0, 0.5)) >> 16 for _ in range(n)]
    bits = [f32_bits(bf16_value(h)) for h in hs]
    return Tensor(name, "BF16", shape, struct.pack(f"<{n}H", *hs), bits)


def f16_tensor(seed, name, shape):
    r = rng_for(seed, name)
    n = math.prod(shape)
    hs = [struct.unpack("<H", struct.pack("<e", r.gauss(0.0, 0.5)))[0] for _ in range(n)]
    # Subnormals and every exponent: a few raw patterns (no inf / NaN).
    for i, h in enumerate([0x0001, 0x03FF, 0x8001, 0x7BFF, 0x8000]):
        hs[i] = h
    bits = [f32_bits(f16_value(h)) for h in hs]
    return Tensor(name, "F16", shape, struct.pack(f"<{n}H", *hs), bits)


def i64_tensor(seed, name, shape, hi):
    r = rng_for(seed, name)
    n = math.prod(shape)
    vals = [r.randrange(hi) for _ in range(n)]
    return Tensor(name, "I64", shape, struct.pack(f"<{n}q", *vals), vals, "i32")


def scale_bytes(r, n, extremes):
    es = [r.randrange(118, 134) for _ in range(n)]
    if extremes:
        es[0], es[-1] = 0, 254
    return es


def fp8_pair(seed, name, out, inp, block, extremes=False):
    """E4M3 weight [out, inp] and its E8M0 block scales."""
    r = rng_for(seed, name)
    codes = [r.randrange(256) for _ in range(out * inp)]
    sr, sc = -(-out // block), -(-inp // block)
    es = scale_bytes(r, sr * sc, extremes)
    bits = []
    for i in range(out):
        for j in range(inp):
            s = e8m0_value(es[(i // block) * sc + j // block])
            bits.append(f32_bits(e4m3_value(codes[i * inp + j]) * s))
    sname = name[: -len(".weight")] + ".scale"
    return [
        Tensor(name, "F8_E4M3", [out, inp], bytes(codes), bits),
        scale_tensor(sname, [sr, sc], es),
    ]


def fp4_pair(seed, name, out, inp, extremes=False):
    """Packed E2M1 weight [out, inp/2] (I8) and its E8M0 scales [out, inp/32]."""
    r = rng_for(seed, name)
    packed = [r.randrange(256) for _ in range(out * inp // 2)]
    es = scale_bytes(r, out * inp // 32, extremes)
    bits = []
    for i in range(out):
        for j in range(inp):
            byte = packed[(i * inp + j) // 2]
            nib = byte & 15 if j % 2 == 0 else byte >> 4
            s = e8m0_value(es[i * (inp // 32) + j // 32])
            bits.append(f32_bits(e2m1_value(nib) * s))
    sname = name[: -len(".weight")] + ".scale"
    return [
        Tensor(name, "I8", [out, inp // 2], bytes(packed), bits, logical=[out, inp]),
        scale_tensor(sname, [out, inp // 32], es),
    ]


def scale_tensor(name, shape, es):
    return Tensor(name, "F8_E8M0", shape, bytes(es), [f32_bits(e8m0_value(e)) for e in es])


def layer(seed, li, block):
    p = f"layers.{li}."
    ts = []
    ts += fp8_pair(seed, p + "attn.wq_a.weight", 40, DIM, block)
    ts += fp8_pair(seed, p + "attn.wq_b.weight", 200, 40, block, extremes=True)
    ts += fp8_pair(seed, p + "attn.wo_b.weight", DIM, 300, block)
    ts += fp8_pair(seed, p + "ffn.shared_experts.w1.weight", EXPERT_FF, DIM, block)
    ts.append(bf16_tensor(seed, p + "attn.compressor.wkv.weight", [16, DIM]))
    ts.append(f16_tensor(seed, p + "attn.indexer.weights_proj.weight", [4, DIM]))
    ts.append(f32_tensor(seed, p + "attn.attn_sink", [4]))
    ts.append(bf16_tensor(seed, p + "attn_norm.weight", [DIM]))
    ts.append(f32_tensor(seed, p + "hc_attn_fn", [24, 4 * DIM]))
    ts.append(bf16_tensor(seed, p + "ffn.gate.weight", [N_EXPERTS, DIM]))
    ts.append(f32_tensor(seed, p + "ffn.gate.bias", [N_EXPERTS]))
    if li == 0:
        ts.append(i64_tensor(seed, p + "ffn.gate.tid2eid", [VOCAB, 6], N_EXPERTS))
    for x in range(N_EXPERTS):
        e = f"{p}ffn.experts.{x}."
        ts += fp4_pair(seed, e + "w1.weight", EXPERT_FF, DIM, extremes=x == 1)
        ts += fp4_pair(seed, e + "w3.weight", EXPERT_FF, DIM)
        ts += fp4_pair(seed, e + "w2.weight", DIM, EXPERT_FF)
    return ts


def write_shard(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": t.shape,
            "data_offsets": [offset, offset + len(t.data)],
        }
        offset += len(t.data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # safetensors pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in tensors:
            f.write(t.data)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    first = [
        bf16_tensor(a.seed, "embed.weight", [VOCAB, DIM]),
        bf16_tensor(a.seed, "head.weight", [VOCAB, DIM]),
        f32_tensor(a.seed, "norm.weight", [DIM]),
        f32_tensor(a.seed, "hc_head_fn", [4, 4 * DIM]),
        f32_tensor(a.seed, "hc_head_base", [4]),
    ] + layer(a.seed, 0, a.block)
    shards = [first] + [layer(a.seed, li, a.block) for li in range(1, N_LAYERS)]

    weight_map, total = {}, 0
    for k, ts in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(out / fname, ts)
        for t in ts:
            weight_map[t.name] = fname
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    config = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "hidden_size": DIM,
        "vocab_size": VOCAB,
        "num_hidden_layers": N_LAYERS,
        "n_routed_experts": N_EXPERTS,
        "moe_intermediate_size": EXPERT_FF,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [a.block, a.block],
            "expert_dtype": "fp4",
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    manifest, blob = {}, bytearray()
    for t in (t for ts in shards for t in ts):
        n = len(t.expect)
        manifest[t.name] = {"shape": t.logical, "kind": t.kind, "offset": len(blob), "count": n}
        blob += struct.pack(f"<{n}{'I' if t.kind == 'f32' else 'i'}", *t.expect)
    (out / "expected.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (out / "expected.bin").write_bytes(bytes(blob))


if __name__ == "__main__":
    main()
