#!/usr/bin/env python3
"""The float64 reference run on an official-format DeepSeek V4 checkpoint (issue 37).

Reads the checkpoint folder DeepSeek publishes (config.json,
model.safetensors.index.json, the safetensors shards) **on its own**, without
ds4's reader, name map or GGUF writer, and runs `ds4_reference.Reference`
(transformers' deepseek_v4, float64, plain numerics, every ds4 patch) on the
original weights, and on them rounded as `--recipe q8` and `--recipe mxfp4`
store them. The goldens it writes are what `ds4-quantize --hf`'s output must
reproduce (tests/convert_reference.rs): a wrong name map, a transposed tensor
or a wrong scale decode in the converter cannot hide behind an f32 conversion
that shares it.

    python3 tools/checkpoint/make_checkpoint.py --model v4 --tame --vocab 512 --out /tmp/ck
    python3 tools/reference/checkpoint_reference.py --checkpoint /tmp/ck [--out-dir tests/golden]

writes `checkpoint-v4-tame.plain-f64.json` (the checkpoint's values) and
`checkpoint-v4-tame-{q8,mxfp4}.plain-f64.json` (rounded by recipe) into
--out-dir.

What is read here, each from its own description:

* the container: an 8-byte little-endian header length, a JSON header
  (`dtype`, `shape`, `data_offsets` relative to the end of the header), the
  bytes; every tensor of the index in the shard the index names, offsets
  inside the file, byte counts matching the shape;
* `F8_E4M3` (E4M3FN: bias 7, subnormals, S.1111.111 is NaN and refused) with
  an `F8_E8M0` `.scale` (2^(e-127), 255 is NaN and refused) over
  `quantization_config.weight_block_size` blocks; `I8` packed FP4 E2M1
  (torch's `float4_e2m1fn_x2`: element 2j in the low nibble of byte j, bit 3
  the sign, tools/reference/e2m1.py's grid) with an `F8_E8M0` `.scale` per 32
  values along the row; `BF16`, `F16`, `F32` widened; `I64` kept. The E4M3,
  E8M0 and BF16 decodes are checked against torch's own casts at start-up;
* the names: the official `inference/model.py` module tree (`embed`,
  `layers.L.attn.{wq_a,q_norm,wq_b,wkv,kv_norm,wo_a,wo_b,attn_sink}`,
  `attn.compressor.*`, `attn.indexer.{wq_b,weights_proj,compressor.*}`,
  `ffn.gate.{weight,bias,tid2eid}`, `ffn.experts.X.w{1,2,3}`,
  `ffn.shared_experts.w{1,2,3}`, `hc_*`, `norm`, `head`) mapped onto
  transformers' parameters (../shared/spec/GGUF.md §9, right two columns), and
  cross-checked against transformers' own loader renames for the official
  checkpoint (`conversion_mapping`'s `deepseek_v4` entry) where that imports.
  The MTP block (`mtp.*`) is not part of the main model and is skipped; any
  other tensor nothing reads is an error.

* the recipes' rounding (`quantised`): each tensor's class in GGUF.md §5's
  table of the published mixes (attention projections, shared experts, head:
  Q8_0; embedding, router, HC mixers, compressors with `ape`, indexer
  matrices: F16; vectors: F32), routed experts Q8_0 (`q8`) or unchanged
  (`mxfp4`: the checkpoint's FP4 repacks without loss); Q8_0 by gguf-py's
  quantizer (ggml's reference rule), F16 by numpy's nearest-even cast.

Each golden (format `ds4-golden-v1`, one "prompt" of fixed ids; top-k = the
whole vocabulary for the original weights, so its logits are complete: logit =
log-prob + logsumexp; top 20 for the recipes) records the checkpoint's
`config.json` and a sha256 over its tensors (name, dtype, shape and bytes, in
name order) so the test can tell a checkpoint that changed from a converter
that broke, plus the conditioning of the run (log-prob spread, distinct
argmax). The script refuses to write a near-uniform run.
"""

import argparse
import hashlib
import json
import math
import random
import re
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import ds4_reference as R  # noqa: E402
from e2m1 import E2M1_GRID  # noqa: E402

FORMAT = "ds4-golden-v1"
INDEX_FILE = "model.safetensors.index.json"
CHECKPOINT_COMMAND = "make_checkpoint.py --model v4 --tame --vocab 512"
# The ids: BOS, then a fixed pseudo-random draw. 80 positions reach past the
# window (32), give 5 rows to the ratio-16 compressors and 20 to the ratio-4
# ones, so the indexer really selects (16 of more than 16 rows) from position
# 67 on: below that every row is visible and the indexer's weights do nothing.
N_IDS = 80
IDS_SEED = 37
FP4_BLOCK = 32  # E8M0 scale per 32 values along a routed expert's row
STEM = "checkpoint-v4-tame"
# The recipes' goldens keep the top 20 of every position, as the GGUF goldens do; the
# original weights' keeps the whole vocabulary, so that every logit is there.
RECIPE_TOP_K = 20

# ---------------------------------------------------------------------------------------
# The container


def read_shard(path: Path) -> dict:
    """name -> (dtype, shape, bytes) of one safetensors file."""
    raw = path.read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the header length")
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header of {n} bytes runs past the file")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        start, end = h["data_offsets"]
        if not 0 <= start <= end <= len(raw) - base:
            raise ValueError(f"{path}: {name}: offsets {start}..{end} outside the data")
        out[name] = (h["dtype"], [int(x) for x in h["shape"]], raw[base + start:base + end])
    return out


ITEM_BYTES = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "BF16": 2, "F16": 2, "F32": 4, "I64": 8}


def read_checkpoint(folder: Path) -> tuple[dict, dict]:
    """(config.json, name -> (dtype, shape, bytes)) of every tensor the index names."""
    config = json.loads((folder / "config.json").read_text())
    index = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
    shards = {f: read_shard(folder / f) for f in sorted(set(index.values()))}
    tensors = {}
    for name, f in index.items():
        if name not in shards[f]:
            raise KeyError(f"{f}: has no {name}, which the index places there")
        dtype, shape, data = shards[f][name]
        if dtype not in ITEM_BYTES:
            raise ValueError(f"{name}: dtype {dtype}")
        if len(data) != math.prod(shape) * ITEM_BYTES[dtype]:
            raise ValueError(f"{name}: {len(data)} bytes for shape {shape} of {dtype}")
        tensors[name] = (dtype, shape, data)
    extra = sorted(n for s in shards.values() for n in s if n not in index)
    if extra:
        raise KeyError(f"shard tensors the index does not name: {extra[:8]}")
    return config, tensors


def tensors_sha256(tensors: dict) -> str:
    """sha256 over every tensor in name order: the line "NAME DTYPE D0,D1,... NBYTES\\n",
    then its bytes (tests/convert_reference.rs computes the same)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        h.update(f"{name} {dtype} {','.join(map(str, shape))} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------
# The formats (float64 tables of every code; every value is exact in float64)


def e4m3_table() -> np.ndarray:
    """E4M3FN: sign bit 7, exponent bits 6..3 (bias 7), mantissa bits 2..0; exponent 0 is
    subnormal (m/8 * 2^-6); S.1111.111 is NaN (kept as NaN here, refused on use)."""
    t = np.empty(256)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = math.nan
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


def e8m0_table() -> np.ndarray:
    """E8M0 (UE8M0): 2^(e - 127); 255 is NaN."""
    t = np.array([2.0 ** (e - 127) for e in range(256)])
    t[255] = math.nan
    return t


def e2m1_table() -> np.ndarray:
    """E2M1 nibble: bit 3 the sign, bits 2..0 index the grid 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    return np.array([(-1.0 if n & 8 else 1.0) * E2M1_GRID[n & 7] for n in range(16)])


E4M3, E8M0, E2M1 = e4m3_table(), e8m0_table(), e2m1_table()


def self_test():
    """The tables against torch's own casts of every byte (the official model.py stores
    its weights as torch.float8_e4m3fn, scales as torch.float8_e8m0fnu)."""
    codes = torch.arange(256, dtype=torch.uint8)
    t = codes.view(torch.float8_e4m3fn).to(torch.float64).numpy()
    if not np.array_equal(t, E4M3, equal_nan=True):
        raise AssertionError("E4M3 table differs from torch.float8_e4m3fn")
    t = codes.view(torch.float8_e8m0fnu).to(torch.float64).numpy()
    if not np.array_equal(t, E8M0, equal_nan=True):
        raise AssertionError("E8M0 table differs from torch.float8_e8m0fnu")
    h = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    bf = h.view(torch.bfloat16).to(torch.float64).numpy()
    ours = bf16_to_f64(np.arange(65536, dtype=np.uint32).astype("<u2").tobytes(), 65536)
    if not np.array_equal(bf, ours, equal_nan=True):
        raise AssertionError("BF16 decode differs from torch.bfloat16")
    if not (E2M1[:8] == np.array(E2M1_GRID)).all() or not (E2M1[8:] == -np.array(E2M1_GRID)).all():
        raise AssertionError("E2M1 table")


def bf16_to_f64(data, n) -> np.ndarray:
    bits = np.frombuffer(data, dtype="<u2", count=n).astype(np.uint32) << 16
    with np.errstate(invalid="ignore"):  # NaN patterns (the self-test's) stay NaN
        return bits.view(np.float32).astype(np.float64)


def refuse_nan(name, what, values):
    if np.isnan(values).any():
        raise ValueError(f"{name}: a NaN {what} code")


def decode(name: str, tensors: dict, block: int) -> np.ndarray:
    """The logical values of weight `name` as float64 (int64 for I64); FP8 and packed FP4
    take their `.scale` (the name with `.weight` -> `.scale`)."""
    dtype, shape, data = tensors[name]
    n = math.prod(shape)
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4", count=n).astype(np.float64).reshape(shape)
    if dtype == "F16":
        return np.frombuffer(data, dtype="<f2", count=n).astype(np.float64).reshape(shape)
    if dtype == "BF16":
        return bf16_to_f64(data, n).reshape(shape)
    if dtype == "I64":
        return np.frombuffer(data, dtype="<i8", count=n).astype(np.int64).reshape(shape)
    if dtype not in ("F8_E4M3", "I8") or not name.endswith(".weight"):
        raise ValueError(f"{name}: {dtype} is no weight format here")
    sname = name[: -len(".weight")] + ".scale"
    if sname not in tensors or tensors[sname][0] != "F8_E8M0":
        raise KeyError(f"{name}: no F8_E8M0 {sname}")
    sdt, sshape, sdata = tensors[sname]
    scale = E8M0[np.frombuffer(sdata, dtype=np.uint8)].reshape(sshape)
    refuse_nan(sname, "E8M0", scale)
    codes = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    if dtype == "F8_E4M3":
        out, inp = shape
        want = [-(-out // block), -(-inp // block)]
        if sshape != want:
            raise ValueError(f"{sname}: shape {sshape}, {want} for {block}x{block} blocks of {shape}")
        w = E4M3[codes]
        refuse_nan(name, "E4M3", w)
        s = np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[:out, :inp]
        return w * s
    # Packed FP4: [out, in/2] bytes, element 2j in the low nibble of byte j.
    out, half = shape
    inp = 2 * half
    if sshape != [out, inp // FP4_BLOCK]:
        raise ValueError(f"{sname}: shape {sshape}, [{out}, {inp // FP4_BLOCK}] for FP4 {[out, inp]}")
    nib = np.empty((out, inp), dtype=np.uint8)
    nib[:, 0::2] = codes & 15
    nib[:, 1::2] = codes >> 4
    return E2M1[nib] * np.repeat(scale, FP4_BLOCK, axis=1)


# ---------------------------------------------------------------------------------------
# Official names -> transformers parameters (GGUF.md §9; the official inference/model.py
# module tree on the left)

GLOBAL_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
LAYER_NAMES = {  # under layers.L. -> under model.layers.L.
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
EXPERT = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight")


def state_dict(config: dict, tensors: dict) -> tuple[dict, dict, dict]:
    """(transformers state dict of float64 / int64 tensors, official -> transformers name for
    every plain rename, dtype count). Every checkpoint tensor outside `mtp.*` is read."""
    block = config["quantization_config"]["weight_block_size"]
    if block[0] != block[1]:
        raise ValueError(f"weight_block_size {block}: square blocks expected")
    block = block[0]
    sd, renames, experts, used = {}, {}, {}, set()
    dtypes, classes = {}, {}
    for name, (dtype, _, _) in tensors.items():
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        # `.scale`: an FP8 / FP4 weight's block scales, read with the weight (the
        # hyper-connection scales are `hc_*_scale`, no dot).
        if name.startswith("mtp.") or name.endswith(".scale"):
            continue
        m = EXPERT.fullmatch(name)
        if m:
            experts.setdefault(int(m[1]), {}).setdefault(m[3], {})[int(m[2])] = decode(name, tensors, block)
            used.add(name)
            continue
        if name in GLOBAL_NAMES:
            target = GLOBAL_NAMES[name]
        else:
            parts = name.split(".", 2)
            if parts[0] != "layers" or len(parts) != 3 or parts[2] not in LAYER_NAMES:
                raise KeyError(f"checkpoint tensor {name}: not a tensor of the official V4 model")
            target = f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
        renames[name] = target
        sd[target] = torch.from_numpy(decode(name, tensors, block))
        classes[target] = tensor_class(name, sd[target])
        used.add(name)
    # Routed experts: transformers' gate_up_proj [E, 2 FF, D] holds w1 (gate) rows, then w3
    # (up) rows, per expert; down_proj [E, D, FF] is w2.
    n_exp = config["n_routed_experts"]
    for l, ws in experts.items():
        for w in ("w1", "w2", "w3"):
            if sorted(ws.get(w, {})) != list(range(n_exp)):
                raise KeyError(f"layer {l}: experts of {w}: {sorted(ws.get(w, {}))}")
        stack = lambda w: np.stack([ws[w][x] for x in range(n_exp)])  # noqa: E731
        sd[f"model.layers.{l}.mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.concatenate([stack("w1"), stack("w3")], axis=1))
        sd[f"model.layers.{l}.mlp.experts.down_proj"] = torch.from_numpy(stack("w2"))
        classes[f"model.layers.{l}.mlp.experts.gate_up_proj"] = "routed"
        classes[f"model.layers.{l}.mlp.experts.down_proj"] = "routed"
    for name, (dtype, _, _) in tensors.items():
        if name.startswith("mtp.") or name in used:
            continue
        if dtype == "F8_E8M0" and name.endswith(".scale") and name[: -6] + ".weight" in used:
            continue
        raise KeyError(f"checkpoint tensor {name} ({dtype}): nothing reads it")
    for k, v in sd.items():
        if v.is_floating_point() and not torch.equal(v, v.to(torch.float32).to(torch.float64)):
            raise ValueError(f"{k}: a value not exact in float32 (the checkpoint's formats all are)")
    return sd, renames, dtypes, classes


# The published mixes' type per tensor class (../shared/spec/GGUF.md §5, docs/TOOLS.md's recipe
# table): attention projections, shared experts and the head Q8_0; embedding, router, HC
# mixers, compressors (ape included) and indexer matrices F16; norms, sinks, the router bias,
# HC scale/base F32; routed experts by recipe (`mxfp4`: the checkpoint's FP4, repacked
# without loss).
RECIPES = {
    "q8": {"routed": "Q8_0", "matrix": "Q8_0", "table": "F16", "vector": "F32"},
    "mxfp4": {"routed": "exact", "matrix": "Q8_0", "table": "F16", "vector": "F32"},
}


def tensor_class(name: str, t: torch.Tensor) -> str:
    """The class of official tensor `name` in GGUF.md §5's table (routed experts aside)."""
    if name.endswith(".ffn.gate.tid2eid"):
        return "ids"
    if (name == "head.weight" or re.search(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$", name)
            or ".ffn.shared_experts." in name):
        return "matrix"
    if (name == "embed.weight" or name.endswith(".ffn.gate.weight")
            or re.search(r"hc_(attn|ffn|head)_fn$", name)
            or re.search(r"compressor\.(wkv\.weight|wgate\.weight|ape)$", name)
            or re.search(r"\.attn\.indexer\.(wq_b|weights_proj)\.weight$", name)):
        return "table"
    if t.dim() != 1:
        raise ValueError(f"{name}: {tuple(t.shape)} is no vector, and no class of GGUF.md §5")
    return "vector"


def quantised(sd: dict, classes: dict, recipe: str, recipes: dict = RECIPES) -> dict:
    """`sd` with every tensor rounded as recipe `recipe` stores it (`recipes`: class -> type
    per recipe; V4's by default): Q8_0 by gguf-py's quantizer (blocks of 32 along each row;
    gguf-py is ggml's reference rule) and decoded back, F16 by numpy's round-to-nearest-even
    cast."""
    types, out = recipes[recipe], {}
    for k, v in sd.items():
        kind = "ids" if classes[k] == "ids" else types[classes[k]]
        a = v.numpy()
        if kind in ("ids", "F32", "exact"):
            out[k] = v
        elif kind == "F16":
            out[k] = torch.from_numpy(a.astype(np.float32).astype(np.float16).astype(np.float64))
        elif kind == "Q8_0":
            q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            d = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(a.shape)
            out[k] = torch.from_numpy(d.astype(np.float64))
        else:
            raise AssertionError(kind)
    return out


def cross_check_renames(renames: dict, meta_state: dict) -> str:
    """Our map against transformers' loader renames for the official checkpoint (a third
    reading of the same names). Returns a note for the golden."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError as e:
        return f"not run ({e})"
    transforms = get_checkpoint_conversion_mapping("deepseek_v4")
    if transforms is None:
        return "not run (transformers has no deepseek_v4 conversion mapping)"
    conv = [t for t in transforms if isinstance(t, WeightConverter)]
    ren = [t for t in transforms if not isinstance(t, WeightConverter)]
    bad = []
    for src, ours in sorted(renames.items()):
        theirs, _ = rename_source_key(src, ren, conv, "model", meta_state)
        if theirs != ours:
            bad.append(f"{src}: ours {ours}, transformers {theirs}")
    if bad:
        raise AssertionError("name map differs from transformers' loader:\n  " + "\n  ".join(bad[:10]))
    return f"{len(renames)} renames equal transformers' deepseek_v4 conversion_mapping"


# ---------------------------------------------------------------------------------------
# config.json (the official keys) -> DeepseekV4Config


def build_config(c: dict):
    """DeepseekV4Config from the official config.json. The official model.py gives a layer
    with compress ratio 4 the overlapped compressor and the indexer (CSA), another nonzero
    ratio the plain compressor (HCA), 0 the window only."""
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    n_layer = c["num_hidden_layers"]
    ratios = c["compress_ratios"][:n_layer]
    layer_types, rates = [], {}
    for r in ratios:
        kind = R.SWA if r == 0 else R.CSA if r == 4 else R.HCA
        layer_types.append(kind)
        if r:
            if rates.setdefault(kind, r) != r:
                raise ValueError(f"transformers allows one rate per kind: {ratios}")
    compress_rates = {R.CSA: rates.get(R.CSA, 4), R.HCA: rates.get(R.HCA, 128)}
    n_hash = c["num_hash_layers"]
    if c.get("n_shared_experts", 1) != 1 or c.get("num_key_value_heads", 1) != 1:
        raise ValueError("one shared expert and one KV head expected")
    if c["scoring_func"] != "sqrtsoftplus" or not c.get("norm_topk_prob", True):
        raise ValueError("sqrtsoftplus scores, renormalised, expected")
    rope_params = None
    rs = c.get("rope_scaling")
    if rs is not None and float(rs["factor"]) != 1.0:
        if rs.get("type", rs.get("rope_type")) != "yarn":
            raise ValueError(f"rope_scaling {rs}")
        rope_params = {
            "rope_type": "yarn",
            "factor": float(rs["factor"]),
            "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
            "beta_fast": float(rs["beta_fast"]),
            "beta_slow": float(rs["beta_slow"]),
        }
    cfg = DeepseekV4Config(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        moe_intermediate_size=c["moe_intermediate_size"],
        num_hidden_layers=n_layer,
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=1,
        head_dim=c["head_dim"],
        q_lora_rank=c["q_lora_rank"],
        num_experts_per_tok=c["num_experts_per_tok"],
        n_routed_experts=c["n_routed_experts"],
        n_shared_experts=1,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        routed_scaling_factor=float(c["routed_scaling_factor"]),
        max_position_embeddings=c["max_position_embeddings"],
        rope_theta=float(c["rope_theta"]),
        compress_rope_theta=float(c["compress_rope_theta"]),
        rope_parameters=rope_params,
        partial_rotary_factor=c["qk_rope_head_dim"] / c["head_dim"],
        layer_types=layer_types,
        compress_rates=compress_rates,
        mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (n_layer - n_hash),
        hc_mult=c["hc_mult"],
        hc_sinkhorn_iters=c["hc_sinkhorn_iters"],
        hc_eps=float(c["hc_eps"]),
        swiglu_limit=float(c["swiglu_limit"]),
        sliding_window=c["sliding_window"],
        o_groups=c["o_groups"],
        o_lora_rank=c["o_lora_rank"],
        index_n_heads=c["index_n_heads"],
        index_head_dim=c["index_head_dim"],
        index_topk=c["index_topk"],
        rms_norm_eps=float(c["rms_norm_eps"]),
        num_nextn_predict_layers=int(c.get("num_nextn_predict_layers", 0)),
        bos_token_id=int(c.get("bos_token_id", 0)),
        eos_token_id=int(c.get("eos_token_id", 1)),
        tie_word_embeddings=False,
    )
    if cfg.qk_rope_head_dim != c["qk_rope_head_dim"]:
        raise ValueError(f"partial rotary gives {cfg.qk_rope_head_dim} dims, config {c['qk_rope_head_dim']}")
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg, ratios, layer_types, n_hash


# ---------------------------------------------------------------------------------------


def fixed_ids(vocab: int) -> list:
    r = random.Random(IDS_SEED)
    return [0] + [r.randrange(vocab) for _ in range(N_IDS - 1)]


def conditioning(logits: torch.Tensor) -> dict:
    """How far from trivial the run is: per position the spread of the log-probs (std over the
    vocabulary), the top-1 log-prob against the uniform -ln V, and the distinct argmaxes."""
    lp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    std = lp.std(dim=-1)
    top1 = lp.max(dim=-1).values
    am = lp.argmax(dim=-1)
    v = lp.shape[-1]
    return {
        "uniform_logprob": -math.log(v),
        "logprob_std_min": float(std.min()),
        "logprob_std_median": float(std.median()),
        "top1_logprob_min": float(top1.min()),
        "top1_logprob_median": float(top1.median()),
        "top1_logprob_max": float(top1.max()),
        "distinct_argmax": len(set(am.tolist())),
        "positions": int(lp.shape[0]),
    }


def golden(ref, ids, top, variant, weights, checkpoint, cross):
    """One golden document (format ds4-golden-v1) of `ref` on `ids`."""
    rec = R.Recorder(gaps=True)
    logits = ref.logits(ids, recorder=rec)
    import make_goldens as G  # noqa: E402  (here: it imports tokenizers)

    cond = conditioning(logits)
    if cond["top1_logprob_median"] - cond["uniform_logprob"] < 1.0 or cond["distinct_argmax"] < 4:
        raise SystemExit(f"{variant}: the run is near-trivial, not a useful golden: {cond}")
    return {
        "format": FORMAT,
        "variant": variant,
        "weights": weights,
        "checkpoint": checkpoint,
        "reference": {
            "script": "tools/reference/checkpoint_reference.py (reader, decode, name map, recipe "
                      "rounding) + tools/reference/ds4_reference.py (Reference.from_state_dict)",
            "dtype": "float64",
            "numerics": "plain",
            "exact64": ref.exact64,
            "topk_ties": "lowest index (stable sort on (-score, index))",
            "router": "ds4 softplus and max(sum, 2^-14) guard",
            "name_map_cross_check": cross,
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
            "gguf_py": __import__("importlib.metadata").metadata.version("gguf"),
            "ids": f"BOS 0 then {N_IDS - 1} ids of random.Random({IDS_SEED}).randrange(vocab)",
        },
        "top_k": top,
        "conditioning": cond,
        "prompts": [{
            "name": "ids",
            "ids": ids,
            "n_tokens": len(ids),
            **R.summarize(logits, top),
            **G.selection_gaps(rec, len(ids)),
        }],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="official-format checkpoint folder")
    ap.add_argument("--command", default=CHECKPOINT_COMMAND,
                    help="the make_checkpoint.py arguments that wrote it (recorded in the golden)")
    ap.add_argument("--out-dir", default=str(REPO / "tests/golden"),
                    help=f"where {STEM}.plain-f64.json and the recipes' goldens go")
    a = ap.parse_args()

    self_test()
    folder = Path(a.checkpoint)
    config, tensors = read_checkpoint(folder)
    sha = tensors_sha256(tensors)
    cfg, ratios, layer_types, n_hash = build_config(config)
    sd, renames, dtypes, classes = state_dict(config, tensors)
    info = R.ModelInfo(path=str(folder), sha256=sha, n_rot=config["qk_rope_head_dim"],
                       head_dim=cfg.head_dim, index_head_dim=cfg.index_head_dim,
                       compress_ratios=ratios, layer_types=layer_types, n_hash_layers=n_hash)
    checkpoint = {
        "command": a.command,
        "script": "tools/checkpoint/make_checkpoint.py",
        "tensors_sha256": sha,
        "tensors_sha256_rule": "sha256 over tensors in name order of "
                               "'NAME DTYPE D0,D1,.. NBYTES\\n' then the bytes",
        "tensors": len(tensors),
        "dtypes": dict(sorted(dtypes.items())),
        "config": config,
        "compress_ratios": ratios,
        "layer_types": layer_types,
    }
    ids = fixed_ids(config["vocab_size"])
    runs = [(f"{STEM}.plain-f64", "the checkpoint's values, exact", sd, config["vocab_size"])]
    for recipe in RECIPES:
        runs.append((f"{STEM}-{recipe}.plain-f64",
                     f"the checkpoint's values rounded as `--recipe {recipe}` stores them "
                     f"(GGUF.md §5 classes: {RECIPES[recipe]}; Q8_0 by gguf-py, F16 round to "
                     f"nearest even)", quantised(sd, classes, recipe), RECIPE_TOP_K))
    cross = None
    for variant, weights, state, top in runs:
        ref = R.Reference.from_state_dict(cfg, state, info, torch.float64, "plain")
        if cross is None:
            cross = cross_check_renames(renames, ref.model.state_dict())
            print(f"name map: {cross}", flush=True)
        doc = golden(ref, ids, top, variant, weights, checkpoint, cross)
        path = Path(a.out_dir) / f"{variant}.json"
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes): conditioning {doc['conditioning']}",
              flush=True)


if __name__ == "__main__":
    main()
