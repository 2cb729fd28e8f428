#!/usr/bin/env python3
"""The two Engram tables DeepSeek V4.1's `inference/engram.py` derives at run
time instead of storing them in the checkpoint, for `ds4-quantize --hf`
(docs/TOOLS.md, "V4.1"):

    engram_tables.py CHECKPOINT_DIR [-o FILE]   (default CHECKPOINT_DIR/engram_tables.json)

* `token_map`: every token id's compressed id (`build_compressed_token_map`:
  the id decoded alone, normalised NFKC, NFD, accents stripped, lowercased,
  whitespace runs to one space, a lone space kept, stripped; ids whose text
  has U+FFFD keyed by their raw token; equal keys share an id, numbered in
  first-seen order). Needs Hugging Face `tokenizers` (`pip install
  tokenizers`): its normalizers are the official ones, and ds4 has no Unicode
  normaliser of its own.
* `multipliers`: per Engram layer, `max_ngram` odd multipliers
  `numpy.random.default_rng(10007 * layer).integers(0, bound, max_ngram) * 2 + 1`
  with `bound = (INT64_MAX // compressed_vocab) // 2` (`build_multipliers`;
  numpy's PCG64 stream, which only numpy reproduces), layer-major.

The algorithms are those of the official code as the V4.1 converters
reproduce it (research note §2.5). The count of compressed ids must equal
`engram_compressed_vocab_size` in config.json (the official code asserts it:
every multiplier derives from it). The converter computes the rest itself
(the prime search, the rows, the pad id) and checks this file against
config.json and the tokenizer's size.
"""

import argparse
import json
from pathlib import Path

TABLES_FILE = "engram_tables.json"


def text_config(cfg):
    t = cfg.get("text_config")
    return t if isinstance(t, dict) else cfg


def token_map(tokenizer_json):
    """(lookup, compressed vocab size) of a tokenizer.json."""
    from tokenizers import Regex, Tokenizer, normalizers

    sentinel = "\ue000"  # keeps a single-space token from collapsing to the empty string
    normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(),
        normalizers.Replace(sentinel, " "),
    ])
    tok = Tokenizer.from_file(str(tokenizer_json))
    key_to_new, lookup = {}, []
    for token_id in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(token_id)
        else:
            normalized = normalizer.normalize_str(text)
            key = normalized if normalized else text
        lookup.append(key_to_new.setdefault(key, len(key_to_new)))
    return lookup, len(key_to_new)


def multipliers(layer_ids, max_ngram, compressed_vocab):
    import numpy as np

    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    out = []
    for layer_id in layer_ids:
        rng = np.random.default_rng(10007 * int(layer_id))
        draws = rng.integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64) * 2 + 1
        out += [int(x) for x in draws]
    return out


def tables(checkpoint):
    """The tables of the checkpoint folder `checkpoint` (config.json, tokenizer.json)."""
    d = Path(checkpoint)
    t = text_config(json.loads((d / "config.json").read_text()))
    lookup, n = token_map(d / "tokenizer.json")
    want = t.get("engram_compressed_vocab_size")
    if n != want:
        raise SystemExit(f"{d / 'tokenizer.json'}: {n} compressed ids, but config.json's "
                         f"engram_compressed_vocab_size is {want}")
    return {
        "token_map": lookup,
        "multipliers": multipliers(t["engram_layer_ids"], t["engram_max_ngram_size"], n),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    out = Path(a.out) if a.out else Path(a.checkpoint) / TABLES_FILE
    out.write_text(json.dumps(tables(a.checkpoint)) + "\n")


if __name__ == "__main__":
    main()
