#!/usr/bin/env python3
"""Check or regenerate tests/data/v41-chat-vectors.json from the official
DeepSeek V4.1 chat encoder.

The vectors in the fixture were taken from other projects' published tests
of that encoder (each case names its source). This script re-derives them
from the encoder itself when a copy is at hand: the official
`encoding/encoding.py` of deepseek-ai/DeepSeek-V4.1-Flash (Hugging Face), or
a vendored copy such as sglang's `encoding_dsv41.py`. It is pure Python
(no torch): it only imports `encode_messages` from the file given.

    python3 tools/v41_chat_vectors.py --encoder PATH/encoding.py          # check
    python3 tools/v41_chat_vectors.py --encoder PATH/encoding.py --write  # regenerate

Each fixture request is an OpenAI chat body; it is mapped to the encoder's
messages the way ds4's server maps it (docs/V41.md § CLI and server): tools
ride on the first system message (an empty one is put first when there is
none); `reasoning_effort` "none" or `thinking: {"type": "disabled"}` is the
encoder's chat mode; otherwise thinking mode at the level ds4 names (a
number as given, "low" 50, "high" 75, "max" 100, default 75), passed to the
encoder as a number so that its own name table does not matter.

Without --encoder the script only checks that the fixture is well formed.
"""

import argparse
import copy
import importlib.util
import json
import pathlib
import sys

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests/data/v41-chat-vectors.json"
LEVELS = {"none": 0, "minimal": 50, "low": 50, "medium": 75, "high": 75, "xhigh": 75, "max": 100}


def level_of(req, default):
    th = req.get("thinking")
    if isinstance(th, dict) and th.get("type") == "disabled":
        return 0
    e = req.get("reasoning_effort")
    if e is None:
        return default
    if isinstance(e, int):
        return e
    return LEVELS[e]


def encoder_messages(req):
    msgs = copy.deepcopy(req["messages"])
    for m in msgs:
        for tc in m.get("tool_calls") or []:
            args = tc["function"]["arguments"]
            if isinstance(args, str):
                tc["function"]["arguments"] = json.loads(args)
    tools = req.get("tools")
    if tools:
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["tools"] = tools
        else:
            msgs.insert(0, {"role": "system", "content": "", "tools": tools})
    return msgs


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("v41_encoding", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.encode_messages


def render(encode, req, default):
    level = level_of(req, default)
    mode = "thinking" if level > 0 else "chat"
    kw = {"thinking_mode": mode}
    if level > 0:
        kw["reasoning_effort"] = level
    return encode(encoder_messages(req), **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", help="path of encoding.py (official) or a vendored copy")
    ap.add_argument("--write", action="store_true", help="rewrite the expected strings")
    a = ap.parse_args()
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for c in doc["cases"]:
        assert "request" in c and ("expected" in c or "expected_contains" in c), c["name"]
    if not a.encoder:
        print(f"{FIXTURE.name}: {len(doc['cases'])} cases, well formed (give --encoder to check bytes)")
        return 0
    encode = load_encoder(a.encoder)
    bad = 0
    for c in doc["cases"]:
        got = render(encode, c["request"], doc["default_level"])
        if "expected_from" in c:
            got = got[got.index(c["expected_from"]):]
        if "expected" in c:
            if got != c["expected"]:
                bad += 1
                print(f"{c['name']}: differs\n  fixture: {c['expected']!r}\n  encoder: {got!r}")
                if a.write:
                    c["expected"] = got
        for s in c.get("expected_contains", []):
            if s not in got:
                bad += 1
                print(f"{c['name']}: missing {s!r}")
        for s in c.get("expected_absent", []):
            if s in got:
                bad += 1
                print(f"{c['name']}: has {s!r}")
    if a.write:
        FIXTURE.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(doc['cases'])} cases, {bad} differences")
    return 1 if bad and not a.write else 0


if __name__ == "__main__":
    sys.exit(main())
