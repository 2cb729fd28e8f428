#!/usr/bin/env python3
"""Validates model outputs against their JSON schemas (tests/structured_output.rs).

Reads a JSON file: a list of {"name", "schema", "text"}. Each text must parse
as JSON and be valid under its schema by the Python `jsonschema` package
(draft 2020-12, string formats checked with its FormatChecker). Prints one
line per failure and exits 1 if there is any; prints the count otherwise.

Usage: python3 tools/check_json_outputs.py FILE
"""

import json
import sys

import jsonschema


# The formats of tests/data/structured_schemas.json; `date-time` and `time`
# are checked only when rfc3339-validator is installed (the
# `format-nongpl` extra), so a missing checker fails here, loudly.
FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6"]


def main():
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    missing = [f for f in FORMATS if f not in checker.checkers]
    if missing:
        sys.exit(f"jsonschema cannot check formats {missing}: pip install 'jsonschema[format-nongpl]'")
    cases = json.load(open(sys.argv[1]))
    bad = 0
    for c in cases:
        try:
            value = json.loads(c["text"])
        except ValueError as e:
            print(f"{c['name']}: not JSON ({e}): {c['text']!r}")
            bad += 1
            continue
        v = jsonschema.Draft202012Validator(
            c["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        errs = list(v.iter_errors(value))
        if errs:
            print(f"{c['name']}: {errs[0].message}: {c['text']!r}")
            bad += 1
    if bad:
        sys.exit(1)
    print(f"{len(cases)} outputs valid")


if __name__ == "__main__":
    main()
