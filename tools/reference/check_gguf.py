#!/usr/bin/env python3
"""Reads a ds4 GGUF with gguf-py as an outside reader would and reports anything odd.

Checks: every metadata field decodes and has the GGUF type GGUF.md §3 expects;
tensor data offsets are aligned, inside the file and non-overlapping; each tensor's
byte size matches its type and shape; every tensor dequantizes to finite values;
the tokenizer arrays have vocab_size entries; the tensor directory maps one to one
onto transformers' state dict (ds4_reference.build_state_dict). Prints per-tensor
statistics (std) so a wrong initialiser scale shows up.

    python3 tools/reference/check_gguf.py /tmp/ds4-goldens/tiny-f32.gguf
"""

import argparse
import os
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ds4_reference as R  # noqa: E402

VT = gguf.GGUFValueType
EXPECTED_TYPES = {
    "general.architecture": [VT.STRING],
    "deepseek4.attention.compress_ratios": [VT.ARRAY, VT.INT32],
    "deepseek4.swiglu_clamp_exp": [VT.ARRAY, VT.FLOAT32],
    "deepseek4.expert_weights_norm": [VT.BOOL],
    "deepseek4.rope.scaling.type": [VT.STRING],
    "tokenizer.ggml.model": [VT.STRING],
    "tokenizer.ggml.pre": [VT.STRING],
    "tokenizer.ggml.tokens": [VT.ARRAY, VT.STRING],
    "tokenizer.ggml.merges": [VT.ARRAY, VT.STRING],
    "tokenizer.ggml.token_type": [VT.ARRAY, VT.INT32],
    "tokenizer.ggml.bos_token_id": [VT.UINT32],
    "tokenizer.ggml.eos_token_id": [VT.UINT32],
}
F32_KEYS = {"attention.compress_rope_freq_base", "attention.layer_norm_rms_epsilon", "rope.freq_base",
            "rope.scaling.factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
            "expert_weights_scale", "hyper_connection.epsilon"}


def check(path: str, verbose: bool) -> list:
    problems = []
    r = gguf.GGUFReader(path)
    size = os.path.getsize(path)
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    for key, f in r.fields.items():
        try:
            f.contents()
        except Exception as e:  # noqa: BLE001
            problems.append(f"field {key}: cannot decode ({e})")
        want = EXPECTED_TYPES.get(key)
        if key.startswith("deepseek4.") and want is None:
            want = [VT.FLOAT32] if key[len("deepseek4."):] in F32_KEYS else [VT.UINT32]
        if want is not None and list(f.types) != want:
            problems.append(f"field {key}: type {[t.name for t in f.types]}, expected {[t.name for t in want]}")
    n_vocab = int(r.fields["deepseek4.vocab_size"].contents())
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        n = len(r.fields[key].data)
        if n != n_vocab:
            problems.append(f"{key}: {n} entries, vocab_size {n_vocab}")
    spans = []
    for t in r.tensors:
        if t.data_offset % align:
            problems.append(f"{t.name}: offset {t.data_offset} not {align}-aligned")
        bs, ts = gguf.GGML_QUANT_SIZES[t.tensor_type]
        ne = [int(x) for x in t.shape]
        if ne[0] % bs:
            problems.append(f"{t.name}: ne0 {ne[0]} not a multiple of the {t.tensor_type.name} block {bs}")
        want = int(np.prod(ne)) // bs * ts
        if t.n_bytes != want:
            problems.append(f"{t.name}: {t.n_bytes} bytes, expected {want}")
        spans.append((t.data_offset, t.data_offset + t.n_bytes, t.name))
        arr = R.dequantize(t)
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            problems.append(f"{t.name}: non-finite values")
        if verbose:
            a = arr.astype(np.float64)
            print(f"{t.name:40s} {t.tensor_type.name:8s} ne={ne} mean={a.mean():+.4f} std={a.std():.4f}")
    spans.sort()
    for (a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            problems.append(f"tensors {an} and {bn} overlap")
    if spans and spans[-1][1] > size:
        problems.append(f"{spans[-1][2]} ends at {spans[-1][1]}, file has {size} bytes")
    try:
        meta = R.read_metadata(r)
        cfg, _ = R.build_config(meta, {t.name for t in r.tensors})
        R.build_state_dict(r)
    except Exception as e:  # noqa: BLE001
        problems.append(f"transformers mapping: {e}")
    print(f"{path}: {len(r.fields)} fields, {len(r.tensors)} tensors, alignment {align}, "
          f"{len(problems)} problem(s)")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", nargs="+")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-tensor statistics")
    a = ap.parse_args()
    bad = 0
    for p in a.gguf:
        for msg in check(p, a.verbose):
            print("  " + msg)
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
