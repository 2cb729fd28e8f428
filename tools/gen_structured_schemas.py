#!/usr/bin/env python3
"""The 50 JSON schemas of tests/structured_output.rs.

Writes tests/data/structured_schemas.json: a list of {"name", "schema"}.
Each schema is checked against the JSON-schema meta-schema (Python
`jsonschema`, draft 2020-12) so the fixture holds only valid schemas. They
cover what OpenAI structured output is used for: nested objects, enums and
consts, arrays with item bounds and tuples, required and optional fields,
string formats (date, time, date-time, email, uuid, ipv4, ipv6), string
lengths and patterns, integers and numbers with bounds, nullable fields,
anyOf, $defs/$ref (recursive too) and closed objects.

Free strings carry a maxLength and arrays a maxItems: the test model is
random, so without a bound an unlucky string could run to the token limit
(that case is covered by its own test: it ends as `length`).

Also writes tests/data/structured_schemas_open.json: 16 schemas as clients
write them (issue 39), with nothing bounded but free strings: integers and
numbers without minimum or maximum, arrays without maxItems, string formats
without maxLength, nesting, enums, $ref and recursion. ds4 bounds the
digits of a number and the length of a format where the schema does not
(docs/STRUCTURED_OUTPUT.md); the test checks that these answers end.

Usage: python3 tools/gen_structured_schemas.py [--out FILE] [--open-out FILE]
"""

import argparse
import json
import os

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def obj(props, required=None, closed=True):
    s = {"type": "object", "properties": props}
    s["required"] = list(props) if required is None else required
    if closed:
        s["additionalProperties"] = False
    return s


def string(max_len=12, **kw):
    return {"type": "string", "maxLength": max_len, **kw}


FORMATS = ["date", "time", "date-time", "email", "uuid", "ipv4", "ipv6"]


def schemas():
    out = []

    def add(name, schema):
        out.append({"name": name, "schema": schema})

    # 1-7: one string format each, required.
    for f in FORMATS:
        v = {"type": "string", "format": f}
        if f == "email":
            v["maxLength"] = 24  # the local part is unbounded otherwise
        add(f"format_{f}", obj({"value": v}))
    # 8-12: integers and numbers with bounds.
    add("int_range", obj({"n": {"type": "integer", "minimum": -5, "maximum": 17}}))
    add("int_exclusive", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000}}))
    add("number_range", obj({"x": {"type": "number", "minimum": 0.5, "maximum": 99.5}}))
    add("number_negative", obj({"x": {"type": "number", "minimum": -1000, "maximum": -1}}))
    add("ints_pair", obj({"lo": {"type": "integer", "minimum": 0, "maximum": 9},
                          "hi": {"type": "integer", "minimum": 10, "maximum": 99}}))
    # 13-17: enums, consts, booleans, null.
    add("enum_color", obj({"color": {"enum": ["red", "green", "blue"]}}))
    add("enum_mixed", obj({"v": {"enum": [1, "two", None, True, 3.5]}}))
    add("const_version", obj({"version": {"const": "v1"}, "ok": {"type": "boolean"}}))
    add("bool_and_null", obj({"flag": {"type": "boolean"}, "nothing": {"type": "null"}}))
    add("top_enum", {"enum": ["alpha", "beta", "gamma"]})
    # 18-23: arrays.
    add("array_ints", obj({"xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 50},
                                  "minItems": 1, "maxItems": 4}}))
    add("array_enum", obj({"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                    "minItems": 2, "maxItems": 3}}))
    add("array_objects", obj({"people": {"type": "array", "maxItems": 3, "items": obj({
        "name": string(8), "age": {"type": "integer", "minimum": 0, "maximum": 120}})}}))
    add("tuple_prefix", obj({"point": {"type": "array", "prefixItems": [
        {"type": "integer", "minimum": 0, "maximum": 9}, {"type": "integer", "minimum": 0, "maximum": 9},
        {"enum": ["N", "S"]}], "items": False}}))
    add("top_array", {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 5})
    add("array_dates", obj({"days": {"type": "array", "items": {"type": "string", "format": "date"},
                                     "minItems": 1, "maxItems": 2}}))
    # 24-29: required vs optional fields.
    add("optional_fields", obj({"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                "b": string(5), "c": {"type": "boolean"}}, required=["a"]))
    add("all_optional", obj({"x": {"type": "boolean"}, "y": {"type": "null"}}, required=[]))
    add("required_subset", obj({"id": {"type": "string", "format": "uuid"}, "note": string(6),
                                "rank": {"type": "integer", "minimum": 1, "maximum": 3}},
                               required=["id", "rank"]))
    add("many_required", obj({k: {"type": "integer", "minimum": 0, "maximum": 5} for k in "abcdef"}))
    add("pattern_properties", obj({"name": string(6)}) | {
        "patternProperties": {"^x[0-9]$": {"type": "boolean"}}, "maxProperties": 3})
    add("optional_nested", obj({"v": {"type": "integer", "minimum": 0, "maximum": 99},
                                "meta": obj({"k": {"enum": ["x", "y"]}, "on": {"type": "boolean"}})},
                               required=["v"]))
    # 30-34: strings with lengths and patterns.
    add("string_lengths", obj({"code": {"type": "string", "minLength": 3, "maxLength": 3}}))
    add("pattern_sku", obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}))
    add("pattern_hex", obj({"color": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}))
    add("short_strings", obj({"first": string(4), "last": string(4, minLength=1)}))
    add("empty_string_ok", obj({"s": string(0)}))
    # 35-40: nesting.
    add("nested_two", obj({"user": obj({"name": string(6), "email": {"type": "string", "format": "email", "maxLength": 24}})}))
    add("nested_three", obj({"a": obj({"b": obj({"c": {"type": "integer", "minimum": 0, "maximum": 3}})})}))
    add("nested_array_in_object", obj({"order": obj({
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": obj({
            "sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"},
            "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}})}))
    add("matrix", obj({"m": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}))
    add("event", obj({"title": string(10), "when": {"type": "string", "format": "date-time"},
                      "where": obj({"host": {"type": "string", "format": "ipv4"},
                                    "port": {"type": "integer", "minimum": 1, "maximum": 65535}}),
                      "level": {"enum": ["debug", "info", "warn"]}}))
    add("weather", obj({"city": string(10), "unit": {"enum": ["C", "F"]},
                        "temps": {"type": "array", "maxItems": 3,
                                  "items": {"type": "number", "minimum": -50, "maximum": 60}}}))
    # 41-45: nullable, anyOf, $ref.
    add("nullable_string", obj({"middle": {"type": ["string", "null"], "maxLength": 5}}))
    add("nullable_int", obj({"n": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}}))
    add("any_of", obj({"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                       {"type": "string", "format": "date"}, {"type": "boolean"}]}}))
    add("defs_ref", {"$defs": {"pt": obj({"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "y": {"type": "integer", "minimum": 0, "maximum": 9}})},
                     **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}})})
    add("recursive_tree", {"$defs": {"node": obj({
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}}, required=["v"])},
        "$ref": "#/$defs/node"})
    # 46-50: shapes clients send (tool-like arguments, extraction, classification).
    add("tool_args_bash", obj({"command": string(16), "timeout": {"type": "integer", "minimum": 1, "maximum": 600}},
                              required=["command"]))
    add("extraction", obj({"name": string(10), "born": {"type": "string", "format": "date"},
                           "emails": {"type": "array", "maxItems": 2, "items": {"type": "string", "format": "email", "maxLength": 20}},
                           "id": {"type": "string", "format": "uuid"}}))
    add("classification", obj({"label": {"enum": ["spam", "ham"]},
                               "confidence": {"type": "number", "minimum": 0, "maximum": 1}}))
    add("network", obj({"v4": {"type": "string", "format": "ipv4"}, "v6": {"type": "string", "format": "ipv6"},
                        "at": {"type": "string", "format": "time"}}))
    add("described", {"title": "Answer", "description": "annotations only",
                      **obj({"answer": {"type": "integer", "minimum": 0, "maximum": 100, "description": "the answer",
                                        "examples": [42]}})})
    return out


def open_schemas():
    """Hidden-style schemas: only free strings carry a bound (a random model
    that samples at temperature 1 rarely picks a closing quote out of the
    whole vocabulary; a real model closes its strings)."""
    out = []

    def add(name, schema):
        out.append({"name": name, "schema": schema})

    i, n, b = {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

    def fmt(f):
        return {"type": "string", "format": f}

    add("person", obj({"name": string(), "age": i, "email": fmt("email")}))
    add("product", obj({"id": i, "price": n, "tags": {"type": "array", "items": string()}, "in_stock": b}))
    add("order", obj({"order": obj({"id": i, "items": {"type": "array", "items": obj({
        "sku": string(8), "qty": i, "price": n})}}), "total": n}))
    add("status", obj({"status": {"enum": ["open", "closed", "pending"]}, "priority": i}))
    add("formats", obj({"day": fmt("date"), "at": fmt("date-time"), "clock": fmt("time"), "id": fmt("uuid")}))
    add("values", obj({"values": {"type": "array", "items": n}}))
    add("coords", obj({"lat": n, "lon": n}))
    add("score", obj({"score": n, "label": {"enum": ["good", "bad"]}}))
    add("tree", {"$defs": {"node": obj({"v": i, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                                        required=["v"])}, "$ref": "#/$defs/node"})
    add("matrix", obj({"m": {"type": "array", "items": {"type": "array", "items": i}}}))
    add("endpoint", obj({"host": fmt("hostname"), "ip": fmt("ipv4"), "port": i}))
    add("any_of", obj({"v": {"anyOf": [i, fmt("date"), n]}}))
    add("top_ints", {"type": "array", "items": i})
    add("mixed", obj({"count": i, "ratio": n, "flag": b, "note": {"type": ["string", "null"], "maxLength": 12}}))
    add("points", {"$defs": {"pt": obj({"x": n, "y": n})},
                   **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}})})
    add("event", obj({"title": string(), "when": fmt("date-time"),
                      "people": {"type": "array", "items": obj({"name": string(8), "age": i})}}))
    return out


def write_checked(fixture, count, path):
    """Writes `fixture` to `path` after checking that it holds `count` schemas,
    uniquely named, each valid under the draft 2020-12 meta-schema."""
    assert len(fixture) == count, len(fixture)
    assert len({s["name"] for s in fixture}) == count
    for s in fixture:
        jsonschema.Draft202012Validator.check_schema(s["schema"])
    with open(path, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {len(fixture)} schemas to {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/structured_schemas.json"))
    ap.add_argument("--open-out", default=os.path.join(ROOT, "tests/data/structured_schemas_open.json"))
    a = ap.parse_args()
    write_checked(schemas(), 50, a.out)
    write_checked(open_schemas(), 16, a.open_out)


if __name__ == "__main__":
    main()
