#!/usr/bin/env python3
"""llama.cpp's GGUF imatrix files through gguf-py, independently of ds4's Rust
reader and writer (tests/convert_imatrix.rs; docs/TOOLS.md "imatrix").

    python3 tools/imatrix_gguf.py write OUT.gguf --entry NAME:N_COLS:N_MAT [...]
            [--empty NAME:MAT] [--dataset D] [--chunk-count N] [--chunk-size N]
    python3 tools/imatrix_gguf.py dump FILE.gguf

`write` names and shapes everything as llama.cpp's `llama-imatrix` does
(tools/imatrix/imatrix.cpp, IMatrixCollector::save_imatrix): the key
`general.type` = "imatrix", `imatrix.datasets` (array of strings),
`imatrix.chunk_count` and `imatrix.chunk_size` (u32), then per entry in name
order `NAME.in_sum2` (F32, ne [n_cols, n_mat]) and `NAME.counts` (F32, ne
[1, n_mat]). The values follow a formula the test repeats:
    in_sum2[m][j] = (j % 11) + 0.5 * m + 0.125
    counts[m]     = 4 * (m + 1), or 0 for the matrices given by --empty
(all exact in f32). gguf-py's writer always adds `general.architecture`;
llama-imatrix writes no such key, so it is removed before writing.

`dump` prints, as JSON, every key with its gguf-py value type and value, and
every tensor's name, shape (GGUF ne order) and type, read with GGUFReader:
the test checks the files ds4 writes with it.
"""

import argparse
import json
import sys

import numpy as np

try:
    import gguf
except ImportError:  # the test skips, saying why
    print("gguf-py is not installed (pip install gguf)", file=sys.stderr)
    sys.exit(3)


def write(args):
    w = gguf.GGUFWriter(args.out, arch="")
    w.kv_data[0].pop(gguf.Keys.General.ARCHITECTURE, None)
    w.add_type(gguf.GGUFType.IMATRIX)
    w.add_array(gguf.Keys.IMatrix.DATASETS, args.dataset)
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_COUNT, args.chunk_count)
    w.add_uint32(gguf.Keys.IMatrix.CHUNK_SIZE, args.chunk_size)
    empty = {}
    for e in args.empty:
        name, m = e.rsplit(":", 1)
        empty.setdefault(name, set()).add(int(m))
    entries = []
    for e in args.entry:
        name, n_cols, n_mat = e.rsplit(":", 2)
        entries.append((name, int(n_cols), int(n_mat)))
    for name, n_cols, n_mat in sorted(entries):
        j = np.arange(n_cols, dtype=np.float32)
        sums = np.stack([(j % 11) + np.float32(0.5 * m + 0.125) for m in range(n_mat)])
        counts = np.array(
            [[0.0 if m in empty.get(name, ()) else 4.0 * (m + 1) for m in range(n_mat)]],
            dtype=np.float32,
        )
        # numpy shape (n_mat, n_cols) is GGUF ne [n_cols, n_mat].
        w.add_tensor(name + ".in_sum2", sums.astype(np.float32))
        w.add_tensor(name + ".counts", counts.reshape(n_mat, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dump(args):
    r = gguf.GGUFReader(args.file)
    kv = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [t.name for t in f.types]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            value = [f.contents(i) for i in range(len(f.data))]
        else:
            value = f.contents()
        kv[name] = {"types": types, "value": value}
    tensors = [
        {
            "name": t.name,
            "ne": [int(x) for x in t.shape],
            "type": t.tensor_type.name,
            "data": [float(x) for x in np.asarray(t.data, dtype=np.float32).reshape(-1)],
        }
        for t in r.tensors
    ]
    json.dump({"kv": kv, "tensors": tensors}, sys.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pw = sub.add_parser("write")
    pw.add_argument("out")
    pw.add_argument("--entry", action="append", default=[])
    pw.add_argument("--empty", action="append", default=[])
    pw.add_argument("--dataset", action="append", default=[])
    pw.add_argument("--chunk-count", type=int, default=0)
    pw.add_argument("--chunk-size", type=int, default=512)
    pd = sub.add_parser("dump")
    pd.add_argument("file")
    a = p.parse_args()
    if a.cmd == "write":
        write(a)
    else:
        dump(a)


if __name__ == "__main__":
    main()
