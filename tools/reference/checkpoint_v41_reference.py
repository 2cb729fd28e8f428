#!/usr/bin/env python3
"""The float64 V4.1 reference run on an official-format DeepSeek V4.1 checkpoint (issue 37).

V4.1's twin of `checkpoint_reference.py` (which it imports: the same safetensors
reader, E4M3 / E8M0 / packed E2M1 / BF16 decode, tensor sha256, recipe rounding and
conditioning figures). It reads the checkpoint folder DeepSeek publishes
(config.json with the text fields under `text_config`, the index, the shards) and its
`engram_tables.json` **on its own**, without ds4's reader, name map or GGUF writer,
and runs `v41_torch.Transformer` (torch float64, ported module by module from the
official `inference/model.py`) on the original weights, and on them rounded as
`--recipe q8` and `--recipe mxfp4` store them. The goldens it writes are what
`ds4-quantize --hf`'s V4.1 output must reproduce (tests/convert_reference.rs).

    python3 tools/checkpoint/make_checkpoint.py --model v41 --tame --vocab 512 --out /tmp/ck41
    python3 tools/reference/checkpoint_v41_reference.py --checkpoint /tmp/ck41 [--out-dir tests/golden]

writes `checkpoint-v41-tame.plain-f64.json` (the checkpoint's values, every logit) and
`checkpoint-v41-tame-{q8,mxfp4}.plain-f64.json` (rounded by recipe, top 20) into --out-dir.

What is read here, each from its own description:

* the names: the official `inference/model.py` module tree of V4.1 (`embed`,
  `layers.L.{hc_attn_*, hc_ffn_*, attn_norm, ffn_norm}`, `attn.{attn_sink, wq_a, q_norm,
  wq_b, wkv, kv_norm, wo_a, wo_b}`, `attn.compressor.{wkv, wgate, norm}` on kv-source
  layers, `attn.indexer.{wk, k_norm}` on kv sources and `attn.indexer.{wq_b,
  weights_proj}` on index sources, `ffn.gate.{weight, bias, bias_vl}`,
  `ffn.experts.X.w{1,2,3}`, `ffn.shared_experts.w{1,2,3}`, `engram.{embed.weight,
  embed.scale, wkv, q_weight, k_weight}` on Engram layers, `norm`, `head`) mapped onto
  the names v41_torch.py reads (its GGUF names: `blk.L.attn_q_a.weight`, ...). Written
  from the official code, not from ds4's converter (src/convert/layout.rs). The
  image-span router bias `ffn.gate.bias_vl` is read and decoded but used by no text
  position (the official `Gate` applies it under an image mask only); `mtp.*` is not
  part of the main model. Any other tensor nothing reads is an error, and so is a mapped
  tensor the reference does not read;
* the Engram tables: E4M3 `engram.embed.weight` [rows, head_dim] times its E8M0
  `engram.embed.scale` [rows, head_dim / 32] (one scale per 32 values of a row: the
  official `ParallelEngramEmbedding`), decoded with checkpoint_reference.py's tables;
* the hashing constants as the official `engram.py` derives them: the token map and the
  multipliers from `engram_tables.json` (tools/checkpoint/engram_tables.py: the official
  algorithm over the tokenizer and numpy's PCG64), checked against config.json
  (`engram_compressed_vocab_size` distinct ids, `vocab_size` entries, one odd multiplier
  per layer and n-gram order); the primes by the official search from
  `engram_vocab_size` (per layer and n-gram order from `engram_vocab_size - 1`, per head
  the next prime not taken before), checked to sum to `engram_num_embeddings`; the pad
  `token_map[engram_pad_token_id]`;
* the configuration: `text_config` as the official `ModelArgs` reads it (Python floats:
  the official code's values, not a GGUF's float32 ones).

The recipes' rounding: each tensor's class in docs/V41.md's tensor list / docs/TOOLS.md's
V4.1 types (attention projections, shared experts, head: Q8_0; embedding, HC mixers,
compressor and indexer matrices, Engram `wkv`: F16; norms, sinks, router and both biases,
HC scale/base, Engram `q_weight`/`k_weight`: F32), routed experts Q8_0 (`q8`) or unchanged
(`mxfp4`), the Engram tables copied (ds4 keeps their bytes).

Each golden is checkpoint_reference.py's (format `ds4-golden-v1`, one "prompt" of fixed
ids), with the checkpoint's `config.json`, a sha256 over its tensors and one of
`engram_tables.json`, the conditioning, and what the sparse parts did over the ids (rows
each compressor emitted, positions where the indexer kept a strict subset, positions where
the candidate blocks excluded rows, Engram rows that recur). A recipe's golden also marks,
per position, whether every discrete choice (experts, indexer rows, candidate blocks) is
the original weights' run's (`selection_as_original`), and lists the changes with the
original run's gap (`selection_changes`): the rounding tips near-ties, and there the logits
move by more than the smooth quantisation error.
"""

import argparse
import hashlib
import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import checkpoint_reference as CR  # noqa: E402
import make_v41_goldens as G  # noqa: E402
import v41_torch as T  # noqa: E402

CHECKPOINT_COMMAND = "make_checkpoint.py --model v41 --tame --vocab 512"
TABLES_FILE = "engram_tables.json"
STEM = "checkpoint-v41-tame"
RECIPE_TOP_K = 20
# The ids: BOS, then a fixed pseudo-random draw with one span repeated (so Engram n-grams
# recur). On the tiny V4.1 model (window 4, ratios 2 and 1, index top-k 3, candidate
# blocks 2 of 2 rows) 64 positions give the ratio-2 compressor 32 rows and the ratio-1
# one 64; the indexers keep 3 of more than 3 visible rows from position 3 (ratio 1) and 7
# (ratio 2) on, and the candidate blocks (4 rows) exclude rows from position 4 on.
N_IDS = 64
IDS_SEED = 41
REPEAT = (slice(40, 48), slice(8, 16))

# ---------------------------------------------------------------------------------------
# Official names -> the names v41_torch.py reads (the official inference/model.py module
# tree on the left; v41_torch.py's, ds4's GGUF names, on the right)

GLOBAL_NAMES = {
    "embed.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "head.weight": "output.weight",
}
LAYER_NAMES = {  # under layers.L. -> under blk.L.
    "hc_attn_fn": "hc_attn_fn.weight",
    "hc_attn_base": "hc_attn_base.weight",
    "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight",
    "hc_ffn_base": "hc_ffn_base.weight",
    "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "attn.attn_sink": "attn_sinks.weight",
    "attn.wq_a.weight": "attn_q_a.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wq_b.weight": "attn_q_b.weight",
    "attn.wkv.weight": "attn_kv.weight",
    "attn.kv_norm.weight": "attn_kv_a_norm.weight",
    "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wk.weight": "indexer.attn_k.weight",
    "attn.indexer.k_norm.weight": "indexer.k_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight",
    "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.bias_vl": None,  # image spans only: decoded, used by no text position
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "engram.wkv.weight": "engram_kv.weight",
    "engram.q_weight": "engram_q_norm.weight",
    "engram.k_weight": "engram_k_norm.weight",
}
EXPERT = re.compile(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight")
EXPERT_NAMES = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}
TABLE = re.compile(r"layers\.(\d+)\.engram\.embed\.weight")
TABLE_BLOCK = 32  # one E8M0 scale per 32 values of a row

# The published mixes' type per class (docs/V41.md "Tensors", docs/TOOLS.md's V4.1 types).
RECIPES = {
    "q8": {"routed": "Q8_0", "matrix": "Q8_0", "table": "F16", "vector": "F32"},
    "mxfp4": {"routed": "exact", "matrix": "Q8_0", "table": "F16", "vector": "F32"},
}


def tensor_class(name: str) -> str:
    """The class of official tensor `name` (routed experts aside)."""
    if (name == "head.weight" or re.search(r"\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b)\.weight$", name)
            or ".ffn.shared_experts." in name):
        return "matrix"
    if (name == "embed.weight" or re.search(r"hc_(attn|ffn)_fn$", name)
            or re.search(r"\.attn\.compressor\.(wkv|wgate)\.weight$", name)
            or re.search(r"\.attn\.indexer\.(wk|wq_b|weights_proj)\.weight$", name)
            or name.endswith(".engram.wkv.weight")):
        return "table"
    # Vectors, and the two-dimensional F32 ones: the router and the Engram norms.
    return "vector"


def engram_table(name: str, tensors: dict) -> np.ndarray:
    """Table `name`'s values: E4M3 [rows, hd] times E8M0 `.scale` [rows, hd / 32]."""
    dtype, shape, data = tensors[name]
    sname = name[: -len(".weight")] + ".scale"
    sdt, sshape, sdata = tensors[sname]
    if dtype != "F8_E4M3" or sdt != "F8_E8M0" or sshape != [shape[0], shape[1] // TABLE_BLOCK]:
        raise ValueError(f"{name}: {dtype} {shape} with {sname} {sdt} {sshape}")
    codes = CR.E4M3[np.frombuffer(data, dtype=np.uint8).reshape(shape)]
    scale = CR.E8M0[np.frombuffer(sdata, dtype=np.uint8).reshape(sshape)]
    CR.refuse_nan(name, "E4M3", codes)
    CR.refuse_nan(sname, "E8M0", scale)
    return codes * np.repeat(scale, TABLE_BLOCK, axis=1)


def state_dict(config: dict, tensors: dict):
    """(reference name -> float64 tensor, reference name -> Engram table rows, reference name
    -> class, dtype counts, names read but used by no text position)."""
    block = config["quantization_config"]["weight_block_size"]
    if block[0] != block[1]:
        raise ValueError(f"weight_block_size {block}: square blocks expected")
    block = block[0]
    c = config["text_config"]
    sd, tables, classes, experts, used, unused = {}, {}, {}, {}, set(), []
    dtypes = {}
    for name, (dtype, _, _) in tensors.items():
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        if name.startswith("mtp.") or name.endswith(".scale"):
            continue
        m = EXPERT.fullmatch(name)
        if m:
            experts.setdefault(int(m[1]), {}).setdefault(m[3], {})[int(m[2])] = CR.decode(name, tensors, block)
            used.add(name)
            continue
        m = TABLE.fullmatch(name)
        if m:
            tables[f"blk.{m[1]}.engram_embd.weight"] = torch.from_numpy(engram_table(name, tensors))
            used.update([name, name[: -len(".weight")] + ".scale"])
            continue
        if name in GLOBAL_NAMES:
            target = GLOBAL_NAMES[name]
        else:
            parts = name.split(".", 2)
            if parts[0] != "layers" or len(parts) != 3 or parts[2] not in LAYER_NAMES:
                raise KeyError(f"checkpoint tensor {name}: not a tensor of the official V4.1 model")
            target = LAYER_NAMES[parts[2]] and f"blk.{parts[1]}.{LAYER_NAMES[parts[2]]}"
        values = CR.decode(name, tensors, block)
        used.add(name)
        if target is None:
            unused.append(name)
            continue
        sd[target] = torch.from_numpy(values)
        classes[target] = tensor_class(name)
    n_exp = c["n_routed_experts"]
    for layer, ws in experts.items():
        for w, target in EXPERT_NAMES.items():
            if sorted(ws.get(w, {})) != list(range(n_exp)):
                raise KeyError(f"layer {layer}: experts of {w}: {sorted(ws.get(w, {}))}")
            key = f"blk.{layer}.{target}"
            sd[key] = torch.from_numpy(np.stack([ws[w][x] for x in range(n_exp)]))
            classes[key] = "routed"
    for name, (dtype, _, _) in tensors.items():
        if name.startswith("mtp.") or name in used:
            continue
        if dtype == "F8_E8M0" and name.endswith(".scale") and name[:-6] + ".weight" in used:
            continue
        raise KeyError(f"checkpoint tensor {name} ({dtype}): nothing reads it")
    for k, v in list(sd.items()) + list(tables.items()):
        if not torch.equal(v, v.to(torch.float32).to(torch.float64)):
            raise ValueError(f"{k}: a value not exact in float32 (the checkpoint's formats all are)")
    return sd, tables, classes, dtypes, sorted(unused)


# ---------------------------------------------------------------------------------------
# The Engram hashing constants, as the official engram.py derives them


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def bucket_primes(c: dict) -> list:
    """Per Engram layer, per n-gram order 2..max, per head: the next prime above the
    previous one (from engram_vocab_size - 1 at each order), skipping every prime taken
    before in any layer. Layer-major, order, head (the hashing's column order)."""
    seen, out = set(), []
    for _ in c["engram_layer_ids"]:
        for _ in range(2, c["engram_max_ngram_size"] + 1):
            cur = c["engram_vocab_size"] - 1
            for _ in range(c["engram_n_heads"]):
                cur += 1
                while not is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                out.append(cur)
    cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
    rows = [sum(out[i * cols:(i + 1) * cols]) for i in range(len(c["engram_layer_ids"]))]
    if rows != list(c["engram_num_embeddings"]):
        raise ValueError(f"the prime search gives {rows} rows, config.json engram_num_embeddings "
                         f"{c['engram_num_embeddings']}")
    return out


def meta(c: dict, tables: dict) -> dict:
    """v41_torch.Args' and NgramHash's values from text_config and engram_tables.json."""
    token_map, mults = tables["token_map"], tables["multipliers"]
    if len(token_map) != c["vocab_size"]:
        raise ValueError(f"{TABLES_FILE}: {len(token_map)} token ids, vocab_size {c['vocab_size']}")
    if len(set(token_map)) != c["engram_compressed_vocab_size"] or max(token_map) + 1 != len(set(token_map)):
        raise ValueError(f"{TABLES_FILE}: token map of {len(set(token_map))} ids, "
                         f"engram_compressed_vocab_size {c['engram_compressed_vocab_size']}")
    want = len(c["engram_layer_ids"]) * c["engram_max_ngram_size"]
    if len(mults) != want or any(m % 2 == 0 or m <= 0 for m in mults):
        raise ValueError(f"{TABLES_FILE}: {len(mults)} multipliers, {want} odd ones expected")
    out = {k: c[k] for k in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "qk_rope_head_dim",
        "sliding_window", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
        "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer_id",
        "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
        "rms_norm_eps", "n_routed_experts", "num_experts_per_tok", "norm_topk_prob", "swiglu_limit",
        "routed_scaling_factor", "o_groups", "o_lora_rank", "rope_theta", "compress_rope_theta")}
    for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
        out[f"rope_scaling.{k}"] = c["rope_scaling"][k]
    out["engram.layer_ids"] = c["engram_layer_ids"]
    out["engram.token_map"] = token_map
    out["engram.multipliers"] = mults
    out["engram.primes"] = bucket_primes(c)
    out["engram.pad_id"] = token_map[c["engram_pad_token_id"]]
    if c["scoring_func"] != "sqrtsoftplus" or c.get("n_shared_experts", 1) != 1:
        raise ValueError("sqrtsoftplus scores and one shared expert expected")
    return out


# ---------------------------------------------------------------------------------------


def fixed_ids(vocab: int) -> list:
    r = random.Random(IDS_SEED)
    body = [r.randrange(vocab) for _ in range(N_IDS - 1)]
    body[REPEAT[0]] = body[REPEAT[1]]
    return [0] + body


def selection(trace: dict, args, n: int) -> dict:
    """What the sparse parts did over the n positions (every figure from the reference's
    trace): compressed rows, positions where an indexer kept a strict subset of the rows it
    could see, positions where the candidate blocks left rows out, Engram rows that recur."""
    ratios = args.compress_ratios
    out = {"compressed_rows": {str(L): n // ratios[L] for L in args.kv_source_layers}}
    strict = {}
    for L, rows in trace["topk"].items():
        visible = [(t + 1) // ratios[L] for t in range(n)]
        strict[str(L)] = sum(1 for t, r in enumerate(rows) if 0 < len([j for j in r if j >= 0]) < visible[t])
    out["indexer_strict_subset_positions"] = strict
    cand = {}
    for L, mask in trace["candidates"].items():
        cand[str(L)] = sum(1 for t, row in enumerate(mask)
                           if int(row[: (t + 1) // ratios[L]].sum()) < (t + 1) // ratios[L])
    out["candidate_blocks_exclude_positions"] = cand
    rows = trace["engram_rows"].reshape(n, -1)
    out["engram_rows_distinct"] = int(len({int(x) for x in rows.flatten()}))
    out["engram_rows"] = int(rows.size)
    out["distinct_expert_sets"] = {str(L): len({tuple(sorted(e)) for e in v})
                                   for L, v in trace["experts"].items()}
    return out


def selection_changes(orig: dict, tr: dict, n: int) -> tuple[list, list]:
    """(per position: every discrete choice equals the original weights' run, the changes
    with the original run's gap). The choices: each layer's experts, each indexer's kept
    rows, the candidate blocks."""
    same, changes = [True] * n, []
    for L, v in orig["experts"].items():
        for t in range(n):
            if sorted(v[t]) != sorted(tr["experts"][L][t]):
                same[t] = False
                changes.append({"position": t, "what": f"experts of layer {L}", "original": v[t],
                                "rounded": tr["experts"][L][t], "gap": orig["router_gap"][L][t]})
    for L, v in orig["topk"].items():
        for t in range(n):
            if v[t] != tr["topk"][L][t]:
                same[t] = False
                changes.append({"position": t, "what": f"indexer rows of layer {L}", "original": v[t],
                                "rounded": tr["topk"][L][t], "gap": orig["indexer_gap"][L][t]})
    for L, v in orig["candidates"].items():
        for t in range(n):
            if not np.array_equal(v[t], tr["candidates"][L][t]):
                same[t] = False
                changes.append({"position": t, "what": f"candidate blocks of layer {L}"})
    return same, sorted(changes, key=lambda x: x["position"])


def golden(source, ids, top, variant, weights, checkpoint, unused, original=None):
    """One golden document, and the run's trace. `original`: the original weights' trace,
    whose discrete choices a recipe's run is compared with."""
    ref = T.TorchReference(source, max_seq_len=len(ids) + 8)
    missing = sorted((set(source.tensors) | set(source.tables)) - source.read)
    if missing:
        raise KeyError(f"mapped tensors v41_torch.py does not read: {missing[:8]}")
    logits = ref.forward(ids)
    tr = ref.trace
    cond = CR.conditioning(torch.from_numpy(logits))
    if cond["top1_logprob_median"] - cond["uniform_logprob"] < 1.0 or cond["distinct_argmax"] < 4:
        raise SystemExit(f"{variant}: the run is near-trivial, not a useful golden: {cond}")
    n = len(ids)
    p = {"name": "ids", "ids": ids, "n_tokens": n}
    p.update(G.summarise(logits, top))
    p["router_gap"] = [min(v[t] for v in tr["router_gap"].values()) for t in range(n)]
    p["indexer_gap"] = G.gaps_of(tr, n)
    if original is not None:
        # Where a choice differs (a near-tie the rounding tipped) the logits move by more than
        # the smooth quantisation error; the test bounds the original weights' distance only
        # where every choice is the same.
        p["selection_as_original"], p["selection_changes"] = selection_changes(original, tr, n)
    doc = {
        "format": CR.FORMAT,
        "variant": variant,
        "weights": weights,
        "checkpoint": checkpoint,
        "reference": {
            "script": "tools/reference/checkpoint_v41_reference.py (name map, Engram constants) + "
                      "tools/reference/checkpoint_reference.py (reader, decode, recipe rounding) + "
                      "tools/reference/v41_torch.py (Transformer on a StateDict)",
            "dtype": "float64",
            "numerics": "plain",
            "topk_ties": "lowest index (stable sort on (-score, index))",
            "not_used": f"{unused}: the image-span router bias (no image positions)",
            "torch": torch.__version__,
            "gguf_py": __import__("importlib.metadata").metadata.version("gguf"),
            "ids": f"BOS 0 then {N_IDS - 1} ids of random.Random({IDS_SEED}).randrange(vocab), "
                   f"positions {REPEAT[0].start + 1}..{REPEAT[0].stop} repeating "
                   f"{REPEAT[1].start + 1}..{REPEAT[1].stop}",
        },
        "top_k": top,
        "conditioning": cond,
        "selection": selection(tr, ref.model.args, n),
        "prompts": [p],
    }
    return doc, tr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="official-format V4.1 checkpoint folder")
    ap.add_argument("--command", default=CHECKPOINT_COMMAND,
                    help="the make_checkpoint.py arguments that wrote it (recorded in the golden)")
    ap.add_argument("--out-dir", default=str(REPO / "tests/golden"),
                    help=f"where {STEM}.plain-f64.json and the recipes' goldens go")
    a = ap.parse_args()

    CR.self_test()
    folder = Path(a.checkpoint)
    config, tensors = CR.read_checkpoint(folder)
    if config.get("model_type") != "deepseek_v41" or "text_config" not in config:
        raise SystemExit(f"{folder}/config.json: not a DeepSeek V4.1 checkpoint")
    c = config["text_config"]
    tables_bytes = (folder / TABLES_FILE).read_bytes()
    values = meta(c, json.loads(tables_bytes))
    sd, engram, classes, dtypes, unused = state_dict(config, tensors)
    sha = CR.tensors_sha256(tensors)
    checkpoint = {
        "command": a.command,
        "script": "tools/checkpoint/make_checkpoint.py",
        "tensors_sha256": sha,
        "tensors_sha256_rule": "sha256 over tensors in name order of "
                               "'NAME DTYPE D0,D1,.. NBYTES\\n' then the bytes",
        "engram_tables_sha256": hashlib.sha256(tables_bytes).hexdigest(),
        "tensors": len(tensors),
        "dtypes": dict(sorted(dtypes.items())),
        "config": config,
        "engram_primes": values["engram.primes"],
        "engram_pad_id": values["engram.pad_id"],
    }
    ids = fixed_ids(c["vocab_size"])
    runs = [(f"{STEM}.plain-f64", "the checkpoint's values, exact", sd, c["vocab_size"])]
    for recipe in RECIPES:
        runs.append((f"{STEM}-{recipe}.plain-f64",
                     f"the checkpoint's values rounded as `--recipe {recipe}` stores them "
                     f"(docs/V41.md classes: {RECIPES[recipe]}; Q8_0 by gguf-py, F16 round to "
                     f"nearest even; Engram tables copied)",
                     CR.quantised(sd, classes, recipe, RECIPES), RECIPE_TOP_K))
    original = None
    for variant, weights, state, top in runs:
        source = T.StateDict(state, engram, values, c)
        doc, tr = golden(source, ids, top, variant, weights, checkpoint, unused, original)
        original = original or tr
        path = Path(a.out_dir) / f"{variant}.json"
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes): conditioning {doc['conditioning']}, "
              f"selection {doc['selection']}", flush=True)
        for ch in doc["prompts"][0].get("selection_changes", []):
            print(f"  choice changed by the rounding: {ch}", flush=True)


if __name__ == "__main__":
    main()
