#!/usr/bin/env python3
"""Every tensor of a GGUF file as gguf-py reads and decodes it, independently
of ds4's reader and decoders (tests/convert_write.rs, tests/convert_v41.rs;
docs/TOOLS.md "Tests"):

    python3 tools/gguf_tensor_digest.py FILE.gguf

prints one JSON object: `keys`, every metadata key's name and gguf-py value
type in file order; `tensors`, per tensor in file order its name, shape (GGUF
ne order), type name, and `f32_sha256`: the sha256 of its values decoded by
`gguf.quants.dequantize` to little-endian float32, row-major (I8/I32 tables
as their integers cast to float32, exactly). The test decodes every tensor
with ds4's own decoders and hashes the same bytes: equal digests mean the
two readers agree on every value of every tensor. Exits 3 without gguf-py.
"""

import hashlib
import json
import sys

try:
    import gguf
    import numpy as np
except ImportError as e:  # the test skips, saying why (exit 3)
    print(f"gguf-py is not installed ({e}; pip install gguf==0.19.0)", file=sys.stderr)
    sys.exit(3)


def decoded(t):
    qt = gguf.GGMLQuantizationType(t.tensor_type)
    data = np.asarray(t.data)
    if qt in (gguf.GGMLQuantizationType.I8, gguf.GGMLQuantizationType.I16,
              gguf.GGMLQuantizationType.I32, gguf.GGMLQuantizationType.I64):
        return data.astype(np.float32)
    return gguf.quants.dequantize(data, qt).astype(np.float32, copy=False)


def main():
    r = gguf.GGUFReader(sys.argv[1])
    keys = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue  # the reader's own header pseudo-fields
        keys.append([f.name, f.types[0].name if f.types else None])
    tensors = []
    for t in r.tensors:
        v = np.ascontiguousarray(decoded(t), dtype="<f4")
        tensors.append({
            "name": t.name,
            "ne": [int(x) for x in t.shape],
            "type": gguf.GGMLQuantizationType(t.tensor_type).name,
            "f32_sha256": hashlib.sha256(v.tobytes()).hexdigest(),
        })
    json.dump({"keys": keys, "tensors": tensors}, sys.stdout)


if __name__ == "__main__":
    main()
