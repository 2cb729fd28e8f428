#!/usr/bin/env python3
"""A tiny checkpoint in DeepSeek's official safetensors layout, and its exact
values decoded on this side (for tests/convert_checkpoint.rs).

    make_checkpoint.py --out DIR [--block 128] [--seed 1]
    make_checkpoint.py --model v4 --out DIR [--vocab 129280] [--block 128] [--seed 1]
                       [--dspark] [--tame] [--drop NAME ...] [--reshape NAME ...]
                       [--tokenizer FILE] [--tokenizer-vocab N]
    make_checkpoint.py --model v41 --out DIR [the same options; --block 32]
                       [--config KEY JSON ...] [--no-engram-tables]

Without `--model`, writes into DIR:

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

`--model v4` writes instead a complete DeepSeek V4 (Flash) checkpoint at the
tiny test model's shapes (src/testmodel `TestModelSpec::tiny()`: 6 layers,
ratios 0 0 4 16 4 16, 3 hash layers, 8 experts; `--vocab` tokens, the real
vocabulary's 129280 by default) with the release's official names and
storage (GGUF.md sections 9-10, the official inference/model.py): FP8 E4M3
`wq_a`, `wq_b`, `wkv`, `wo_b`, indexer `wq_b` and shared experts; BF16
`embed`, `head`, `wo_a`, router and indexer `weights_proj`; F32 norms, sinks,
hyper-connection tensors, compressors, router bias; packed FP4 routed experts;
an I64 `tid2eid` [vocab, 2] of distinct expert ids per row. It has a
config.json with the official V4 keys (compress_ratios with the MTP layer's
extra slot), three shards and the index, and the MTP block `mtp.0.*` as the
release stores it (a layer's sub-names, window-only with a router bias, plus
FP8 `e_proj`/`h_proj`, F32 `enorm`/`hnorm`/`norm` and `hc_head_*`; in the
last shard); no expected values
(the values are random bytes kept finite: FP8 codes avoid the NaN pattern,
scale bytes lie in 118..133, floats in about +-2^-7..2: a forward on them is
chaotic, any rounding changes every logit). `--tame` draws instead the
values of a well-conditioned model, as the tiny test model's generator does
(src/testmodel: norms 1 + N(0, 0.1^2), matrices N(0, (0.5 / sqrt(fan_in))^2)
in F32/BF16; FP8 codes of magnitude 0.5..1.875 and FP4 codes 0.5..3, random
signs, with the scale byte that gives the same spread), so a converted file's
logits move little when its weights are rounded. Tests break it on
purpose: `--drop NAME` leaves tensor NAME (a weight or a `.scale`) out of
its shard and the index,
`--reshape NAME` writes it with one more row (its scale following).

`--model v41` writes a complete DeepSeek V4.1 (Flash) checkpoint at the
tiny V4.1 test model's shapes (src/testmodel/v41.rs `V41Spec::tiny()`: 8
layers of width 64, ratios 0 0 2 2 1 1 1 1, kv sources 2 and 4, index
sources 2, 4 and 6, 4 experts, Engram at layers 1 and 4 with 2 heads of 32
over n-grams up to 3 and primes from 100: tables of 420 and 508 rows) as
the release stores it (official inference/model.py names, docs/V41.md):
`config.json` with the text fields under `text_config` (`model_type
deepseek_v41`, compress_ratios with the 3 MTP slots) and the
`quantization_config` (32 x 32 blocks, `--block` to change); FP8 E4M3
`wq_a`, `wq_b`, `wkv`, `wo_b`, indexer `wq_b`, shared experts and the Engram
`wkv`; BF16 `embed`, `head`, `wo_a`, norms, router, indexer `wk` and
`weights_proj`, the Engram `q_weight` / `k_weight`, the ratio-1
compressor's `wkv`; F32 sinks, hyper-connection tensors, router biases
(`bias` and the image-span `bias_vl`) and the ratio-2 compressor's `wkv` and
`wgate`; packed FP4 routed experts; each Engram table as E4M3
`engram.embed.weight` [rows, 32] with an E8M0 `engram.embed.scale`
[rows, 1]. Shards: the layers over two, each Engram layer's module in one of
its own at the end (as the release's last two shards).
`engram_compressed_vocab_size` is what the tokenizer gives, and
`engram_tables.json` (the token map and the multipliers, by
tools/checkpoint/engram_tables.py, which needs `tokenizers` and numpy) is
written beside it unless `--no-engram-tables`. `--config KEY JSON` sets a
`text_config` field (after the tokenizer, before the tensors: a shape
change changes the tensors). `--tame`, `--drop` and `--reshape` as for v4.

`--model v4` also writes the tokenizer the release ships next to the weights
(docs/TOOLS.md, "The tokenizer"): `tokenizer.json` and `tokenizer_config.json`.
`tokenizer.json` is `--tokenizer` (default: the committed official V4
tokenizer, tests/data/deepseek-v4-tokenizer.json, 129280 ids: the vocabulary
every ds4 test model carries) cut to `--tokenizer-vocab` ids (default
`--vocab`). At its own size or larger it is written unchanged (a
`--vocab` above it leaves ids the converter pads). Smaller, it is the
official one cut to a consistent smaller BPE tokenizer: the model.vocab
entries below N - 10 (ids 0-2 the begin/end/pad markers, 3-258 the 256
byte symbols, then the first merged tokens), the merges whose two symbols
and result all remain, in rank order, the added tokens 0-2, and ten chat
markers (`<｜User｜>`, `<｜Assistant｜>`, `<think>`, `</think>`, `｜DSML｜`,
`<dsml:`, `</dsml:`, `<|EOT|>`, `<｜end_of_query｜>`, `<｜fim▁hole｜>`: ds4's
seven plus one of each token-type case) renumbered to ids N - 10 .. N - 1,
their flags kept; every other key (pre-tokenizer, decoder) is the official
one's, so any BPE tokenizer (HF `tokenizers`, ds4) reads it. N must be at
least 269. `tokenizer_config.json` is shaped like the release's: `bos_token`
as an AddedToken object, `eos_token` and `pad_token` as strings, no
automatic BOS/EOS, and a short stand-in `chat_template` (not DeepSeek's).

`--model v4 --dspark` writes in place of the MTP block DeepSeek's DSpark
drafter as the release that ships it stores it (DeepSeek-V4-Flash-DSpark;
official inference/model.py `DSparkBlock`, under `mtp.{k}.`), at the shape
of the tiny model's drafter (src/testmodel/dspark.rs
`DsparkSpec::for_model`: 2 stages, blocks of 4, noise token 5, taps
[0, 3, 5], Markov rank 8, 4 experts top-2): each stage a window-only block
with a router bias and the drafter's experts; FP8 `main_proj` and F32
`main_norm` in stage 0; F32 `hc_head_*` and `norm`, BF16
`markov_head.markov_w1` / `_w2` [vocab, rank] and `confidence_head.proj`
[1, D + rank] in the last; config.json gains the `dspark_*` keys and one
window-only `compress_ratios` slot per stage (num_nextn_predict_layers
stays 1, as in the release). `--model v41 --dspark` adds V4.1's drafter
the same way (`DsparkSpec::for_v41`: taps [0, 1, 2, 7], 3 experts top-1;
each stage layer 0's V4.1 tensors, both router biases; no `hc_head_*`;
the keys in `text_config`, num_nextn_predict_layers the stage count).

Python standard library only (`--model v41`'s `engram_tables.json`: HF
`tokenizers` and numpy); the same seed gives the same bytes.
"""

import argparse
import json
import math
import random
import struct
from pathlib import Path

import engram_tables

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


# ------------------------------------------------------------------ --model v4

# TestModelSpec::tiny() (src/testmodel/mod.rs) in the official config.json keys.
TINY_V4 = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "hidden_size": 256,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 80,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 64,
    "o_lora_rank": 32,
    "o_groups": 2,
    "sliding_window": 32,
    # One more slot for the MTP layer, as the release lists.
    "compress_ratios": [0, 0, 4, 16, 4, 16, 0],
    "compress_rope_theta": 160000,
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 256,
    "num_hash_layers": 3,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    "max_position_embeddings": 1048576,
    "swiglu_limit": 10.0,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
}

# Byte maps that keep random bytes finite: E4M3 codes without the NaN pattern,
# E8M0 scales in 118..133, and float bytes whose top byte puts the exponent
# near 1 (every byte of a BF16/F32 value goes through it; any low bytes are fine).
FP8_MAP = bytes(b ^ 1 if b & 0x7F == 0x7F else b for b in range(256))
SCALE_MAP = bytes(118 + b % 16 for b in range(256))
FLOAT_MAP = bytes((0x3C | (b & 3)) | (b & 0x80) for b in range(256))


def rand(seed, name, n):
    return rng_for(seed, name).randbytes(n)


# --tame: E4M3 codes with exponent field 6 or 7 (|v| in 0.5..1.875), E2M1
# codes 1..5 (|v| in 0.5..3), random signs and mantissas; their RMS values.
TAME_FP8_MAP = bytes((b & 0x87) | ((6 + ((b >> 3) & 1)) << 3) for b in range(256))
TAME_FP8_RMS = 1.2


def tame_nibble(n):
    return (n & 8) | (1 + (n & 7) % 5)


TAME_FP4_MAP = bytes(tame_nibble(b & 15) | tame_nibble(b >> 4) << 4 for b in range(256))
TAME_FP4_RMS = 1.82
TAME_GAIN = 0.5


def tame_values(seed, name, shape):
    """--tame: the values of a float tensor, drawn as src/testmodel draws the
    tiny model's (norm weights near 1, HC scales in 0.5..1.5, matrices of
    fan-in `shape[-1]` with std 0.5 / sqrt(fan_in))."""
    r, n = rng_for(seed, name), math.prod(shape)
    if name.endswith("norm.weight") or name.endswith("q_weight") or name.endswith("k_weight"):
        return [1.0 + r.gauss(0.0, 0.1) for _ in range(n)]
    if "hc_" in name and name.endswith("scale"):
        return [r.uniform(0.5, 1.5) for _ in range(n)]
    std = 1.0
    if name.endswith("_base") or name.endswith("ape"):
        std = 0.5
    elif name.endswith("gate.bias") or name.endswith("gate.bias_vl"):
        std = 0.1
    elif len(shape) == 2 and name != "embed.weight":
        std = TAME_GAIN / math.sqrt(shape[-1])
    return [r.gauss(0.0, std) for _ in range(n)]


def tame_scale(seed, sname, n, fan_in, rms):
    """--tame: scale bytes giving codes of RMS `rms` the std 0.5 / sqrt(fan_in)
    (one lower at random, so the scales vary)."""
    e0 = 127 + round(math.log2(TAME_GAIN / math.sqrt(fan_in) / rms))
    return bytes(e0 - (b & 1) for b in rand(seed, sname, n))


def hc_and_attention(c, p, norm):
    """A block's hyper-connection mixes, norms (of storage `norm`), sinks and
    attention projections, as V4 and V4.1 store them."""
    d, hc, hd = c["hidden_size"], c["hc_mult"], c["head_dim"]
    nh, ql, og, ol = c["num_attention_heads"], c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    mix = (2 + hc) * hc
    out = []
    for sub in ("attn", "ffn"):
        out += [(f"{p}hc_{sub}_fn", "f32", [mix, hc * d]),
                (f"{p}hc_{sub}_scale", "f32", [3]),
                (f"{p}hc_{sub}_base", "f32", [mix])]
    return out + [(f"{p}attn_norm.weight", norm, [d]),
                  (f"{p}ffn_norm.weight", norm, [d]),
                  (f"{p}attn.attn_sink", "f32", [nh]),
                  (f"{p}attn.wq_a.weight", "fp8", [ql, d]),
                  (f"{p}attn.q_norm.weight", norm, [ql]),
                  (f"{p}attn.wq_b.weight", "fp8", [nh * hd, ql]),
                  (f"{p}attn.wkv.weight", "fp8", [hd, d]),
                  (f"{p}attn.kv_norm.weight", norm, [hd]),
                  (f"{p}attn.wo_a.weight", "bf16", [og * ol, nh // og * hd]),
                  (f"{p}attn.wo_b.weight", "fp8", [d, og * ol])]


def experts(c, p):
    """A block's routed experts (packed FP4) and shared expert (FP8)."""
    d, ff = c["hidden_size"], c["moe_intermediate_size"]
    out = []
    for x in range(c["n_routed_experts"]):
        out += [(f"{p}ffn.experts.{x}.w1.weight", "fp4", [ff, d]),
                (f"{p}ffn.experts.{x}.w3.weight", "fp4", [ff, d]),
                (f"{p}ffn.experts.{x}.w2.weight", "fp4", [d, ff])]
    return out + [(f"{p}ffn.shared_experts.w1.weight", "fp8", [ff, d]),
                  (f"{p}ffn.shared_experts.w3.weight", "fp8", [ff, d]),
                  (f"{p}ffn.shared_experts.w2.weight", "fp8", [d, ff])]


def v4_storage(c):
    """(name, storage, logical shape [out, in] or [n]) of every tensor of the
    checkpoint, in file order; storage: fp8, fp4, bf16, f32, i64."""
    d, hc, hd = c["hidden_size"], c["hc_mult"], c["head_dim"]
    ql, ih, ihd = c["q_lora_rank"], c["index_n_heads"], c["index_head_dim"]
    ne, v, k = c["n_routed_experts"], c["vocab_size"], c["num_experts_per_tok"]

    def block(p, ratio, hash_routed):
        out = hc_and_attention(c, p, "f32")
        if ratio:
            csa = ratio == 4
            comps = [("attn.compressor.", hd)]
            if csa:
                comps.append(("attn.indexer.compressor.", ihd))
                out += [(f"{p}attn.indexer.wq_b.weight", "fp8", [ih * ihd, ql]),
                        (f"{p}attn.indexer.weights_proj.weight", "bf16", [ih, d])]
            for cp, w in comps:
                w2 = 2 * w if csa else w
                out += [(f"{p}{cp}ape", "f32", [ratio, w2]),
                        (f"{p}{cp}wkv.weight", "f32", [w2, d]),
                        (f"{p}{cp}wgate.weight", "f32", [w2, d]),
                        (f"{p}{cp}norm.weight", "f32", [w])]
        out.append((f"{p}ffn.gate.weight", "bf16", [ne, d]))
        if hash_routed:
            out.append((f"{p}ffn.gate.tid2eid", "i64", [v, k]))
        else:
            out.append((f"{p}ffn.gate.bias", "f32", [ne]))
        return out + experts(c, p)

    out = [("embed.weight", "bf16", [v, d])]
    n = c["num_hidden_layers"]
    for li in range(n):
        out += block(f"layers.{li}.", c["compress_ratios"][li], li < c["num_hash_layers"])
    out += [("hc_head_fn", "f32", [hc, hc * d]),
            ("hc_head_scale", "f32", [1]),
            ("hc_head_base", "f32", [hc]),
            ("norm.weight", "f32", [d]),
            ("head.weight", "bf16", [v, d])]
    # The MTP block (official model.py's MTPBlock: a Block of layer id n,
    # ratio compress_ratios[n] = 0, router bias, plus its input projections,
    # norms and hyper-connection head).
    p = "mtp.0."
    out += [(f"{p}hc_head_fn", "f32", [hc, hc * d]),
            (f"{p}hc_head_scale", "f32", [1]),
            (f"{p}hc_head_base", "f32", [hc]),
            (f"{p}e_proj.weight", "fp8", [d, d]),
            (f"{p}h_proj.weight", "fp8", [d, d]),
            (f"{p}enorm.weight", "f32", [d]),
            (f"{p}hnorm.weight", "f32", [d]),
            (f"{p}norm.weight", "f32", [d])]
    out += block(p, c["compress_ratios"][n], False)
    return out


def v4_encode(seed, name, storage, shape, block, experts, tame=False):
    """-> [Tensor] (the weight, and its scale for fp8 / fp4); no expected values."""
    n = math.prod(shape)
    if tame and storage in ("f32", "bf16"):
        data = struct.pack(f"<{n}f", *tame_values(seed, name, shape))
        if storage == "f32":
            return [Tensor(name, "F32", shape, data, None)]
        # BF16: the top half of each f32 (truncated).
        bf = bytearray(2 * n)
        bf[0::2], bf[1::2] = data[2::4], data[3::4]
        return [Tensor(name, "BF16", shape, bytes(bf), None)]
    if storage == "f32":
        return [Tensor(name, "F32", shape, rand(seed, name, 4 * n).translate(FLOAT_MAP), None)]
    if storage == "bf16":
        return [Tensor(name, "BF16", shape, rand(seed, name, 2 * n).translate(FLOAT_MAP), None)]
    if storage == "i64":
        r, (rows, k) = rng_for(seed, name), shape
        ids = []
        for _ in range(rows):
            first = r.randrange(experts)
            ids += [(first + j) % experts for j in range(k)]
        return [Tensor(name, "I64", shape, struct.pack(f"<{n}q", *ids), None)]
    out, inp = shape
    sname = name[: -len(".weight")] + ".scale"
    if storage == "fp8":
        sshape = [-(-out // block), -(-inp // block)]
        codes = rand(seed, name, n).translate(TAME_FP8_MAP if tame else FP8_MAP)
        w = Tensor(name, "F8_E4M3", shape, codes, None)
        rms = TAME_FP8_RMS
    else:
        sshape = [out, inp // 32]
        codes = rand(seed, name, n // 2)
        if tame:
            codes = codes.translate(TAME_FP4_MAP)
        w = Tensor(name, "I8", [out, inp // 2], codes, None)
        rms = TAME_FP4_RMS
    if tame:
        scales = tame_scale(seed, sname, math.prod(sshape), inp, rms)
    else:
        scales = rand(seed, sname, math.prod(sshape)).translate(SCALE_MAP)
    return [w, Tensor(sname, "F8_E8M0", sshape, scales, None)]


def write_v4(a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    c = dict(TINY_V4, vocab_size=a.vocab)
    if a.dspark:
        c = dspark_config(c)
    c["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [a.block, a.block],
    }
    c["expert_dtype"] = "fp4"
    tensors = []
    for name, storage, shape in dspark_storage(c) if a.dspark else v4_storage(c):
        if name in a.reshape:
            shape = [shape[0] + 1] + shape[1:]
        ts = v4_encode(a.seed, name, storage, shape, a.block, c["n_routed_experts"], a.tame)
        tensors += [t for t in ts if t.name not in a.drop]
    # Three shards: the embedding and layers 0-1, layers 2-3, the rest.
    def shard_of(name):
        if name.startswith("layers."):
            return min(int(name.split(".")[1]) // 2, 2)
        return 0 if name.startswith("embed") else 2
    write_sharded(out, [[t for t in tensors if shard_of(t.name) == k] for k in range(3)])
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    write_tokenizer(out, Path(a.tokenizer), a.vocab if a.tokenizer_vocab is None else a.tokenizer_vocab)


# ------------------------------------------------------------------ --model v41

# V41Spec::tiny() (src/testmodel/v41.rs) in the release's config.json layout:
# the text fields nested under `text_config`, the MTP slots of compress_ratios.
TINY_V41_TEXT = {
    "model_type": "deepseek_v41_text",
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "qk_rope_head_dim": 8,
    "q_lora_rank": 32,
    "o_lora_rank": 16,
    "o_groups": 2,
    "sliding_window": 4,
    "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0],
    "kv_source_layer_ids": [2, 4],
    "index_source_layer_ids": [2, 4, 6],
    "candidate_source_layer_id": 4,
    "candidate_topk_blocks": 2,
    "candidate_block_size": 2,
    "compress_rope_theta": 160000,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 3,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-20,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 1048576,
    "swiglu_limit": 10.0,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "num_nextn_predict_layers": 3,
    "engram_layer_ids": [1, 4],
    "engram_num_embeddings": [420, 508],
    "engram_max_ngram_size": 3,
    "engram_n_heads": 2,
    "engram_head_dim": 32,
    "engram_vocab_size": 100,
    "engram_pad_token_id": 2,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def v41_storage(c):
    """(name, storage, logical shape) of every tensor of a V4.1 checkpoint
    (official inference/model.py names), in file order; storage as
    v4_storage's, plus `engram` (the table: E4M3 rows [rows, head_dim] with
    an E8M0 `.scale` [rows, head_dim / 32])."""
    d, hc, hd = c["hidden_size"], c["hc_mult"], c["head_dim"]
    ql, ih, ihd = c["q_lora_rank"], c["index_n_heads"], c["index_head_dim"]
    ne, v = c["n_routed_experts"], c["vocab_size"]
    ehd, heads = c["engram_head_dim"], c["engram_n_heads"]
    cols = (c["engram_max_ngram_size"] - 1) * heads
    out = [("embed.weight", "bf16", [v, d])]
    for li in range(c["num_hidden_layers"]):
        p, ratio = f"layers.{li}.", c["compress_ratios"][li]
        out += hc_and_attention(c, p, "bf16")
        if li in c["kv_source_layer_ids"]:
            # Ratio 1: a plain bf16 projection; above, fp32 with the fp32 gate.
            out.append((f"{p}attn.compressor.wkv.weight", "f32" if ratio > 1 else "bf16", [hd, d]))
            if ratio > 1:
                out.append((f"{p}attn.compressor.wgate.weight", "f32", [hd, d]))
            out += [(f"{p}attn.compressor.norm.weight", "bf16", [hd]),
                    (f"{p}attn.indexer.wk.weight", "bf16", [ihd, hd]),
                    (f"{p}attn.indexer.k_norm.weight", "bf16", [ihd])]
        if li in c["index_source_layer_ids"]:
            out += [(f"{p}attn.indexer.wq_b.weight", "fp8", [ih * ihd, ql]),
                    (f"{p}attn.indexer.weights_proj.weight", "bf16", [ih, d])]
        out += [(f"{p}ffn.gate.weight", "bf16", [ne, d]),
                (f"{p}ffn.gate.bias", "f32", [ne]),
                (f"{p}ffn.gate.bias_vl", "f32", [ne])]
        out += experts(c, p)
        if li in c["engram_layer_ids"]:
            rows = c["engram_num_embeddings"][c["engram_layer_ids"].index(li)]
            out += [(f"{p}engram.embed.weight", "engram", [rows, ehd]),
                    (f"{p}engram.wkv.weight", "fp8", [d * (hc + 1), cols * ehd]),
                    (f"{p}engram.q_weight", "bf16", [hc, d]),
                    (f"{p}engram.k_weight", "bf16", [hc, d])]
    out += [("norm.weight", "bf16", [d]), ("head.weight", "bf16", [v, d])]
    return out


def engram_table(seed, name, shape, tame):
    """An Engram table: E4M3 codes [rows, head_dim] and E8M0 scales
    [rows, head_dim / 32] (one per 32 values of a row)."""
    rows, width = shape
    codes = rand(seed, name, rows * width).translate(TAME_FP8_MAP if tame else FP8_MAP)
    sname = name[: -len(".weight")] + ".scale"
    sshape = [rows, width // 32]
    if tame:
        # Values of RMS about 0.5, as the generator's Engram rows.
        e0 = 127 + round(math.log2(0.5 / TAME_FP8_RMS))
        scales = bytes(e0 - (b & 1) for b in rand(seed, sname, rows * width // 32))
    else:
        scales = rand(seed, sname, rows * width // 32).translate(SCALE_MAP)
    return [Tensor(name, "F8_E4M3", shape, codes, None),
            Tensor(sname, "F8_E8M0", sshape, scales, None)]


def write_v41(a):
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    text = dict(TINY_V41_TEXT, vocab_size=a.vocab)
    c = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "text_config": text,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [a.block, a.block],
            "expert_dtype": "fp4",
        },
    }
    write_tokenizer(out, Path(a.tokenizer), a.vocab if a.tokenizer_vocab is None else a.tokenizer_vocab)
    # The compressed vocabulary is what the tokenizer gives (the official
    # code asserts the two agree).
    _, text["engram_compressed_vocab_size"] = engram_tables.token_map(out / "tokenizer.json")
    if a.dspark:
        text.update(v41_dspark_config(text))
    for k, v in a.config:
        text[k] = json.loads(v)
    tensors = []
    for name, storage, shape in v41_dspark_storage(text) if a.dspark else v41_storage(text):
        if name in a.reshape:
            shape = [shape[0] + 1] + shape[1:]
        if storage == "engram":
            ts = engram_table(a.seed, name, shape, a.tame)
        else:
            ts = v4_encode(a.seed, name, storage, shape, a.block, text["n_routed_experts"], a.tame)
        tensors += [t for t in ts if t.name not in a.drop]
    # As the release: the layers over the first shards, each Engram layer's
    # module (its table with it) in a shard of its own at the end.
    engram = [f"layers.{li}.engram." for li in text["engram_layer_ids"]]
    def shard_of(name):
        for k, p in enumerate(engram):
            if name.startswith(p):
                return 2 + k
        if name.startswith("layers."):
            return int(name.split(".")[1]) * 2 // text["num_hidden_layers"]
        return 0 if name.startswith("embed") else 1
    write_sharded(out, [[t for t in tensors if shard_of(t.name) == k]
                        for k in range(2 + len(engram))])
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    if not a.no_engram_tables:
        tables = engram_tables.tables(out)
        (out / engram_tables.TABLES_FILE).write_text(json.dumps(tables) + "\n")


# ------------------------------------------------------------------ --model v4 --dspark

# DsparkSpec::for_model(TestModelSpec::tiny()) (src/testmodel/dspark.rs) in the
# keys of DeepSeek-V4-Flash-DSpark's config.json (official inference/model.py,
# ModelArgs.dspark_*; the drafter's own experts as get_moe_config reads them).
TINY_V4_DSPARK = {
    "dspark_block_size": 4,
    "dspark_noise_token_id": 5,
    "dspark_target_layer_ids": [0, 3, 5],
    "dspark_markov_rank": 8,
    "dspark_n_routed_experts": 4,
    "dspark_n_activated_experts": 2,
}
DSPARK_STAGES = 2


def dspark_config(c):
    """--dspark: `c` with the drafter's keys and one window-only
    compress_ratios slot per stage after the layers (the release keeps
    num_nextn_predict_layers 1 beside its three stages; so does this)."""
    ratios = c["compress_ratios"][: c["num_hidden_layers"]] + [0] * DSPARK_STAGES
    return dict(c, **TINY_V4_DSPARK, compress_ratios=ratios)


def dspark_storage(c):
    """--dspark: v4_storage(c) with the MTP block replaced by the DSpark
    stages, as the release stores them (official DSparkBlock, under
    `mtp.{k}.`): each a window-only block with a router bias and the
    drafter's experts; stage 0 adds FP8 `main_proj` [D, D * taps] and
    `main_norm`; the last stage `hc_head_*`, `norm`, BF16
    `markov_head.markov_w1` / `_w2` [vocab, rank] and `confidence_head.proj`
    [1, D + rank]."""
    d, hc, v = c["hidden_size"], c["hc_mult"], c["vocab_size"]
    r, taps = c["dspark_markov_rank"], len(c["dspark_target_layer_ids"])
    out = [t for t in v4_storage(c) if not t[0].startswith("mtp.")]
    # A stage's block: v4_storage's MTP block at the drafter's expert count,
    # without the MTP block's own projections, norms and head.
    mtp_only = {"hc_head_fn", "hc_head_scale", "hc_head_base", "e_proj.weight",
                "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight"}
    drafter = dict(c, n_routed_experts=c["dspark_n_routed_experts"])
    block = [(name[len("mtp.0."):], st, shape) for name, st, shape in v4_storage(drafter)
             if name.startswith("mtp.0.") and name[len("mtp.0."):] not in mtp_only]
    for k in range(DSPARK_STAGES):
        p = f"mtp.{k}."
        out += [(p + name, st, shape) for name, st, shape in block]
        if k == 0:
            out += [(f"{p}main_proj.weight", "fp8", [d, d * taps]),
                    (f"{p}main_norm.weight", "f32", [d])]
        if k == DSPARK_STAGES - 1:
            out += [(f"{p}hc_head_fn", "f32", [hc, hc * d]),
                    (f"{p}hc_head_scale", "f32", [1]),
                    (f"{p}hc_head_base", "f32", [hc]),
                    (f"{p}norm.weight", "f32", [d]),
                    (f"{p}markov_head.markov_w1.weight", "bf16", [v, r]),
                    (f"{p}markov_head.markov_w2.weight", "bf16", [v, r]),
                    (f"{p}confidence_head.proj.weight", "bf16", [1, d + r])]
    return out


# DsparkSpec::for_v41(V41Spec::tiny()) (src/testmodel/dspark.rs) in the
# `text_config` keys: taps of the embedding, the Engram layer 1, layer 2 and
# the last; its own 3 experts, top-1.
TINY_V41_DSPARK = {
    "dspark_block_size": 4,
    "dspark_noise_token_id": 5,
    "dspark_target_layer_ids": [0, 1, 2, 7],
    "dspark_markov_rank": 8,
    "dspark_n_routed_experts": 3,
    "dspark_n_activated_experts": 1,
}


def v41_dspark_config(text):
    """--model v41 --dspark: the `text_config` keys to change (the drafter's
    keys, and one window-only compress_ratios slot per stage after the
    layers)."""
    ratios = text["compress_ratios"][: text["num_hidden_layers"]] + [0] * DSPARK_STAGES
    return dict(TINY_V41_DSPARK, compress_ratios=ratios, num_nextn_predict_layers=DSPARK_STAGES)


def v41_dspark_storage(text):
    """--model v41 --dspark: v41_storage(text) and the drafter's stages under
    `mtp.{k}.` (official DSparkBlock on V4.1's Block): each a window-only V4.1
    block (layer 0's tensors: both router biases, the shared expert) with the
    drafter's experts; FP8 `main_proj` and BF16 `main_norm` in stage 0; BF16
    `norm`, `markov_head.markov_w1` / `_w2` and `confidence_head.proj` in
    the last (V4.1 has no hc_head)."""
    d, v = text["hidden_size"], text["vocab_size"]
    r, taps = text["dspark_markov_rank"], len(text["dspark_target_layer_ids"])
    out = v41_storage(text)
    drafter = dict(text, n_routed_experts=text["dspark_n_routed_experts"])
    assert 0 not in drafter["kv_source_layer_ids"] + drafter["index_source_layer_ids"]
    assert 0 not in drafter["engram_layer_ids"] and drafter["compress_ratios"][0] == 0
    block = [(name[len("layers.0."):], st, shape) for name, st, shape in v41_storage(drafter)
             if name.startswith("layers.0.")]
    for k in range(DSPARK_STAGES):
        p = f"mtp.{k}."
        out += [(p + name, st, shape) for name, st, shape in block]
        if k == 0:
            out += [(f"{p}main_proj.weight", "fp8", [d, d * taps]),
                    (f"{p}main_norm.weight", "bf16", [d])]
        if k == DSPARK_STAGES - 1:
            out += [(f"{p}norm.weight", "bf16", [d]),
                    (f"{p}markov_head.markov_w1.weight", "bf16", [v, r]),
                    (f"{p}markov_head.markov_w2.weight", "bf16", [v, r]),
                    (f"{p}confidence_head.proj.weight", "bf16", [1, d + r])]
    return out


# ------------------------------------------------------------------ tokenizer

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[2] / "tests/data/deepseek-v4-tokenizer.json"
BOS, EOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
# The markers a cut tokenizer keeps (ds4's seven, then one control token by
# bars only, one by ASCII bars, one flagged special, one more user-defined).
KEPT_MARKERS = ["<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<think>", "</think>",
                "\uff5cDSML\uff5c", "<\uff5cfim\u2581hole\uff5c>", "<|EOT|>",
                "<\uff5cend_of_query\uff5c>", "<dsml:", "</dsml:"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
                 "<\uff5cUser\uff5c>{{ m['content'] }}{% else %}<\uff5cAssistant\uff5c>"
                 "{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<\uff5cAssistant\uff5c></think>{% endif %}")


def cut_tokenizer(j, n):
    """The tokenizer.json `j` cut to `n` ids (see the docstring)."""
    top = n - len(KEPT_MARKERS)
    if top < 259:
        raise SystemExit(f"--tokenizer-vocab {n}: at least {259 + len(KEPT_MARKERS)} needed")
    vocab = {t: i for t, i in j["model"]["vocab"].items() if i < top}
    merges = []
    for m in j["model"]["merges"]:
        left, right = m.split(" ") if isinstance(m, str) else m
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(m)
    by_content = {a["content"]: a for a in j["added_tokens"]}
    added = [a for a in j["added_tokens"] if a["id"] < top]
    for k, content in enumerate(KEPT_MARKERS):
        added.append(dict(by_content[content], id=top + k))
    out = dict(j, added_tokens=added)
    out["model"] = dict(j["model"], vocab=vocab, merges=merges)
    return out


def write_tokenizer(out, src, n):
    raw = src.read_bytes()
    j = json.loads(raw)
    size = 1 + max(list(j["model"]["vocab"].values()) + [a["id"] for a in j["added_tokens"]])
    if n >= size:
        (out / "tokenizer.json").write_bytes(raw)
    else:
        (out / "tokenizer.json").write_text(json.dumps(cut_tokenizer(j, n), ensure_ascii=False))
    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": BOS, "lstrip": False,
                      "normalized": False, "rstrip": False, "single_word": False},
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "legacy": True,
        "model_max_length": 1048576,
        "pad_token": EOS,
        "tokenizer_class": "LlamaTokenizerFast",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def write_sharded(out, shards):
    """Writes `shards` (lists of tensors) as the release names its shard
    files, and the index that maps every tensor to its shard."""
    weight_map, total = {}, 0
    for k, ts in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(out / fname, ts)
        for t in ts:
            weight_map[t.name] = fname
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--block", type=int, help="FP8 block (default 128; 32 with --model v41)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", choices=["v4", "v41"], help="a complete checkpoint of the tiny model")
    ap.add_argument("--vocab", type=int, default=129280, help="--model v4: vocabulary size")
    ap.add_argument("--dspark", action="store_true",
                    help="--model v4 / v41: the DSpark drafter under mtp.* (v4: instead of the MTP block)")
    ap.add_argument("--tame", action="store_true",
                    help="--model v4: the values of a well-conditioned model (see above)")
    ap.add_argument("--drop", action="append", default=[], help="--model v4: leave tensor out")
    ap.add_argument("--reshape", action="append", default=[],
                    help="--model v4: write tensor with one more row")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER),
                    help="--model v4: the tokenizer.json to write (default: the official V4 one)")
    ap.add_argument("--tokenizer-vocab", type=int,
                    help="--model v4: cut tokenizer.json to this many ids (default --vocab)")
    ap.add_argument("--config", nargs=2, action="append", default=[], metavar=("KEY", "JSON"),
                    help="--model v41: set text_config KEY to the JSON value")
    ap.add_argument("--no-engram-tables", action="store_true",
                    help="--model v41: do not write engram_tables.json")
    a = ap.parse_args()
    a.block = a.block or (32 if a.model == "v41" else 128)
    if a.model == "v4":
        write_v4(a)
        return
    if a.model == "v41":
        write_v41(a)
        return
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
    write_sharded(out, shards)

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
