#!/usr/bin/env python3
"""The picture of the imports: which room of src/ names which.

A *room* is a top-level module of the library (a file at the src/ root or a
folder drawn as one) or `bin` for the binaries. The *flow order* is the
order in which `src/lib.rs` declares the modules (`pub mod X;`), followed
by `bin`; an arrow from a room to one declared after it runs against the
flow. A *circle* is rooms, or sibling files inside one folder, that import
each other in a loop. A child naming its own parent (`super::X` from a file
to its folder's `mod.rs`) is Rust's ordinary parent/child shape and is not
counted as a circle.

Reads `use` lines and inline `crate::`/`super::`/`ds4::` paths (comments
and string literals removed first), follows `pub use` re-exports to the file
that defines the name, then

  * writes the room graph as Graphviz DOT (default docs/imports.dot);
  * prints each circle and each arrow against the flow, and exits 1 if
    there is any.

Standard library only. Usage:  python3 tools/imports.py [--dot FILE]
"""

import argparse
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")


def strip(text):
    """Source text without comments, string and char literals."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or (c == "'" and re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if "{" in s:
            head, rest = s.split("{", 1)
            rest = rest[: rest.rfind("}")]
            head = [p for p in head.split("::") if p]
            res = []
            for part in split_top(rest):
                res += walk(prefix + head, part)
            return res
        return [prefix + [p for p in s.split("::") if p]]

    return walk([], tree)


class Crate:
    def __init__(self):
        self.files = {}  # module path tuple -> file path
        self.text = {}  # file -> stripped text
        self.reexports = defaultdict(dict)  # module -> name -> full path list
        self.lib_order = []
        self._scan()

    def _module_of(self, rel):
        parts = rel[:-3].split(os.sep)
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        return tuple(parts)

    def _scan(self):
        for dirpath, _, names in os.walk(SRC):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, SRC)
                if rel.startswith("bin" + os.sep):
                    continue
                mod = self._module_of(rel)
                self.files[mod] = rel
                with open(path, encoding="utf-8") as f:
                    self.text[rel] = strip(f.read())
        for dirpath, _, names in os.walk(os.path.join(SRC, "bin")):
            for name in names:
                if name.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(dirpath, name), SRC)
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        self.text[rel] = strip(f.read())
        self.lib_order = re.findall(r"^\s*pub\s+mod\s+(\w+)\s*;", self.text["lib.rs"], re.M)
        for mod, rel in self.files.items():
            for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", self.text[rel]):
                for p in expand_use(m.group(1)):
                    full = self.absolute(mod, p)
                    if full and p[-1] not in ("self", "*"):
                        self.reexports[mod][p[-1]] = full

    def absolute(self, mod, path):
        """A path as written in module `mod` -> an absolute module path list."""
        if not path:
            return None
        head = path[0]
        if head in ("crate", "$crate", "ds4"):
            return list(path[1:])
        if head == "self":
            return list(mod) + list(path[1:])
        if head == "super":
            base = list(mod)
            rest = list(path)
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            return base + rest
        if (mod + (head,)) in self.files:  # a child module named directly
            return list(mod) + list(path)
        return None  # std, a dependency, or a local name

    def resolve(self, path, depth=0):
        """Absolute path -> the file that defines it (following re-exports)."""
        best = None
        for k in range(len(path), 0, -1):
            m = tuple(path[:k])
            if m in self.files:
                best = m
                break
        if best is None:
            return None
        rest = path[len(best):]
        if rest and depth < 8 and rest[0] in self.reexports.get(best, {}):
            target = self.reexports[best][rest[0]]
            found = self.resolve(target + rest[1:], depth + 1)
            if found:
                return found
        return self.files[best]

    def edges(self):
        """(from file, to file) for every import found."""
        out = set()
        for rel, text in self.text.items():
            is_bin = rel.startswith("bin" + os.sep)
            mod = () if is_bin else self._module_of(rel)
            paths = []
            for m in re.finditer(r"\buse\s+([^;]+);", text):
                paths += expand_use(m.group(1))
            for m in re.finditer(r"(?<![\w:])(\$?crate|super|ds4|self)((?:::\w+)+)", text):
                paths.append([m.group(1)] + m.group(2).split("::")[1:])
            for p in paths:
                if is_bin and p[0] != "ds4":
                    continue
                if not is_bin and p[0] == "ds4":
                    continue
                full = self.absolute(mod, p)
                if not full:
                    continue
                target = self.resolve(full)
                if target and target != rel:
                    out.add((rel, target))
        return out


def room(rel):
    parts = rel.split(os.sep)
    if parts[0] == "bin":
        return "bin"
    if len(parts) == 1:
        return parts[0][:-3]
    return parts[0]


def cycles(nodes, adj):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def is_ancestor_mod(src, dst):
    """`dst` is the mod.rs of a folder that holds `src` (child -> parent)."""
    if os.path.basename(dst) != "mod.rs":
        return False
    folder = os.path.dirname(dst)
    return src.startswith(folder + os.sep)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dot", default=os.path.join(ROOT, "docs", "imports.dot"))
    args = ap.parse_args()

    crate = Crate()
    edges = crate.edges()
    order = crate.lib_order + ["bin"]
    rank = {r: i for i, r in enumerate(order)}

    room_edges = defaultdict(set)  # (a, b) -> example file pairs
    for a, b in edges:
        ra, rb = room(a), room(b)
        if ra != rb:
            room_edges[(ra, rb)].add((a, b))

    problems = 0
    rooms = sorted({room(r) for r in crate.text} - {"lib"}, key=lambda r: rank.get(r, -1))
    undeclared = [r for r in rooms if r not in rank]
    for r in undeclared:
        print(f"room not declared in lib.rs: {r}")
        problems += 1

    adj = defaultdict(set)
    for (a, b) in room_edges:
        adj[a].add(b)
    for comp in cycles(rooms + ["lib"], adj):
        print("circle between rooms: " + " <-> ".join(comp))
        problems += 1

    # Inside each folder: sibling files in a loop (child -> parent excluded).
    fadj = defaultdict(set)
    for a, b in edges:
        if room(a) == room(b) and not is_ancestor_mod(a, b):
            fadj[a].add(b)
    for comp in cycles(list(crate.text), fadj):
        print("circle between files: " + " <-> ".join(comp))
        problems += 1

    back = []
    for (a, b), pairs in sorted(room_edges.items()):
        if a == "lib" or b == "lib":
            if a == "lib":
                continue
            back.append((a, b, pairs))
            continue
        if a in rank and b in rank and rank[b] > rank[a]:
            back.append((a, b, pairs))
    for a, b, pairs in back:
        ex = ", ".join(f"{x} -> {y}" for x, y in sorted(pairs)[:3])
        print(f"arrow against the flow: {a} -> {b} ({ex})")
        problems += 1

    os.makedirs(os.path.dirname(os.path.abspath(args.dot)), exist_ok=True)
    with open(args.dot, "w", encoding="utf-8") as f:
        f.write("// Generated by tools/imports.py: the rooms of src/ and who imports whom.\n")
        f.write("// Rooms top to bottom in the flow order of src/lib.rs; an arrow points\n")
        f.write("// from the importer to what it imports. No line counts, so the file\n")
        f.write("// changes only when an arrow or a room does.\n")
        f.write("digraph imports {\n  rankdir=BT;\n  node [shape=box, fontname=Helvetica];\n")
        for r in rooms:
            f.write(f'  "{r}";\n')
        for (a, b) in sorted(room_edges):
            if a == "lib" or b == "lib":
                continue
            f.write(f'  "{a}" -> "{b}";\n')
        f.write("}\n")

    n_arrows = sum(1 for (a, b) in room_edges if "lib" not in (a, b))
    print(f"{len(rooms)} rooms, {n_arrows} arrows; flow order: {' > '.join(order)}")
    print(f"wrote {os.path.relpath(args.dot, ROOT)}")
    if problems:
        print(f"{problems} problem(s)")
        return 1
    print("no circles, no arrows against the flow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
