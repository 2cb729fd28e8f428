#!/usr/bin/env python3
"""Build tests/data/pretokenizer_classes.txt.gz: how the reference
pre-tokenizer splits every code point in a few contexts.

For each selected code point c (all of U+0000..U+3FFFF and U+E0000..U+E0FFF
except surrogates, plus every code point divisible by 97 elsewhere) and each
context in CONTEXTS ("{}" replaced by c), the reference pre-tokenizer (HF
`tokenizers`, tests/data/deepseek-v4-tokenizer.json) splits the string; the
signature is the list of piece lengths in characters. Consecutive selected code
points with the same signature are stored as one line "FIRST LAST SIGNATURE"
(hex code points, contexts separated by ';', lengths by ',').

This pins the Unicode general categories, White_Space and the CJK ranges used
by src/tokenizer/pretokenize.rs to the ones of the reference (Unicode 16.0).

Usage: python3 tools/gen_pretokenizer_classes.py [OUT]
"""

import gzip
import os
import sys

from tokenizers import Tokenizer

CONTEXTS = ["a{}b", "a{}\n", " {}{}x", "{}\u0301a", ",{}.", "1{}2", "\u3042{}\u30a2", "{}", " {}"]


def selected(cp):
    if 0xD800 <= cp < 0xE000:
        return False
    return cp < 0x40000 or 0xE0000 <= cp < 0xE1000 or cp % 97 == 0


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data", "pretokenizer_classes.txt.gz")
    pt = Tokenizer.from_file(os.path.join(root, "tests", "data", "deepseek-v4-tokenizer.json")).pre_tokenizer
    lines = []
    run = None  # [first, last, sig]
    for cp in range(0x110000):
        if not selected(cp):
            continue
        ch = chr(cp)
        sig = ";".join(
            ",".join(str(e - b) for _, (b, e) in pt.pre_tokenize_str(ctx.replace("{}", ch)))
            for ctx in CONTEXTS)
        if run and run[2] == sig:
            run[1] = cp
        else:
            if run:
                lines.append(f"{run[0]:x} {run[1]:x} {run[2]}\n")
            run = [cp, cp, sig]
    lines.append(f"{run[0]:x} {run[1]:x} {run[2]}\n")
    with open(out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            gz.write("".join(lines).encode())
    print(f"{out}: {len(lines)} ranges, {os.path.getsize(out)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
