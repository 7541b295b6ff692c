"""Where a finding comes from in the source, and whether the code silences it.

The line of an attribute is found by reading the source of the module's class and its
bases (outside torch and fastmodule) with ``ast``: the first assignment to
``self.NAME`` (``self.NAME = ...``, ``self.NAME: T = ...``, ``self.NAME += ...``,
``setattr(self, "NAME", ...)``, ``self.__dict__["NAME"] = ...``) in ``__init__``, else
in any other method, most derived class first; an assignment of a constant
(``self.cache = None``) is passed over. A class-wide finding (FM016) is placed at the
``class`` statement. Nothing is imported or run: the files are read through
``linecache``, which is where ``inspect`` reads them too.

A finding is silenced by

- a comment ``# fastmodule: ignore[FM001]`` (several codes: ``ignore[FM001, FM005]``;
  every code: ``# fastmodule: ignore``) on the line the finding names (any line of
  that statement), or
- a class attribute ``__fastmodule_ignore__ = {"FM001": ["layers"], "FM016": "*"}``
  (code -> attribute names, ``"*"`` for every attribute and the class itself; a set
  of codes means ``"*"`` for each), read from the class and its bases.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import linecache
import os
import re
from typing import Any

__all__ = [
    "IGNORE_ATTRIBUTE",
    "Location",
    "attribute_site",
    "class_site",
    "comment_codes",
    "shown_path",
    "silenced",
]

#: The class attribute that silences findings on a class.
IGNORE_ATTRIBUTE = "__fastmodule_ignore__"
_COMMENT = re.compile(r"#\s*fastmodule:\s*ignore\b(?:\[([^\]]*)\])?", re.IGNORECASE)
# Classes of these packages are not searched (their findings are theirs, by design).
_SKIPPED_PACKAGES = frozenset(("torch", "fastmodule", "builtins"))


@dataclasses.dataclass(frozen=True)
class Location:
    """A statement in a source file (lines 1-based, ``end_line`` inclusive)."""

    file: str
    line: int
    end_line: int


@dataclasses.dataclass(frozen=True)
class _Assignment:
    line: int
    end_line: int
    in_init: bool
    constant: bool


def _searched(cls: type) -> bool:
    return str(getattr(cls, "__module__", "")).partition(".")[0] not in _SKIPPED_PACKAGES


def attribute_site(cls: type, attribute: str) -> Location | None:
    """The assignment to ``self.<attribute>`` in the source of ``cls`` or a base
    (see the module docstring), or None where the source cannot be found."""
    for klass in cls.__mro__:
        if not _searched(klass):
            continue
        found = _class_source(klass)
        if found is None:
            continue
        file, assignments = found
        candidates = [a for a in assignments.get(attribute, ()) if not a.constant]
        if candidates:
            best = min(candidates, key=lambda a: (not a.in_init, a.line))
            return Location(file, best.line, best.end_line)
    return None


def class_site(cls: type) -> Location | None:
    """The ``class`` statement of ``cls`` (None where its source cannot be found)."""
    if not _searched(cls):
        return None
    node = _class_node(cls)
    if node is None:
        return None
    file, klass = node
    return Location(file, klass.lineno, klass.lineno)


def _class_node(cls: type) -> tuple[str, ast.ClassDef] | None:
    try:
        file = inspect.getsourcefile(cls)
        _, start = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    if not file:
        return None
    tree = _parsed(file)
    if tree is None:
        return None
    # inspect gives the first line of the statement, decorators included.
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if first == start:
                return file, node
    return None


@functools.lru_cache(maxsize=256)
def _class_source(cls: type) -> tuple[str, dict[str, list[_Assignment]]] | None:
    found = _class_node(cls)
    if found is None:
        return None
    file, node = found
    out: dict[str, list[_Assignment]] = {}
    for method in node.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = method.args.posonlyargs + method.args.args
        if not args:
            continue
        this = args[0].arg
        for name, stmt, value in _assignments(method, this):
            out.setdefault(name, []).append(
                _Assignment(
                    stmt.lineno,
                    stmt.end_lineno or stmt.lineno,
                    method.name == "__init__",
                    isinstance(value, ast.Constant),
                )
            )
    return file, out


def _assignments(method: ast.AST, this: str) -> list[tuple[str, ast.stmt, ast.AST | None]]:
    """``(attribute, statement, value)`` of each assignment to ``this.<attribute>``."""
    out: list[tuple[str, ast.stmt, ast.AST | None]] = []
    for stmt in ast.walk(method):
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for name in _targets(target, this):
                    out.append((name, stmt, stmt.value))
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            for name in _targets(stmt.target, this):
                out.append((name, stmt, stmt.value))
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if (
                isinstance(call.func, ast.Name)
                and call.func.id == "setattr"
                and len(call.args) == 3
                and _is_name(call.args[0], this)
                and isinstance(call.args[1], ast.Constant)
                and isinstance(call.args[1].value, str)
            ):
                out.append((call.args[1].value, stmt, call.args[2]))
    return out


def _targets(target: ast.AST, this: str) -> list[str]:
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _targets(t, this)]
    if isinstance(target, ast.Starred):
        return _targets(target.value, this)
    if isinstance(target, ast.Attribute) and _is_name(target.value, this):
        return [target.attr]
    if (
        isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Attribute)
        and target.value.attr == "__dict__"
        and _is_name(target.value.value, this)
        and isinstance(target.slice, ast.Constant)
        and isinstance(target.slice.value, str)
    ):
        return [target.slice.value]
    return []


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _parsed(file: str) -> ast.Module | None:
    lines = linecache.getlines(file)
    if not lines:
        return None
    return _parse("".join(lines), file)


@functools.lru_cache(maxsize=64)
def _parse(text: str, file: str) -> ast.Module | None:
    try:
        return ast.parse(text, file)
    except (SyntaxError, ValueError):
        return None


def comment_codes(location: Location) -> set[str] | None:
    """The codes a ``# fastmodule: ignore[...]`` comment on the statement names
    (``{"*"}``: every code), or None when there is none."""
    codes: set[str] = set()
    found = False
    for n in range(location.line, location.end_line + 1):
        text = linecache.getline(location.file, n)
        if "#" not in text:
            continue
        for match in _COMMENT.finditer(text):
            found = True
            listed = match.group(1)
            if listed is None or not listed.strip():
                codes.add("*")
            else:
                codes.update(c.strip().upper() for c in listed.split(",") if c.strip())
    return codes if found else None


def _class_ignores(cls: type) -> dict[str, set[str]]:
    """``__fastmodule_ignore__`` of ``cls`` and its bases, merged: code -> names
    (``"*"``: all)."""
    out: dict[str, set[str]] = {}
    for klass in cls.__mro__:
        spec: Any = vars(klass).get(IGNORE_ATTRIBUTE)
        if spec is None:
            continue
        items: list[tuple[Any, Any]]
        if isinstance(spec, dict):
            items = list(spec.items())
        elif isinstance(spec, str):
            items = [(spec, "*")]
        else:
            try:
                items = [(code, "*") for code in spec]
            except TypeError:
                continue
        for code, names in items:
            if not isinstance(code, str):
                continue
            bucket = out.setdefault(code.upper(), set())
            if isinstance(names, str):
                bucket.add(names)
            else:
                try:
                    bucket.update(n for n in names if isinstance(n, str))
                except TypeError:
                    continue
    return out


def silenced(cls: type, code: str, attribute: str, location: Location | None) -> str | None:
    """How the finding ``code`` on ``cls``'s ``attribute`` is silenced in the code
    (``"comment"`` or ``"class attribute"``), or None."""
    if location is not None:
        codes = comment_codes(location)
        if codes is not None and ("*" in codes or code in codes):
            return "comment"
    names = _class_ignores(cls).get(code)
    if names is not None and ("*" in names or attribute in names):
        return "class attribute"
    return None


def shown_path(file: str) -> str:
    """``file`` relative to the current directory when it is under it."""
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive (Windows)
        return file
    return file if relative.startswith(os.pardir) else relative
