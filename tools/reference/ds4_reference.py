#!/usr/bin/env python3
"""Python reference for ds4: transformers' deepseek_v4 run on a ds4 GGUF.

Reads a DeepSeek V4 GGUF with gguf-py, builds a `DeepseekV4Config` from its
metadata, dequantizes every tensor (F32, F16, Q8_0, Q2_K, Q4_K, IQ2_XXS, ... via
`gguf.quants.dequantize`; I32 as is) into the transformers state dict (GGUF.md §9),
loads it strictly and runs the eager model on CPU in float32 or float64 with
`input_ids` and `use_cache=False`.

Patches applied to transformers (all inside `Ds4Patches`, a context manager that
restores everything on exit; see README.md for the reasons):

* always: deterministic top-k (stable sort on (-score, index): lowest index wins on
  ties) for the expert router and the lightning indexer; ds4's router (softplus with
  the exp branch below -20, weight sum guarded by max(sum, 2^-14));
* `exact64` (default for float64): no hidden float32 steps, i.e. RoPE angles from
  float64 frequencies, RMSNorm / HC mixing / compressor softmax / indexer scores in
  float64 (transformers casts those to float32 even in a float64 model);
* `--numerics model`: ds4's three rounding steps (MODEL.md §3.5.1), hooked right
  after the RoPE of the row they apply to:
  - raw KV row (every layer): E4M3 on the non-RoPE dims, then f16;
  - compressed KV row (CSA and HCA compressors): E4M3 on the non-RoPE dims, then f16;
  - indexer compressed key: Hadamard + FP4, then f16;
  - indexer query: Hadamard + FP4.

Command line: per-position top-k log-probs of one prompt, written as JSON.
"""

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as tfm
from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds4_numerics as nx  # noqa: E402

ARCH = "deepseek4"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
SWA = "sliding_attention"

# ---------------------------------------------------------------------------------------
# GGUF reading


def read_metadata(reader: gguf.GGUFReader) -> dict:
    """Every metadata key except the big tokenizer arrays, as Python values."""
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
            meta[key] = f"<array of {len(f.data)}>"
            continue
        meta[key] = f.contents()
    return meta


def dequantize(t) -> np.ndarray:
    """One GGUF tensor as a numpy array of shape reversed(ne) (row-major torch layout):
    float32 for float/quant types, int32 for I32."""
    ne = tuple(int(x) for x in t.shape)
    shape = tuple(reversed(ne))
    qt = t.tensor_type
    if qt == gguf.GGMLQuantizationType.I32:
        arr = np.asarray(t.data).view(np.int32)
    else:
        arr = gguf.quants.dequantize(np.asarray(t.data), qt).astype(np.float32, copy=False)
    arr = arr.reshape(shape)
    return arr


def _scalar(meta, key, kind=float, default=None):
    full = f"{ARCH}.{key}"
    if full not in meta:
        if default is None:
            raise KeyError(f"GGUF metadata key {full} missing")
        return default
    return kind(meta[full])


@dataclass
class ModelInfo:
    """What the reference derived from the GGUF (kept for the golden headers)."""

    path: str
    sha256: str
    n_rot: int
    head_dim: int
    index_head_dim: int
    compress_ratios: list
    layer_types: list
    n_hash_layers: int
    tensor_types: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def build_config(meta: dict, names: set) -> tuple[DeepseekV4Config, dict]:
    """DeepseekV4Config from GGUF metadata (MODEL.md §1, §7.1), cross-checked against
    the tensor directory."""
    if meta.get("general.architecture") != ARCH:
        raise ValueError(f"general.architecture is {meta.get('general.architecture')!r}, not {ARCH}")
    n_layer = _scalar(meta, "block_count", int)
    ratios = [int(x) for x in meta[f"{ARCH}.attention.compress_ratios"]][:n_layer]
    if len(ratios) != n_layer:
        raise ValueError("compress_ratios shorter than block_count")
    n_hash = _scalar(meta, "hash_layer_count", int)
    # CSA (overlapped compressor + indexer) is keyed on the indexer tensors, not on
    # the ratio value (MODEL.md §1.1).
    layer_types, csa_rates, hca_rates = [], set(), set()
    for l, r in enumerate(ratios):
        has_idx = f"blk.{l}.indexer.proj.weight" in names
        has_cmp = f"blk.{l}.attn_compressor_kv.weight" in names
        if r == 0:
            if has_cmp or has_idx:
                raise ValueError(f"layer {l}: ratio 0 but compressor tensors present")
            layer_types.append(SWA)
        elif has_idx:
            layer_types.append(CSA)
            csa_rates.add(r)
        else:
            if not has_cmp:
                raise ValueError(f"layer {l}: ratio {r} but no compressor tensors")
            layer_types.append(HCA)
            hca_rates.add(r)
        hash_tensor = f"blk.{l}.ffn_gate_tid2eid.weight" in names
        if hash_tensor != (l < n_hash):
            raise ValueError(f"layer {l}: tid2eid presence disagrees with hash_layer_count {n_hash}")
        bias = f"blk.{l}.exp_probs_b.bias" in names
        if bias == (l < n_hash):
            raise ValueError(f"layer {l}: exp_probs_b presence disagrees with hash_layer_count {n_hash}")
    if len(csa_rates) > 1 or len(hca_rates) > 1:
        raise ValueError(f"transformers allows one rate per kind; CSA {csa_rates}, HCA {hca_rates}")
    compress_rates = {CSA: csa_rates.pop() if csa_rates else 4, HCA: hca_rates.pop() if hca_rates else 128}

    hd = _scalar(meta, "attention.key_length", int)
    if _scalar(meta, "attention.value_length", int) != hd:
        raise ValueError("key_length != value_length")
    if _scalar(meta, "attention.head_count_kv", int) != 1:
        raise ValueError("head_count_kv must be 1")
    n_rot = _scalar(meta, "rope.dimension_count", int)
    if _scalar(meta, "expert_shared_count", int) != 1:
        raise ValueError("transformers implements exactly one shared expert")
    if not bool(meta[f"{ARCH}.expert_weights_norm"]):
        raise ValueError("expert_weights_norm = false is not supported by transformers")
    gating = meta.get(f"{ARCH}.expert_gating_func", 4)
    if int(gating) != 4:
        raise ValueError(f"expert_gating_func {gating} (only 4 = sqrt(softplus))")
    clamps = [float(x) for x in meta[f"{ARCH}.swiglu_clamp_exp"]][:n_layer]
    if len(set(clamps)) != 1:
        raise ValueError(f"per-layer swiglu clamps differ ({clamps}); transformers has one swiglu_limit")
    if not clamps[0] > 1e-6:
        raise ValueError("swiglu clamp <= 1e-6 (ds4 disables the clamp, transformers cannot)")

    rope_params = None
    stype = meta.get(f"{ARCH}.rope.scaling.type")
    factor = float(meta.get(f"{ARCH}.rope.scaling.factor", 1.0))
    if factor != 1.0:
        # ds4 always uses YaRN on compressed layers (MODEL.md §7 row 12).
        if stype not in (None, "yarn"):
            raise ValueError(f"rope.scaling.type {stype!r} (only yarn)")
        rope_params = {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": _scalar(meta, "rope.scaling.original_context_length", int),
            "beta_fast": _scalar(meta, "rope.scaling.yarn_beta_fast", float, 32.0),
            "beta_slow": _scalar(meta, "rope.scaling.yarn_beta_slow", float, 1.0),
        }

    cfg = DeepseekV4Config(
        vocab_size=_scalar(meta, "vocab_size", int),
        hidden_size=_scalar(meta, "embedding_length", int),
        moe_intermediate_size=_scalar(meta, "expert_feed_forward_length", int),
        num_hidden_layers=n_layer,
        num_attention_heads=_scalar(meta, "attention.head_count", int),
        num_key_value_heads=1,
        head_dim=hd,
        q_lora_rank=_scalar(meta, "attention.q_lora_rank", int),
        num_experts_per_tok=_scalar(meta, "expert_used_count", int),
        n_routed_experts=_scalar(meta, "expert_count", int),
        n_shared_experts=1,
        scoring_func="sqrtsoftplus",
        norm_topk_prob=True,
        routed_scaling_factor=_scalar(meta, "expert_weights_scale", float),
        max_position_embeddings=_scalar(meta, "context_length", int),
        rope_theta=_scalar(meta, "rope.freq_base", float),
        compress_rope_theta=_scalar(meta, "attention.compress_rope_freq_base", float),
        rope_parameters=rope_params,
        partial_rotary_factor=n_rot / hd,
        layer_types=layer_types,
        compress_rates=compress_rates,
        mlp_layer_types=["hash_moe"] * n_hash + ["moe"] * (n_layer - n_hash),
        hc_mult=_scalar(meta, "hyper_connection.count", int),
        hc_sinkhorn_iters=_scalar(meta, "hyper_connection.sinkhorn_iterations", int),
        hc_eps=_scalar(meta, "hyper_connection.epsilon", float),
        swiglu_limit=clamps[0],
        sliding_window=_scalar(meta, "attention.sliding_window", int),
        o_groups=_scalar(meta, "attention.output_group_count", int),
        o_lora_rank=_scalar(meta, "attention.output_lora_rank", int),
        index_n_heads=_scalar(meta, "attention.indexer.head_count", int),
        index_head_dim=_scalar(meta, "attention.indexer.key_length", int),
        index_topk=_scalar(meta, "attention.indexer.top_k", int),
        rms_norm_eps=_scalar(meta, "attention.layer_norm_rms_epsilon", float),
        num_nextn_predict_layers=int(meta.get(f"{ARCH}.nextn_predict_layers", 0)),
        bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 0)),
        eos_token_id=int(meta.get("tokenizer.ggml.eos_token_id", 1)),
        tie_word_embeddings=False,
    )
    if cfg.qk_rope_head_dim != n_rot:
        raise ValueError(f"partial rotary gives {cfg.qk_rope_head_dim} dims, GGUF says {n_rot}")
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    extra = {"ratios": ratios, "layer_types": layer_types, "n_hash": n_hash, "n_rot": n_rot}
    return cfg, extra


# GGUF.md §9: per-layer renames (everything except the routed experts and tid2eid).
LAYER_MAP = {
    "hc_attn_fn.weight": "attn_hc.fn",
    "hc_attn_base.weight": "attn_hc.base",
    "hc_attn_scale.weight": "attn_hc.scale",
    "hc_ffn_fn.weight": "ffn_hc.fn",
    "hc_ffn_base.weight": "ffn_hc.base",
    "hc_ffn_scale.weight": "ffn_hc.scale",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv.weight": "self_attn.kv_proj.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
    "attn_output_a.weight": "self_attn.o_a_proj.weight",
    "attn_output_b.weight": "self_attn.o_b_proj.weight",
    "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
    "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
    "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
    "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
    "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
    "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}


def build_state_dict(reader: gguf.GGUFReader) -> tuple[dict, dict]:
    """transformers state dict (float32 / int64 tensors) from the GGUF tensors.
    Raises on any GGUF tensor it does not know (mtp.* excepted)."""
    sd, types = {}, {}
    pending_gate_up = {}
    for t in reader.tensors:
        name = t.name
        types[name] = t.tensor_type.name
        if name.startswith("mtp."):
            continue
        arr = dequantize(t)
        if name in GLOBAL_MAP:
            sd[GLOBAL_MAP[name]] = torch.from_numpy(arr.copy())
            continue
        parts = name.split(".", 2)
        if parts[0] != "blk" or len(parts) != 3:
            raise KeyError(f"unexpected GGUF tensor {name}")
        l, sub = int(parts[1]), parts[2]
        pre = f"model.layers.{l}."
        if sub in LAYER_MAP:
            sd[pre + LAYER_MAP[sub]] = torch.from_numpy(arr.copy())
        elif sub == "ffn_gate_tid2eid.weight":
            # I32 ne [K, V] is numpy (V, K): row t = the K expert ids of token t.
            sd[pre + "mlp.gate.tid2eid"] = torch.from_numpy(arr.astype(np.int64))
        elif sub in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            pending_gate_up.setdefault(l, {})[sub.split("_")[1]] = arr
        else:
            raise KeyError(f"unexpected GGUF tensor {name}")
    for l, gu in pending_gate_up.items():
        if set(gu) != {"gate", "up"}:
            raise KeyError(f"layer {l}: need both ffn_gate_exps and ffn_up_exps")
        # gate_up_proj [E, 2*FF, D], gate rows first.
        sd[f"model.layers.{l}.mlp.experts.gate_up_proj"] = torch.from_numpy(
            np.concatenate([gu["gate"], gu["up"]], axis=1))
    return sd, types


def yarn_inv_freq64(cfg: DeepseekV4Config, layer_type: str) -> torch.Tensor:
    """RoPE frequencies in float64 straight from MODEL.md §3.4.1."""
    rp = cfg.rope_parameters[layer_type]
    theta = float(rp["rope_theta"])
    nr = int(cfg.head_dim * rp["partial_rotary_factor"])
    k = torch.arange(nr // 2, dtype=torch.float64)
    base = theta ** (-2.0 * k / nr)
    if rp["rope_type"] == "default":
        return base
    if rp["rope_type"] != "yarn" or float(rp.get("attention_factor", 1.0)) != 1.0:
        raise ValueError(f"unsupported rope parameters {rp}")
    s = float(rp["factor"])
    orig = float(rp["original_max_position_embeddings"])

    def corr(beta):
        return nr * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(0, math.floor(corr(float(rp["beta_fast"]))))
    hi = min(nr - 1, math.ceil(corr(float(rp["beta_slow"]))))
    ramp = ((k - lo) / max(hi - lo, 0.001)).clamp(0, 1)
    return base * (1 - ramp) + (base / s) * ramp


# ---------------------------------------------------------------------------------------
# Patches


def stable_topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk with a defined order: descending score, lowest index first on ties."""
    if not largest:
        raise NotImplementedError("stable_topk: largest=False")
    vals, idx = torch.sort(input, dim=dim, descending=True, stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


def ds4_softplus(x):
    """ds4's softplus: x above 20, exp(x) below -20, log1p(exp(x)) between."""
    return torch.where(x > 20, x, torch.where(x < -20, torch.exp(x), torch.log1p(torch.exp(x))))


ROUTE_SUM_FLOOR = 2.0 ** -14  # ds4: weights / max(sum, 6.103515625e-05)


def topk_router_forward(self, hidden_states):
    flat = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(flat, self.weight)
    scores = ds4_softplus(logits).sqrt()
    indices = stable_topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=ROUTE_SUM_FLOOR)
    return logits, weights * self.routed_scaling_factor, indices


def hash_router_forward(self, hidden_states, input_ids):
    flat = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(flat, self.weight)
    scores = ds4_softplus(logits).sqrt()
    indices = self.tid2eid[input_ids.reshape(-1)].long()
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=ROUTE_SUM_FLOOR)
    return logits, weights * self.routed_scaling_factor, indices


# exact64: the same formulas as transformers with its float32 casts removed.

def rmsnorm_forward64(self, hidden_states):
    if hidden_states.dtype != torch.float64:
        return _ORIG["rmsnorm"](self, hidden_states)
    var = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(var + self.variance_epsilon))


def unweighted_rmsnorm_forward64(self, x):
    if x.dtype != torch.float64:
        return _ORIG["unweighted_rmsnorm"](self, x)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)


def hyper_connection_forward64(self, hidden_streams):
    if hidden_streams.dtype != torch.float64:
        return _ORIG["hc"](self, hidden_streams)
    b, s = hidden_streams.shape[:2]
    hc = self.hc_mult
    flat = self.input_norm(hidden_streams.reshape(b, s, -1))
    mixes = F.linear(flat, self.fn)
    pre_w, post_w, comb_w = mixes.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = self.base.split([hc, hc, hc * hc])
    pre_s, post_s, comb_s = self.scale.unbind(0)
    comb_w = comb_w.view(*comb_w.shape[:-1], hc, hc)
    pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.hc_eps
    post = 2 * torch.sigmoid(post_w * post_s + post_b)
    comb = torch.softmax(comb_w * comb_s + comb_b.view(hc, hc), dim=-1) + self.hc_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
    for _ in range(self.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + self.hc_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
    collapsed = (pre.unsqueeze(-1) * hidden_streams).sum(dim=2)
    return post, comb, collapsed


def hyper_head_forward64(self, x):
    if x.dtype != torch.float64:
        return _ORIG["hc_head"](self, x)
    flat = self.input_norm(x.flatten(2))
    mixes = F.linear(flat, self.hc_fn)
    pre = torch.sigmoid(mixes * self.hc_scale + self.hc_base) + self.eps
    return (pre.unsqueeze(-1) * x).sum(dim=2)


def indexer_scorer_forward64(self, q, compressed_kv, hidden_states):
    if q.dtype != torch.float64:
        return _ORIG["scorer"](self, q, compressed_kv, hidden_states)
    scores = torch.matmul(q, compressed_kv.transpose(-1, -2).unsqueeze(1))
    scores = F.relu(scores) * self.softmax_scale
    weights = self.weights_proj(hidden_states) * self.weights_scaling
    return (scores * weights.unsqueeze(-1)).sum(dim=2)


def rotary_forward64(self, x, position_ids, layer_type=None):
    if x.dtype != torch.float64:
        return _ORIG["rotary"](self, x, position_ids, layer_type)
    if getattr(self, f"{layer_type}_attention_scaling") != 1.0:
        raise ValueError("RoPE attention scaling != 1")
    inv = yarn_inv_freq64(self.config, layer_type).to(x.device)
    freqs = position_ids[..., None].to(torch.float64) * inv
    return freqs.cos(), freqs.sin()


def tensor_softmax64(self, *args, **kwargs):
    # The compressors call `gate.softmax(dim=2, dtype=torch.float32)`; keep float64.
    if self.dtype == torch.float64 and kwargs.get("dtype") == torch.float32:
        kwargs = dict(kwargs, dtype=torch.float64)
    return _ORIG["tensor_softmax"](self, *args, **kwargs)


def rope_rotate(x, cos, sin, unsqueeze_dim=1):
    """transformers' interleaved tail RoPE, computed in x's dtype."""
    cos = cos.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    sin = sin.repeat_interleave(2, dim=-1).unsqueeze(unsqueeze_dim)
    rd = cos.shape[-1]
    nope, rope = x[..., :-rd], x[..., -rd:]
    return torch.cat([nope, rope * cos + tfm.rotate_half(rope) * sin], dim=-1)


_ORIG = {
    "rmsnorm": tfm.DeepseekV4RMSNorm.forward,
    "unweighted_rmsnorm": tfm.DeepseekV4UnweightedRMSNorm.forward,
    "hc": tfm.DeepseekV4HyperConnection.forward,
    "hc_head": tfm.DeepseekV4HyperHead.forward,
    "scorer": tfm.DeepseekV4IndexerScorer.forward,
    "rotary": tfm.DeepseekV4RotaryEmbedding.forward,
    "tensor_softmax": torch.Tensor.softmax,
    "apply_rope": tfm.apply_rotary_pos_emb,
    "torch_topk": torch.topk,
    "tensor_topk": torch.Tensor.topk,
    "topk_router": tfm.DeepseekV4TopKRouter.forward,
    "hash_router": tfm.DeepseekV4HashRouter.forward,
}


@dataclass
class Recorder:
    """What a forward pass may record through hooks (all optional)."""

    hc_positions: list | None = None  # HC state after each sublayer at these positions
    hc: list = field(default_factory=list)  # per layer: (after_attn [P,4,D], after_ffn [P,4,D])
    experts: bool = False
    expert_ids: dict = field(default_factory=dict)  # layer -> [T, K] int
    indexer: bool = False
    indexer_ids: dict = field(default_factory=dict)  # layer -> [T, k] int (-1 = none)
    attention: bool = False
    attn_entropy: dict = field(default_factory=dict)  # layer -> [H, T] entropy / ln(n visible)
    rounding_calls: dict = field(default_factory=dict)  # role -> count
    gaps: bool = False
    router_gap: dict = field(default_factory=dict)  # layer -> [T] (K-th - (K+1)-th selection score)
    indexer_gap: dict = field(default_factory=dict)  # layer -> [T] (k-th - (k+1)-th), nan if n <= k


class Ds4Patches:
    """Context manager: installs the patches and hooks on `model` and removes them."""

    def __init__(self, model, n_rot, numerics="plain", exact64=False, recorder=None, perturb=None):
        if numerics not in ("plain", "model"):
            raise ValueError(numerics)
        self.model, self.n_rot, self.numerics, self.exact64 = model, n_rot, numerics, exact64
        self.rec = recorder
        self.perturb = perturb  # callable(embeddings) -> embeddings
        self.handles = []
        self.pending = None  # (role, storage pointer) set by a hook, consumed by the next RoPE

    # -- rounding roles ------------------------------------------------------------------
    def _mark(self, role):
        def hook(_module, _inputs, output):
            if self.pending is not None:
                raise RuntimeError(f"rounding role {self.pending[0]} was never consumed")
            self.pending = (role, output.untyped_storage().data_ptr())
        return hook

    def _round(self, role, y):
        if self.rec is not None:
            self.rec.rounding_calls[role] = self.rec.rounding_calls.get(role, 0) + 1
        if role in ("kv", "ckv"):  # attention rows: FP8 on the non-RoPE dims, f16 storage
            return nx.f16_round(nx.fp8_kv_round(y, self.n_rot))
        if role == "ik":  # indexer compressed keys: Hadamard + FP4, f16 storage
            return nx.f16_round(nx.hadamard_fp4(y))
        if role == "iq":  # indexer queries: Hadamard + FP4 (not cached)
            return nx.hadamard_fp4(y)
        raise AssertionError(role)

    def _apply_rope(self, x, cos, sin, unsqueeze_dim=1):
        if self.exact64 and x.dtype == torch.float64:
            y = rope_rotate(x, cos, sin, unsqueeze_dim)
        else:
            y = _ORIG["apply_rope"](x, cos, sin, unsqueeze_dim)
        if self.pending is not None:
            role, ptr = self.pending
            if x.untyped_storage().data_ptr() != ptr:
                raise RuntimeError(f"RoPE call does not match pending rounding role {role}")
            self.pending = None
            y = self._round(role, y)
        return y

    # -- install / remove ----------------------------------------------------------------
    def __enter__(self):
        self.saved = []

        def setp(owner, name, value):
            own = name in vars(owner)  # class attribute of its own, or inherited?
            self.saved.append((owner, name, getattr(owner, name) if own else None))
            setattr(owner, name, value)

        setp(torch, "topk", stable_topk)
        setp(torch.Tensor, "topk", stable_topk)
        setp(tfm.DeepseekV4TopKRouter, "forward", topk_router_forward)
        setp(tfm.DeepseekV4HashRouter, "forward", hash_router_forward)
        setp(tfm, "apply_rotary_pos_emb", self._apply_rope)
        if self.exact64:
            setp(tfm.DeepseekV4RMSNorm, "forward", rmsnorm_forward64)
            setp(tfm.DeepseekV4UnweightedRMSNorm, "forward", unweighted_rmsnorm_forward64)
            setp(tfm.DeepseekV4HyperConnection, "forward", hyper_connection_forward64)
            setp(tfm.DeepseekV4HyperHead, "forward", hyper_head_forward64)
            setp(tfm.DeepseekV4IndexerScorer, "forward", indexer_scorer_forward64)
            setp(tfm.DeepseekV4RotaryEmbedding, "forward", rotary_forward64)
            setp(torch.Tensor, "softmax", tensor_softmax64)

        m = self.model.model
        hook = lambda mod, fn: self.handles.append(mod.register_forward_hook(fn))  # noqa: E731
        if self.numerics == "model":
            for layer in m.layers:
                att = layer.self_attn
                hook(att.kv_norm, self._mark("kv"))
                if att.compressor is not None:
                    hook(att.compressor.kv_norm, self._mark("ckv"))
                    if hasattr(att.compressor, "indexer"):
                        hook(att.compressor.indexer.kv_norm, self._mark("ik"))
                        hook(att.compressor.indexer.q_b_proj, self._mark("iq"))
        if self.perturb is not None:
            hook(m.embed_tokens, lambda _m, _i, out: self.perturb(out))
        rec = self.rec
        if rec is not None:
            for l, layer in enumerate(m.layers):
                if rec.hc_positions is not None:
                    rec.hc.append([None, None])
                    pos = list(rec.hc_positions)

                    def pre_ffn(_m, inputs, l=l, pos=pos):
                        rec.hc[l][0] = inputs[0][0, pos].detach().clone()

                    def post_layer(_m, _inputs, out, l=l, pos=pos):
                        rec.hc[l][1] = out[0, pos].detach().clone()

                    self.handles.append(layer.ffn_hc.register_forward_pre_hook(pre_ffn))
                    hook(layer, post_layer)
                if rec.experts:
                    def gate_out(_m, _i, out, l=l):
                        rec.expert_ids[l] = out[2].detach().clone()
                    hook(layer.mlp.gate, gate_out)
                comp = layer.self_attn.compressor
                if rec.indexer and comp is not None and hasattr(comp, "indexer"):
                    def idx_out(_m, _i, out, l=l):
                        rec.indexer_ids[l] = out[0].detach().clone()
                    hook(comp.indexer, idx_out)
                if rec.gaps and not layer.mlp.is_hash:
                    def router_gap(mod, _i, out, l=l):
                        sel = ds4_softplus(out[0]).sqrt() + mod.e_score_correction_bias
                        v = torch.sort(sel, dim=-1, descending=True).values
                        rec.router_gap[l] = (v[:, mod.top_k - 1] - v[:, mod.top_k]).clone()
                    hook(layer.mlp.gate, router_gap)
                if rec.gaps and comp is not None and hasattr(comp, "indexer"):
                    idx = comp.indexer

                    def scorer_gap(_m, _i, out, l=l, idx=idx):
                        sc = out[0]  # [S, T] scores before the causal mask
                        s_len, t_len = sc.shape
                        n_vis = (torch.arange(s_len) + 1) // idx.compress_rate
                        k = idx.index_topk
                        gap = torch.full((s_len,), float("nan"), dtype=torch.float64)
                        for t in range(s_len):
                            if n_vis[t] > k:
                                v = torch.sort(sc[t, : n_vis[t]], descending=True).values
                                gap[t] = float(v[k - 1] - v[k])
                        rec.indexer_gap[l] = gap
                    hook(idx.scorer, scorer_gap)
                if rec.attention:
                    def attn_out(_m, _i, out, l=l):
                        w = out[1][0].detach()  # [H, T, K] probabilities (sink dropped)
                        n_vis = (w > 0).sum(-1).clamp(min=2).to(w.dtype)
                        ent = -(w * torch.log(w.clamp(min=1e-300))).sum(-1)
                        rec.attn_entropy[l] = (ent / torch.log(n_vis)).clone()
                    hook(layer.self_attn, attn_out)
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        for owner, name, value in reversed(self.saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        if exc[0] is None and self.pending is not None:
            raise RuntimeError(f"rounding role {self.pending[0]} left pending")
        self.pending = None
        return False


# ---------------------------------------------------------------------------------------
# The reference


class Reference:
    """A model loaded into transformers' DeepseekV4ForCausalLM: a GGUF (this constructor), or
    any `DeepseekV4Config` and state dict (`from_state_dict`, e.g. an official checkpoint read
    by checkpoint_reference.py)."""

    def __init__(self, gguf_path, dtype=torch.float64, numerics="plain", exact64=None,
                 hash_file=True):
        reader = gguf.GGUFReader(str(gguf_path))
        meta = read_metadata(reader)
        names = {t.name for t in reader.tensors}
        config, extra = build_config(meta, names)
        sd, types = build_state_dict(reader)
        del reader
        info = ModelInfo(
            path=str(gguf_path),
            sha256=sha256_file(gguf_path) if hash_file else "",
            n_rot=extra["n_rot"],
            head_dim=config.head_dim,
            index_head_dim=config.index_head_dim,
            compress_ratios=extra["ratios"],
            layer_types=extra["layer_types"],
            n_hash_layers=extra["n_hash"],
            tensor_types=types,
            metadata={k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.")},
        )
        self._load(config, sd, info, dtype, numerics, exact64)

    @classmethod
    def from_state_dict(cls, config, sd, info, dtype=torch.float64, numerics="plain",
                        exact64=None):
        """The reference on `config` (with `_attn_implementation` and
        `_experts_implementation` "eager") and the transformers state dict `sd` (floating
        tensors in any dtype, converted to `dtype`; checked strictly, as for a GGUF); `info`
        is the `ModelInfo` to keep (its `n_rot` is the rotary width the rounding hooks use)."""
        self = cls.__new__(cls)
        self._load(config, dict(sd), info, dtype, numerics, exact64)
        return self

    def _load(self, config, sd, info, dtype, numerics, exact64):
        self.dtype = dtype
        self.numerics = numerics
        self.exact64 = (dtype == torch.float64) if exact64 is None else exact64
        if self.exact64 and dtype != torch.float64:
            raise ValueError("exact64 needs float64")
        self.config = config
        torch.manual_seed(0)  # the init values are all overwritten; keep them reproducible anyway
        model = tfm.DeepseekV4ForCausalLM(self.config)
        model = model.to(dtype)
        model.eval()
        expected = model.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        if missing or unexpected:
            raise KeyError(f"state dict mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(expected[k].shape):
                raise ValueError(f"{k}: the source gives {tuple(v.shape)}, transformers wants {tuple(expected[k].shape)}")
            if expected[k].is_floating_point():
                sd[k] = v.to(dtype)
        model.load_state_dict(sd, strict=True)
        for k, v in model.state_dict().items():
            if v.is_floating_point() and v.dtype != dtype:
                raise TypeError(f"{k} is {v.dtype} after loading")
        self.model = model
        self.info = info
        self._check_rope()

    def _check_rope(self):
        """Our float64 RoPE frequencies must match transformers' float32 ones."""
        rot = self.model.model.rotary_emb
        for lt in ("main", "compress"):
            ours = yarn_inv_freq64(self.config, lt)
            theirs = getattr(rot, f"{lt}_inv_freq").to(torch.float64)
            rel = ((ours - theirs).abs() / ours).max().item()
            if rel > 1e-6:
                raise AssertionError(f"RoPE {lt}: float64 frequencies differ from transformers by {rel}")

    def set_dtype(self, dtype, exact64=None):
        """Converts the loaded model (weights came from float32 or narrower, so float64
        <-> float32 is lossless for them)."""
        self.model.to(dtype)
        self.dtype = dtype
        self.exact64 = (dtype == torch.float64) if exact64 is None else exact64

    def patches(self, recorder=None, perturb=None, numerics=None):
        return Ds4Patches(self.model, self.info.n_rot, numerics or self.numerics, self.exact64,
                          recorder, perturb)

    @torch.inference_mode()
    def logits(self, ids, recorder=None, perturb=None, last_only=False) -> torch.Tensor:
        """Logits [T, V] (or [1, V] with last_only) in the model dtype."""
        input_ids = torch.tensor([list(ids)], dtype=torch.long)
        with self.patches(recorder, perturb):
            out = self.model(input_ids=input_ids, use_cache=False,
                             logits_to_keep=1 if last_only else 0)
        return out.logits[0]


# ---------------------------------------------------------------------------------------
# Per-position summaries


def summarize(logits: torch.Tensor, top: int = 20) -> dict:
    """Per position: top-`top` ids and float64 log-probs (log-softmax over the whole
    vocabulary), argmax, top1 - top2 logit margin, logsumexp. Ties: lowest id first."""
    lg = logits.to(torch.float64)
    lse = torch.logsumexp(lg, dim=-1)
    vals, idx = torch.sort(lg, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :top], idx[:, :top]
    lp = vals - lse[:, None]
    return {
        "top_ids": idx.tolist(),
        "top_logprobs": lp.tolist(),
        "argmax": idx[:, 0].tolist(),
        "margin": (vals[:, 0] - vals[:, 1]).tolist(),
        "logsumexp": lse.tolist(),
    }


def parse_dtype(s):
    return {"float32": torch.float32, "f32": torch.float32, "float64": torch.float64,
            "f64": torch.float64}[s]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="ds4 GGUF file")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--numerics", default="plain", choices=["plain", "model"],
                    help="plain: transformers' graph; model: plus ds4's FP8/f16/FP4 rounding steps")
    ap.add_argument("--no-exact64", action="store_true",
                    help="float64 only: keep transformers' internal float32 steps")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="comma-separated token ids (include BOS yourself)")
    src.add_argument("--text", help="prompt text, tokenized with --tokenizer after a BOS")
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "tests/data/deepseek-v4-tokenizer.json"))
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("-o", "--out", help="output JSON (default stdout)")
    a = ap.parse_args()

    dtype = parse_dtype(a.dtype)
    ref = Reference(a.gguf, dtype, a.numerics, exact64=False if a.no_exact64 else None)
    if a.ids is not None:
        ids = [int(x) for x in a.ids.split(",") if x.strip()]
    else:
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(a.tokenizer)
        bos = tok.token_to_id("<｜begin▁of▁sentence｜>")
        ids = [bos] + tok.encode(a.text, add_special_tokens=False).ids
    res = {
        "gguf": a.gguf, "gguf_sha256": ref.info.sha256, "dtype": a.dtype, "numerics": a.numerics,
        "exact64": ref.exact64, "ids": ids, **summarize(ref.logits(ids), a.top),
    }
    text = json.dumps(res)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
