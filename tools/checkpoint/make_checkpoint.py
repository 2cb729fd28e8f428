#!/usr/bin/env python3
"""Tiny DeepSeek checkpoints in the official safetensors format, and the
outside checks of ds4-quantize's output (docs/TOOLS.md).

    make_checkpoint.py write --family v4 --out DIR [--shards 3]
    make_checkpoint.py check --ckpt DIR --gguf OUT.gguf      # every tensor vs the checkpoint
    make_checkpoint.py refgguf --ckpt DIR --like OUT.gguf --out REF.gguf

`write` lays out what DeepSeek publishes, at the tiny test model's shapes
(src/testmodel: `TestModelSpec::tiny`): config.json (HF field names),
tokenizer.json (the V4 tokenizer, copied), `model-0000i-of-0000n.safetensors`
shards and `model.safetensors.index.json`. Storage follows the release:
FP8 E4M3 attention projections and shared experts with one E8M0 scale per
128 x 128 block, FP4 E2M1 routed experts (two codes a byte, low nibble
first) with one E8M0 scale per 32 along a row, BF16 embedding / head /
router / compressors / indexer, F32 norms, hyper-connection tensors, sinks,
biases and compressor position biases, I64 hash-routing table.

Values are seeded per tensor name (numpy PCG64 raw words, Box-Muller), so a
checkpoint is the same on every run of the same numpy.

`check` reads the GGUF with gguf-py (an outside reader) and compares every
tensor with this script's own decoding of the checkpoint (GGUF.md sections
9 and 10, written here independently of the Rust converter): types that
hold the source exactly (F32, BF16, MXFP4, I32) must equal it bit for bit
in value, Q8_0 must equal gguf-py's own Q8_0 quantization byte for byte,
and the lossy K/IQ types are reported with their relative RMSE.

`refgguf` writes the original weights as an F32 GGUF with gguf-py (metadata
copied from --like), the file ds4's logits on a converted file are compared
with.

Needs numpy and gguf (gguf==0.19.0).
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "data" / "deepseek-v4-tokenizer.json"

# ---------------------------------------------------------------------------------------
# small floats

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def e4m3_table():
    """Value of every E4M3FN byte (NaN for 0x7f / 0xff)."""
    out = np.empty(256, np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = math.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        out[b] = -v if s else v
    return out


E4M3 = e4m3_table()


def e8m0(b):
    return np.ldexp(1.0, b.astype(np.int64) - 127)


def nearest_codes(v, table):
    """Code of the nearest finite table value for each entry of v."""
    finite = np.where(np.isnan(table), np.inf, table)
    order = np.argsort(finite, kind="stable")
    vals = finite[order]
    keep = np.isfinite(vals)
    order, vals = order[keep], vals[keep]
    i = np.clip(np.searchsorted(vals, v), 1, len(vals) - 1)
    left, right = vals[i - 1], vals[i]
    pick = np.where(np.abs(v - left) <= np.abs(right - v), i - 1, i)
    return order[pick].astype(np.uint8)


# ---------------------------------------------------------------------------------------
# deterministic values


def rng_for(name, seed):
    return np.random.Generator(np.random.PCG64(seed ^ zlib.crc32(name.encode())))


def normal(name, n, std, seed):
    g = rng_for(name, seed)
    m = (n + 1) // 2
    raw = g.bit_generator.random_raw(2 * m)
    u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0 ** 53
    r = np.sqrt(-2.0 * np.log(u[:m]))
    t = 2.0 * np.pi * u[m:]
    z = np.concatenate([r * np.cos(t), r * np.sin(t)])[:n]
    return z * std


def uniform(name, n, lo, hi, seed):
    raw = rng_for(name, seed).bit_generator.random_raw(n)
    u = (raw >> np.uint64(11)).astype(np.float64) / 2.0 ** 53
    return lo + (hi - lo) * u


# ---------------------------------------------------------------------------------------
# encoders (checkpoint storage)


def enc_fp8(w, block=128):
    """[out, in] float -> (E4M3 codes, E8M0 scales [ceil(out/b), ceil(in/b)])."""
    o, i = w.shape
    so, si = -(-o // block), -(-i // block)
    codes = np.zeros((o, i), np.uint8)
    scales = np.zeros((so, si), np.uint8)
    for a in range(so):
        for b in range(si):
            blk = w[a * block:(a + 1) * block, b * block:(b + 1) * block]
            amax = max(float(np.abs(blk).max()), 1e-30)
            e = math.ceil(math.log2(amax / 448.0))
            scales[a, b] = e + 127
            codes[a * block:(a + 1) * block, b * block:(b + 1) * block] = nearest_codes(blk / 2.0 ** e, E4M3)
    return codes, scales


def enc_fp4(w):
    """[out, in] float -> (packed codes [out, in/2] (I8), E8M0 scales [out, in/32])."""
    o, i = w.shape
    blocks = w.reshape(o, i // 32, 32)
    amax = np.maximum(np.abs(blocks).max(axis=2), 1e-30)
    e = np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    codes = nearest_codes((blocks / np.ldexp(1.0, e)[..., None]).reshape(-1), E2M1).reshape(o, i)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8)


def bf16_bytes(w):
    u = np.asarray(w, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


# ---------------------------------------------------------------------------------------
# the tiny V4 model (TestModelSpec::tiny)

TINY_V4 = dict(
    hidden_size=256, num_attention_heads=4, head_dim=80, qk_rope_head_dim=16, q_lora_rank=64,
    o_lora_rank=32, o_groups=2, sliding_window=32, num_hidden_layers=6,
    compress_ratios=[0, 0, 4, 16, 4, 16, 0], index_n_heads=16, index_head_dim=32, index_topk=16,
    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=256, n_shared_experts=1,
    num_hash_layers=3, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rope_theta=10000,
    compress_rope_theta=160000, swiglu_limit=10.0, routed_scaling_factor=1.5,
    max_position_embeddings=1048576, rms_norm_eps=1e-6, vocab_size=129280,
    num_nextn_predict_layers=1, scoring_func="sqrtsoftplus", topk_method="noaux_tc",
    norm_topk_prob=True, hidden_act="silu", expert_dtype="fp4",
    rope_scaling=dict(type="yarn", factor=16, original_max_position_embeddings=65536,
                      beta_fast=32, beta_slow=1),
    quantization_config=dict(quant_method="fp8", fmt="e4m3", scale_fmt="ue8m0",
                             activation_scheme="dynamic", weight_block_size=[128, 128]),
    architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", bos_token_id=0,
    eos_token_id=1, tie_word_embeddings=False, torch_dtype="bfloat16",
)


def v4_tensors(c, gain=0.5):
    """(name, kind, shape, init) for every checkpoint tensor; kind is the storage:
    fp8, fp4, bf16, f32, i64. init: ("normal", std) | ("norm",) | ("uniform", lo, hi) | ("ids",)."""
    d, hc, hd = c["hidden_size"], c["hc_mult"], c["head_dim"]
    nh, ql, og, ol = c["num_attention_heads"], c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    ih, ihd = c["index_n_heads"], c["index_head_dim"]
    ne, ff, V = c["n_routed_experts"], c["moe_intermediate_size"], c["vocab_size"]
    mix = (2 + hc) * hc
    n = lambda fan: ("normal", gain / math.sqrt(fan))
    out = [("embed.weight", "bf16", [V, d], ("normal", 1.0))]
    for L in range(c["num_hidden_layers"]):
        p = f"layers.{L}."
        ratio = c["compress_ratios"][L]
        for sub in ("attn", "ffn"):
            out += [(f"{p}hc_{sub}_fn", "f32", [mix, hc * d], n(hc * d)),
                    (f"{p}hc_{sub}_scale", "f32", [3], ("uniform", 0.5, 1.5)),
                    (f"{p}hc_{sub}_base", "f32", [mix], ("normal", 0.5))]
        gi = nh // og * hd
        out += [(f"{p}attn_norm.weight", "f32", [d], ("norm",)),
                (f"{p}ffn_norm.weight", "f32", [d], ("norm",)),
                (f"{p}attn.attn_sink", "f32", [nh], ("normal", 1.0)),
                (f"{p}attn.wq_a.weight", "fp8", [ql, d], n(d)),
                (f"{p}attn.q_norm.weight", "f32", [ql], ("norm",)),
                (f"{p}attn.wq_b.weight", "fp8", [nh * hd, ql], n(ql)),
                (f"{p}attn.wkv.weight", "fp8", [hd, d], n(d)),
                (f"{p}attn.kv_norm.weight", "f32", [hd], ("norm",)),
                (f"{p}attn.wo_a.weight", "fp8", [og * ol, gi], n(gi)),
                (f"{p}attn.wo_b.weight", "fp8", [d, og * ol], n(og * ol))]
        if ratio:
            csa = ratio == 4
            comps = [("attn.compressor.", hd)] + ([("attn.indexer.compressor.", ihd)] if csa else [])
            for cp, w in comps:
                w2 = 2 * w if csa else w
                out += [(f"{p}{cp}ape", "f32", [ratio, w2], ("normal", 0.5)),
                        (f"{p}{cp}wkv.weight", "bf16", [w2, d], n(d)),
                        (f"{p}{cp}wgate.weight", "bf16", [w2, d], n(d)),
                        (f"{p}{cp}norm.weight", "f32", [w], ("norm",))]
            if csa:
                out += [(f"{p}attn.indexer.wq_b.weight", "bf16", [ih * ihd, ql], n(ql)),
                        (f"{p}attn.indexer.weights_proj.weight", "bf16", [ih, d], n(d))]
        out += [(f"{p}ffn.gate.weight", "bf16", [ne, d], n(d))]
        if L < c["num_hash_layers"]:
            out += [(f"{p}ffn.gate.tid2eid", "i64", [V, c["num_experts_per_tok"]], ("ids",))]
        else:
            out += [(f"{p}ffn.gate.bias", "f32", [ne], ("normal", 0.1))]
        for x in range(ne):
            out += [(f"{p}ffn.experts.{x}.w1.weight", "fp4", [ff, d], n(d)),
                    (f"{p}ffn.experts.{x}.w3.weight", "fp4", [ff, d], n(d)),
                    (f"{p}ffn.experts.{x}.w2.weight", "fp4", [d, ff], n(ff))]
        out += [(f"{p}ffn.shared_experts.w1.weight", "fp8", [ff, d], n(d)),
                (f"{p}ffn.shared_experts.w3.weight", "fp8", [ff, d], n(d)),
                (f"{p}ffn.shared_experts.w2.weight", "fp8", [d, ff], n(ff))]
    out += [("hc_head_fn", "f32", [hc, hc * d], n(hc * d)),
            ("hc_head_scale", "f32", [1], ("uniform", 0.5, 1.5)),
            ("hc_head_base", "f32", [hc], ("normal", 0.5)),
            ("norm.weight", "f32", [d], ("norm",)),
            ("head.weight", "bf16", [V, d], n(d))]
    return out


def values(name, shape, init, seed, k=2, e=8):
    size = int(np.prod(shape))
    kind = init[0]
    if kind == "normal":
        return normal(name, size, init[1], seed).reshape(shape)
    if kind == "norm":
        return (1.0 + normal(name, size, 0.1, seed)).reshape(shape)
    if kind == "uniform":
        return uniform(name, size, init[1], init[2], seed).reshape(shape)
    if kind == "ids":
        g = rng_for(name, seed)
        rows = shape[0]
        raw = g.bit_generator.random_raw(rows * 4 * k)
        ids = np.zeros((rows, k), np.int64)
        cand = (raw % np.uint64(e)).astype(np.int64).reshape(rows, 4 * k)
        for r in range(rows):
            seen = []
            for x in cand[r]:
                if x not in seen:
                    seen.append(int(x))
                if len(seen) == k:
                    break
            while len(seen) < k:
                seen.append(next(j for j in range(e) if j not in seen))
            ids[r] = seen
        return ids
    raise ValueError(kind)


def encode(name, kind, shape, init, seed, k, e):
    """-> list of (name, dtype, shape, bytes)."""
    v = values(name, shape, init, seed, k, e)
    if kind == "f32":
        return [(name, "F32", shape, np.asarray(v, "<f4").tobytes())]
    if kind == "bf16":
        return [(name, "BF16", shape, bf16_bytes(v).astype("<u2").tobytes())]
    if kind == "i64":
        return [(name, "I64", shape, np.asarray(v, "<i8").tobytes())]
    sname = name[: -len(".weight")] + ".scale"
    if kind == "fp8":
        codes, scales = enc_fp8(v)
        return [(name, "F8_E4M3", shape, codes.tobytes()),
                (sname, "F8_E8M0", list(scales.shape), scales.tobytes())]
    if kind == "fp4":
        packed, scales = enc_fp4(v)
        return [(name, "I8", [shape[0], shape[1] // 2], packed.tobytes()),
                (sname, "F8_E8M0", list(scales.shape), scales.tobytes())]
    raise ValueError(kind)


def write_shard(path, items):
    header, off = {}, 0
    for name, dtype, shape, data in items:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, data in items:
            f.write(data)


def cmd_write(a):
    if a.family != "v4":
        sys.exit(f"--family {a.family}: only v4 is written so far")
    c = dict(TINY_V4)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    specs = v4_tensors(c)
    items = []
    for name, kind, shape, init in specs:
        items += encode(name, kind, shape, init, a.seed, c["num_experts_per_tok"], c["n_routed_experts"])
    # shards of about equal size, tensors in order; a weight and its scale stay together
    total = sum(len(d) for *_, d in items)
    per = total / a.shards
    shards, cur, size = [], [], 0
    for it in items:
        if cur and size >= per * (len(shards) + 1) and not it[0].endswith(".scale"):
            shards.append(cur)
            cur = []
        cur.append(it)
        size += len(it[3])
    shards.append(cur)
    weight_map = {}
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(out / fname, sh)
        for name, *_ in sh:
            weight_map[name] = fname
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(c, indent=1))
    shutil.copyfile(TOKENIZER, out / "tokenizer.json")
    print(f"wrote {out}: {len(items)} tensors, {len(shards)} shards, {total} bytes")


# ---------------------------------------------------------------------------------------
# reading a checkpoint back (independent of the Rust reader)


class Ckpt:
    def __init__(self, d):
        self.dir = Path(d)
        idx = json.loads((self.dir / "model.safetensors.index.json").read_text())["weight_map"]
        self.where = idx
        self.headers = {}
        for f in set(idx.values()):
            with open(self.dir / f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                self.headers[f] = (8 + n, json.loads(fh.read(n)))
        self.config = json.loads((self.dir / "config.json").read_text())

    def raw(self, name):
        f = self.where[name]
        start, h = self.headers[f]
        t = h[name]
        b, e = t["data_offsets"]
        with open(self.dir / f, "rb") as fh:
            fh.seek(start + b)
            data = fh.read(e - b)
        return t["dtype"], t["shape"], data

    def has(self, name):
        return name in self.where

    def values(self, name):
        """float64 values (int64 for integer tables) in HF shape."""
        dt, shape, data = self.raw(name)
        if dt == "F32":
            return np.frombuffer(data, "<f4").astype(np.float64).reshape(shape)
        if dt == "BF16":
            u = np.frombuffer(data, "<u2").astype(np.uint32) << 16
            return u.view(np.float32).astype(np.float64).reshape(shape)
        if dt == "I64":
            return np.frombuffer(data, "<i8").reshape(shape)
        sname = name[: -len(".weight")] + ".scale"
        sdt, sshape, sdata = self.raw(sname)
        s = e8m0(np.frombuffer(sdata, np.uint8)).reshape(sshape)
        if dt == "F8_E4M3":
            v = E4M3[np.frombuffer(data, np.uint8)].reshape(shape)
            br, bc = -(-shape[0] // sshape[0]), -(-shape[1] // sshape[1])
            full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[: shape[0], : shape[1]]
            return v * full
        if dt == "I8":
            b = np.frombuffer(data, np.uint8).reshape(shape)
            codes = np.empty((shape[0], shape[1] * 2), np.uint8)
            codes[:, 0::2], codes[:, 1::2] = b & 15, b >> 4
            return E2M1[codes] * np.repeat(s, 32, axis=1)
        raise ValueError(f"{name}: dtype {dt}")


def hf_name(g):
    """GGUF name -> HF name (GGUF.md section 9), or ("experts", pattern)."""
    top = {"token_embd.weight": "embed.weight", "output.weight": "head.weight",
           "output_norm.weight": "norm.weight", "output_hc_fn.weight": "hc_head_fn",
           "output_hc_base.weight": "hc_head_base", "output_hc_scale.weight": "hc_head_scale"}
    if g in top:
        return top[g]
    _, L, rest = g.split(".", 2)
    p = f"layers.{L}."
    stem = rest.rsplit(".", 1)[0]
    table = {
        "attn_sinks": "attn.attn_sink", "attn_q_a": "attn.wq_a.weight",
        "attn_q_a_norm": "attn.q_norm.weight", "attn_q_b": "attn.wq_b.weight",
        "attn_kv": "attn.wkv.weight", "attn_kv_a_norm": "attn.kv_norm.weight",
        "attn_output_a": "attn.wo_a.weight", "attn_output_b": "attn.wo_b.weight",
        "attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight",
        "ffn_gate_inp": "ffn.gate.weight", "exp_probs_b": "ffn.gate.bias",
        "ffn_gate_tid2eid": "ffn.gate.tid2eid",
        "ffn_gate_shexp": "ffn.shared_experts.w1.weight",
        "ffn_up_shexp": "ffn.shared_experts.w3.weight",
        "ffn_down_shexp": "ffn.shared_experts.w2.weight",
        "indexer.attn_q_b": "attn.indexer.wq_b.weight",
        "indexer.proj": "attn.indexer.weights_proj.weight",
    }
    for c in ("attn", "indexer"):
        cp = "attn.compressor." if c == "attn" else "attn.indexer.compressor."
        table[f"{c}_compressor_ape"] = cp + "ape"
        for x, y in (("kv", "wkv.weight"), ("gate", "wgate.weight"), ("norm", "norm.weight")):
            table[f"{c}_compressor_{x}"] = cp + y
    for sub in ("attn", "ffn"):
        for x in ("fn", "base", "scale"):
            table[f"hc_{sub}_{x}"] = f"hc_{sub}_{x}"
    exps = {"ffn_gate_exps": "w1", "ffn_up_exps": "w3", "ffn_down_exps": "w2"}
    if stem in exps:
        return ("experts", p + "ffn.experts.{}." + exps[stem] + ".weight")
    return p + table[stem]


def original(ck, g, ne):
    """The original values of GGUF tensor g (shape: reversed ne)."""
    h = hf_name(g)
    if isinstance(h, tuple):
        return np.stack([ck.values(h[1].format(x)) for x in range(ne[2])])
    v = ck.values(h)
    return v.reshape(tuple(reversed(ne)))


def cmd_check(a):
    import gguf
    ck = Ckpt(a.ckpt)
    r = gguf.GGUFReader(a.gguf)
    T = gguf.GGMLQuantizationType
    bad, n, lossy = [], 0, []
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        orig = original(ck, t.name, ne)
        qt = t.tensor_type
        raw = np.asarray(t.data)
        if qt == T.I32:
            got = raw.view(np.int32).reshape(orig.shape)
            ok = np.array_equal(got.astype(np.int64), orig)
        else:
            got = gguf.quants.dequantize(raw, qt).astype(np.float64).reshape(orig.shape)
            if qt in (T.F32, T.BF16, T.MXFP4, T.F16):
                ok = np.array_equal(got, orig)
            elif qt == T.Q8_0:
                want = gguf.quants.quantize(orig.astype(np.float32).reshape(-1, ne[0]), T.Q8_0)
                ok = np.array_equal(np.asarray(raw).reshape(-1), np.asarray(want).reshape(-1))
            else:
                err = np.sqrt(np.mean((got - orig) ** 2)) / max(np.sqrt(np.mean(orig ** 2)), 1e-30)
                lossy.append((t.name, qt.name, err))
                ok = bool(np.isfinite(err)) and err < 1.0
        n += 1
        if not ok:
            bad.append(f"{t.name} ({qt.name})")
    for name, q, e in lossy:
        if a.verbose:
            print(f"  {name:40s} {q:8s} rmse/rms {e:.4f}")
    if lossy:
        worst = max(lossy, key=lambda x: x[2])
        print(f"lossy tensors: {len(lossy)}, worst rmse/rms {worst[2]:.4f} ({worst[0]}, {worst[1]})")
    print(f"{n} tensors checked, {len(bad)} differ" + (": " + ", ".join(bad[:10]) if bad else ""))
    sys.exit(1 if bad else 0)


def cmd_refgguf(a):
    import gguf
    ck = Ckpt(a.ckpt)
    r = gguf.GGUFReader(a.like)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.out, arch=arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        v = original(ck, t.name, ne)
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            w.add_tensor(t.name, np.ascontiguousarray(v.astype(np.int32)), raw_dtype=gguf.GGMLQuantizationType.I32)
        else:
            w.add_tensor(t.name, np.ascontiguousarray(v.astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--family", default="v4", choices=["v4", "v41", "dspark"])
    w.add_argument("--out", required=True)
    w.add_argument("--shards", type=int, default=3)
    w.add_argument("--seed", type=int, default=0x5EED)
    c = sub.add_parser("check")
    c.add_argument("--ckpt", required=True)
    c.add_argument("--gguf", required=True)
    c.add_argument("-v", "--verbose", action="store_true")
    g = sub.add_parser("refgguf")
    g.add_argument("--ckpt", required=True)
    g.add_argument("--like", required=True)
    g.add_argument("--out", required=True)
    a = ap.parse_args()
    {"write": cmd_write, "check": cmd_check, "refgguf": cmd_refgguf}[a.cmd](a)


if __name__ == "__main__":
    main()
