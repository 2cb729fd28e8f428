#!/usr/bin/env python3
"""Quantization quality of ds4-quantize beside llama.cpp's (issue 37).

    quant_quality.py --f32 F32.gguf --ours Q.gguf [--ours Q2.gguf ...]
                     --ggml /path/libggml-base.so --gguf-py /path/gguf-py
                     [--imatrix IM.gguf] [--json OUT.json]

For every tensor of each `--ours` file stored as IQ2_XXS, Q2_K or Q4_K, it
takes the same tensor's exact values from the `--f32` file (ds4-quantize's
`--recipe f32` output of the same checkpoint), quantizes them again with
ggml's own `ggml_quantize_chunk` (what `llama-quantize` calls for each
tensor, loaded from the peer's libggml-base.so by ctypes), and decodes both
with gguf-py's `gguf.quants.dequantize` (bit-exact with ggml). It prints,
per type, the RMSE of each against the f32 values, and the error weighted
by the importance (Σ_j w_j e_j² / Σ_j w_j, square-rooted) where an imatrix
is given: ours first, llama.cpp's beside it, and their ratio.

The importance of matrix e (an expert of a 3-D tensor, or the one matrix
of a 2-D one) is what both quantizers are given from `--imatrix` (llama.cpp's
imatrix GGUF: `NAME.in_sum2` [n_mat, n_cols] divided by `NAME.counts`
[n_mat]), as llama-quantize passes it to `ggml_quantize_chunk`. Without an
imatrix ggml refuses IQ2_XXS (it requires one); those rows say `n/a`.

The peer library comes from the llama.cpp source ../shared/peers/llamacpp.sh
uses (llama-cpp-python 0.3.36's vendored ggml-org/llama.cpp@0c1e57098):
`cmake -S vendor/llama.cpp/ggml -B build -DGGML_NATIVE=ON && cmake --build
build --target ggml-base` (bench/quant_quality.sh does it all).
"""

import argparse
import ctypes
import json
import sys

import numpy as np

TYPES = {"IQ2_XXS": 16, "Q2_K": 10, "Q4_K": 12}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--f32", required=True)
    ap.add_argument("--ours", action="append", required=True)
    ap.add_argument("--ggml", required=True, help="libggml-base.so")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--imatrix")
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf  # the peer's gguf-py, of the same commit as the library
    from gguf import quants

    lib = ctypes.CDLL(a.ggml)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    ref = {t.name: t for t in gguf.GGUFReader(a.f32).tensors}
    imat = {}
    if a.imatrix:
        im = {t.name: t for t in gguf.GGUFReader(a.imatrix).tensors}
        for name, t in im.items():
            if name.endswith(".in_sum2"):
                base = name[: -len(".in_sum2")]
                counts = np.asarray(im[base + ".counts"].data, dtype=np.float64).reshape(-1)
                s2 = np.asarray(t.data, dtype=np.float64).reshape(len(counts), -1)
                imat[base] = (s2 / np.maximum(counts, 1)[:, None]).astype(np.float32)

    # type -> [ours e², ggml e², ours w·e², ggml w·e², Σw, n values, tensors]
    acc = {}
    for path in a.ours:
        for t in gguf.GGUFReader(path).tensors:
            tname = t.tensor_type.name
            if tname not in TYPES:
                continue
            x = np.asarray(ref[t.name].data, dtype=np.float32)
            ne0 = int(t.shape[0])
            n_mat = int(np.prod(t.shape[2:])) if len(t.shape) > 2 else 1
            x = x.reshape(n_mat, -1, ne0)
            ours = quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(x.shape)
            w = imat.get(t.name)
            if a.imatrix and w is None:
                print(f"{t.name}: no imatrix entry, skipped", file=sys.stderr)
                continue
            tid = TYPES[tname]
            theirs = None
            if w is not None or tname != "IQ2_XXS":
                theirs = np.empty_like(x)
                rb = lib.ggml_row_size(tid, ne0)
                for e in range(n_mat):
                    src = np.ascontiguousarray(x[e])
                    dst = np.zeros(rb * src.shape[0], dtype=np.uint8)
                    imp = None if w is None else np.ascontiguousarray(w[e])
                    lib.ggml_quantize_chunk(
                        tid, src.ctypes.data, dst.ctypes.data, 0, src.shape[0], ne0,
                        None if imp is None else imp.ctypes.data,
                    )
                    qt = gguf.GGMLQuantizationType(tid)
                    theirs[e] = quants.dequantize(dst.reshape(src.shape[0], rb), qt)
            wt = np.ones((n_mat, 1, ne0), np.float64) if w is None else w[:, None, :].astype(np.float64)
            r = acc.setdefault(tname, [0.0, 0.0, 0.0, 0.0, 0.0, 0, 0])
            e_o = (ours.astype(np.float64) - x) ** 2
            r[0] += e_o.sum()
            r[2] += (e_o * wt).sum()
            if theirs is not None:
                e_t = (theirs.astype(np.float64) - x) ** 2
                r[1] += e_t.sum()
                r[3] += (e_t * wt).sum()
            else:
                r[1] = r[3] = float("nan")
            r[4] += float(np.broadcast_to(wt, x.shape).sum())
            r[5] += x.size
            r[6] += 1

    rows = []
    print(f"{'type':8} {'tensors':>7} {'values':>10}  {'rmse ours':>10} {'llama.cpp':>10} {'ratio':>6}"
          f"  {'w-rmse ours':>11} {'llama.cpp':>10} {'ratio':>6}")
    for tname, r in sorted(acc.items()):
        ro, rt = (r[0] / r[5]) ** 0.5, (r[1] / r[5]) ** 0.5
        wo, wt = (r[2] / r[4]) ** 0.5, (r[3] / r[4]) ** 0.5
        rows.append(dict(type=tname, tensors=r[6], values=r[5], rmse_ours=ro, rmse_llamacpp=rt,
                         wrmse_ours=wo, wrmse_llamacpp=wt, imatrix=bool(a.imatrix)))
        print(f"{tname:8} {r[6]:7d} {r[5]:10d}  {ro:10.5f} {rt:10.5f} {ro / rt:6.3f}"
              f"  {wo:11.5f} {wt:10.5f} {wo / wt:6.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
