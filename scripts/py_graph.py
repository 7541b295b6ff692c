"""Check that the Python package imports only downwards, through its layers.

Usage: python scripts/py_graph.py [--graph] [PACKAGE_DIR]

The layers of ``python/fastmodule``, from the top (the same order as docs/design.md,
"The Python package"):

  0 ``fastmodule`` (``__init__.py``) and ``fastmodule.__main__``: the package's
    namespace and its command line;
  1 ``fastmodule._startup``: what import installs, in order;
  2 ``fastmodule.tools``, ``.cli``, ``.bench``: the user tools (imported on first use);
  3 ``fastmodule.module``, ``.acceleration``, ``.nn``, ``.native_paths``, ``.switch``,
    ``.verification``: the modules that define the public surface;
  4 ``fastmodule._methods``: the Python bodies of torch's whole-tree methods;
  5 ``fastmodule._verified``: what is verified about the interpreter and the installed
    torch, and handed to the core from it;
  6 ``fastmodule._core``: the native core.

Every import of a ``fastmodule`` module is read from the syntax of every file,
wherever it is (module level, inside a function, under ``if``): ``import a.b``,
``from a import b`` (``a.b`` when that is a module, else ``a``), relative imports.
Each must name a module of its own layer or of a lower one. Exempt: imports under
``if TYPE_CHECKING:`` (never run), and an import whose line carries the comment
``# upward: <reason>`` (listed in the output with its reason). A module that no
layer names is an error too, so that a new one is placed deliberately.

``--graph``: print the module import graph as well. Exits 1 on an upward import or
an unplaced module, else 0.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "fastmodule"

#: Layers from the top; a module belongs to the first entry that is it or its package.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the package's namespace and command line", ("fastmodule", "fastmodule.__main__")),
    ("start-up", ("fastmodule._startup",)),
    ("user tools", ("fastmodule.tools", "fastmodule.cli", "fastmodule.bench")),
    (
        "public surface modules",
        (
            "fastmodule.module",
            "fastmodule.acceleration",
            "fastmodule.nn",
            "fastmodule.native_paths",
            "fastmodule.switch",
            "fastmodule.verification",
        ),
    ),
    ("bodies of torch's whole-tree methods", ("fastmodule._methods",)),
    ("what is verified about the installed torch", ("fastmodule._verified",)),
    ("the native core", ("fastmodule._core",)),
)

UPWARD_MARK = "# upward:"


def layer_of(module: str) -> int | None:
    """The layer of ``module``: the entry naming it or the closest package above it
    (``fastmodule`` itself only for the package's ``__init__``)."""
    best: tuple[int, int] | None = None  # (length of the matched name, layer)
    for n, (_, names) in enumerate(LAYERS):
        for name in names:
            exact = module == name
            inside = name != PACKAGE and module.startswith(name + ".")
            if (exact or inside) and (best is None or len(name) > best[0]):
                best = (len(name), n)
    return None if best is None else best[1]


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (its folder): dotted name -> file.
    Extension modules count by name (``_core.cpython-311-...so`` is ``fastmodule._core``)."""
    out: dict[str, Path] = {}
    for f in sorted(root.rglob("*")):
        if f.suffix not in (".py", ".so", ".pyd", ".pyi") or "__pycache__" in f.parts:
            continue
        parts = list(f.relative_to(root.parent).parts)
        parts[-1] = parts[-1].split(".")[0]
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if f.suffix == ".py" or name not in out:
            out[name] = f
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id.endswith("TYPE_CHECKING")) or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(
    tree: ast.Module, here: str, is_package: bool, known: set[str]
) -> list[tuple[int, str]]:
    """(line, module) for each import of a package module in ``tree``, skipping the
    bodies of ``if TYPE_CHECKING:``."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for sub in node.orelse:
                visit(sub)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    out.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            if base == PACKAGE or base.startswith(PACKAGE + "."):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    out.append((node.lineno, sub if sub in known else base))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", action="store_true", help="print the module import graph")
    default = Path(__file__).resolve().parents[1] / "python" / PACKAGE
    ap.add_argument("package", nargs="?", type=Path, default=default)
    args = ap.parse_args()

    mods = modules_of(args.package)
    known = set(mods)
    errors: list[str] = []
    allowed: list[str] = []
    edges: dict[str, set[str]] = defaultdict(set)
    for name in mods:
        if layer_of(name) is None:
            errors.append(f"{name}: in no layer (add it to LAYERS in scripts/py_graph.py)")
    for name, f in sorted(mods.items()):
        if f.suffix != ".py":
            continue
        text = f.read_text(encoding="utf-8")
        lines = text.splitlines()
        here = layer_of(name)
        for line, target in imports(ast.parse(text, str(f)), name, f.stem == "__init__", known):
            if target == name:
                continue
            edges[name].add(target)
            there = layer_of(target)
            if here is None or there is None or there >= here:
                continue
            where = f"{f.relative_to(args.package.parent)}:{line}"
            what = f"{name} (layer {here}) imports {target} (layer {there})"
            _, mark, reason = lines[line - 1].partition(UPWARD_MARK)
            if mark and reason.strip():
                allowed.append(f"{where}: {what}: {reason.strip()}")
            else:
                errors.append(f"{where}: {what}, an upward import")

    print("layers (each imports only its own and those below it):")
    for n, (title, names) in enumerate(LAYERS):
        print(f"  {n} {title}: {', '.join(names)}")
    if args.graph:
        print("\nmodule import graph (A -> what A imports):")
        for a in sorted(edges):
            print(f"  {a} -> {', '.join(sorted(edges[a]))}")
    if allowed:
        print(f"\nupward imports with a stated reason ({len(allowed)}):")
        for a in allowed:
            print(f"  {a}")
    if errors:
        print(f"\n{len(errors)} error(s):")
        for e in errors:
            print(f"  {e}")
        return 1
    unstated = " without a stated reason" if allowed else ""
    count = sum(len(v) for v in edges.values())
    print(f"\n{len(mods)} modules, {count} imports between them: none upward{unstated}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
