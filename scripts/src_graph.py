"""Print the import graph of the Rust core's folders (src/*/) and check it has no cycles.

Usage: python scripts/src_graph.py [--files] [--items] [SRC]

Every ``crate::...`` path in code (comments and doc comments are skipped) and every
``super::`` path is resolved to the module it names; an edge A -> B means some file
of folder A uses something of folder B (top-level files count as folders of their
own; ``lib.rs``, the crate root that registers the Python functions, is left out:
it may use everything). The layering rule of the crate is that edges point one way,
from higher layers to lower ones, so the graph must be acyclic; the folders are
printed in layers (a folder's layer is one more than the highest it uses).

``--files``: the same graph between files (modules), cycles within a folder shown
but not counted as errors. ``--items``: with each edge, the names it uses.
Exits 1 if the folder graph has a cycle, else 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_comments(text: str) -> str:
    """Drop // comments (doc comments included) and /* */ blocks; keep strings."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_path(src: Path, f: Path) -> tuple[str, ...]:
    parts = list(f.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return tuple(parts)


def split_group(text: str, start: int) -> tuple[list[str], int]:
    """The top-level entries of the `{...}` group opening at `start`."""
    depth, i, cur, items = 0, start, [], []
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                items.append("".join(cur))
                return [s.strip() for s in items if s.strip()], i
        elif c == "," and depth == 1:
            items.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return items, i


def uses(code: str, here: tuple[str, ...], is_dir_mod: bool) -> list[tuple[str, ...]]:
    """Absolute paths (as tuples) of everything `code` names through crate:: or super::."""
    found: list[tuple[str, ...]] = []

    def expand(base: tuple[str, ...], rest: str) -> None:
        rest = rest.strip()
        if rest.startswith("{"):
            entries, _ = split_group(rest, 0)
            for e in entries:
                expand(base, e)
            return
        m = re.match(rf"({IDENT}(?:\s*::\s*{IDENT})*)(\s*::\s*\{{)?", rest)
        if not m:
            return
        segs = tuple(s.strip() for s in m.group(1).split("::"))
        if segs and segs[0] == "self":
            segs = segs[1:]
        if m.group(2):
            entries, _ = split_group(rest, m.end() - 1)
            for e in entries:
                expand(base + segs, e)
        else:
            found.append(base + segs)

    for m in re.finditer(r"\b(crate\s*::\s*|(?:super\s*::\s*)+)", code):
        if m.start() > 0 and code[m.start() - 1] == ":":
            continue  # inside a longer path (`$crate::`, a `super::` chain's tail)
        base: tuple[str, ...] = ()
        if not m.group(1).startswith("crate"):
            # `super::` from a folder's `mod.rs` is the crate root; from a file, its folder.
            base = here[: len(here) - m.group(1).count("super") - (0 if is_dir_mod else 0)]
        rest = code[m.end() :]
        # A `{` group may span lines: hand over enough text to close it.
        expand(base, rest[:4000] if rest.lstrip().startswith("{") else rest[:400])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(Path(__file__).resolve().parent.parent / "src"))
    ap.add_argument("--files", action="store_true", help="also the graph between files")
    ap.add_argument("--items", action="store_true", help="the names each edge uses")
    args = ap.parse_args()
    src = Path(args.src)

    folder_edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    file_edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    folders: set[str] = set()
    for f in sorted(src.rglob("*.rs")):
        here = module_path(src, f)
        if not here:
            continue  # lib.rs: the root uses everything
        folders.add(here[0])
        code = strip_comments(f.read_text())
        for path in uses(code, here, f.name == "mod.rs"):
            if not path:
                continue
            target = path[0]
            item = "::".join(path[1:]) or path[0]
            if target != here[0]:
                folder_edges[here[0]][target].add(item)
            # The file (module) the path ends in: the longest prefix that is a module.
            mod = path
            while mod and not (
                (src.joinpath(*mod).with_suffix(".rs")).exists()
                or (src.joinpath(*mod) / "mod.rs").exists()
            ):
                mod = mod[:-1]
            if mod and mod != here:
                file_edges["::".join(here)]["::".join(mod)].add("::".join(path[len(mod) :]) or "*")

    def show(edges: dict[str, dict[str, set[str]]], nodes: set[str]) -> None:
        for a in sorted(nodes):
            targets = edges.get(a, {})
            if args.items:
                print(f"{a} ->")
                for b in sorted(targets):
                    print(f"    {b}: {', '.join(sorted(targets[b]))}")
            else:
                print(f"{a} -> {', '.join(sorted(targets)) or '(nothing)'}")

    def cycles(edges: dict[str, dict[str, set[str]]], nodes: set[str]) -> list[list[str]]:
        """Strongly connected components of more than one node (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in edges.get(v, {}):
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
                    out.append(sorted(comp))

        sys.setrecursionlimit(10000)
        for v in sorted(nodes):
            if v not in index:
                visit(v)
        return out

    print("folder import graph (A -> what A uses):")
    show(folder_edges, folders)
    found = cycles(folder_edges, folders)
    if not found:
        layer: dict[str, int] = {}

        def depth(v: str) -> int:
            if v not in layer:
                layer[v] = 1 + max((depth(w) for w in folder_edges.get(v, {})), default=-1)
            return layer[v]

        for v in folders:
            depth(v)
        print("\nlayers (each uses only layers below it):")
        for n in range(max(layer.values()) + 1):
            print(f"  {n}: {', '.join(sorted(v for v in folders if layer[v] == n))}")
    if args.files:
        files = {"::".join(module_path(src, f)) for f in src.rglob("*.rs")} - {""}
        print("\nfile import graph:")
        show(file_edges, files)
        for comp in cycles(file_edges, files):
            print(
                f"file cycle (within a folder, allowed): {' <-> '.join(comp)}"
                if len({c.split("::")[0] for c in comp}) == 1
                else f"file cycle across folders: {' <-> '.join(comp)}"
            )
    if found:
        for comp in found:
            print(f"\nCYCLE between folders: {' <-> '.join(comp)}")
        return 1
    print("\nno cycles between folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
