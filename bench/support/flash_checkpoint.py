#!/usr/bin/env python3
"""A Flash-width checkpoint of a few layers, in DeepSeek's official format,
for measuring `ds4-quantize --hf` (bench/convert_speed.sh, issue 37).

The tensors are those of `tools/checkpoint/make_checkpoint.py --model v4`
(its `v4_storage` name list and `v4_encode` random-but-finite encodings) at
the real V4 Flash widths (hidden 4096, 256 experts of 2048, 64 heads of 512,
vocabulary 129,280), with `--layers N` layers: layer 0 hash-routed and
window-only, then CSA (ratio 4) and HCA (ratio 128) layers as the release
alternates them. The MTP block is left out (the main conversion does not
read it). Unlike the script, tensors are written one at a time as they are
made, so memory stays at one tensor however large the checkpoint: one
layer is about 3.4 GB, the embedding and the head about 1 GB each.

    python3 bench/support/flash_checkpoint.py --out DIR [--layers 2]
"""

import argparse
import json
import math
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools/checkpoint"))
import make_checkpoint as mc  # noqa: E402

FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048,
    "num_attention_heads": 64, "num_key_value_heads": 1,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "q_lora_rank": 1024, "qk_rope_head_dim": 64, "head_dim": 512,
    "sliding_window": 128, "compress_rope_theta": 160000,
    "o_lora_rank": 1024, "o_groups": 8, "index_n_heads": 64, "index_head_dim": 128,
    "index_topk": 512, "num_hash_layers": 1, "hc_mult": 4, "hc_eps": 1e-6,
    "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "hidden_act": "silu", "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 0, "eos_token_id": 1,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "expert_dtype": "fp4",
}


def rand(seed, name, n, chunk=1 << 26):
    """`mc.rand` in chunks (one `randbytes` call is limited to 2^31 bits)."""
    r = mc.rng_for(seed, name)
    return b"".join(r.randbytes(min(chunk, n - i)) for i in range(0, n, chunk))


mc.rand = rand


def encoded(name, storage, shape, block):
    """(name, dtype, shape, bytes) of what `mc.v4_encode` writes for one tensor."""
    n = math.prod(shape)
    if storage in ("f32", "bf16", "i64"):
        dtype, size = {"f32": ("F32", 4), "bf16": ("BF16", 2), "i64": ("I64", 8)}[storage]
        return [(name, dtype, shape, size * n)]
    out, inp = shape
    sname = name[: -len(".weight")] + ".scale"
    if storage == "fp8":
        sshape = [-(-out // block), -(-inp // block)]
        return [(name, "F8_E4M3", shape, n), (sname, "F8_E8M0", sshape, math.prod(sshape))]
    sshape = [out, inp // 32]
    return [(name, "I8", [out, inp // 2], n // 2), (sname, "F8_E8M0", sshape, math.prod(sshape))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    c = dict(FLASH, num_hidden_layers=a.layers)
    c["compress_ratios"] = [0] + [4 if l % 2 else 128 for l in range(1, a.layers)] + [0]
    block = 128
    names = [t for t in mc.v4_storage(c) if not t[0].startswith("mtp.")]
    # One shard per layer, the embedding with layer 0 and the head with the last.
    def shard_of(name):
        if name.startswith("layers."):
            return int(name.split(".")[1])
        return 0 if name.startswith("embed") else a.layers - 1
    shards = [[t for t in names if shard_of(t[0]) == k] for k in range(a.layers)]
    weight_map, total = {}, 0
    for k, ts in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, storage, shape in ts:
            for tn, dtype, tshape, size in encoded(name, storage, shape, block):
                header[tn] = {"dtype": dtype, "shape": tshape, "data_offsets": [offset, offset + size]}
                offset += size
                weight_map[tn] = fname
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(out / fname, "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for name, storage, shape in ts:
                made = mc.v4_encode(a.seed, name, storage, shape, block, c["n_routed_experts"])
                for t, (_, _, _, size) in zip(made, encoded(name, storage, shape, block)):
                    assert len(t.data) == size, (t.name, len(t.data), size)
                    f.write(t.data)
        total += offset
        print(f"{fname}: {offset / 1e9:.2f} GB", file=sys.stderr)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    mc.write_tokenizer(out, mc.DEFAULT_TOKENIZER, c["vocab_size"])
    print(f"{out}: {total / 1e9:.2f} GB of tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
