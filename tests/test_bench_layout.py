"""The layering of ``fastmodule.bench``'s cases: the case type below the groups, the
registry above them, no import circle.

- :mod:`fastmodule.bench.case` (``Case``, ``Variant``, shared helpers) imports no group;
- each group (``synthetic``, ``hook_cases``, ``models``, ``user_cases``, ``workloads``)
  imports the case module, never the registry;
- :mod:`fastmodule.bench.registry` imports every group.

The imports run bottom up in a fresh interpreter, which reports the ``fastmodule.bench``
modules in ``sys.modules`` after each; the source is also checked, so that an import
inside a function cannot hide one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fastmodule.bench

BENCH = "fastmodule.bench"
REGISTRY = f"{BENCH}.registry"
CASE = f"{BENCH}.case"
GROUPS = tuple(
    f"{BENCH}.{g}" for g in ("synthetic", "hook_cases", "models", "user_cases", "workloads")
)

#: Imports the modules one by one, from the bottom up, and after each prints the
#: ``fastmodule.bench`` modules then loaded: whatever a module pulls in shows up at its
#: step (the registry, imported last, must show up nowhere before).
_SCRIPT = """
import importlib, json, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
    loaded = sorted(m for m in sys.modules if m.startswith("fastmodule.bench"))
    print(json.dumps([module, loaded]))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    """For each module: the ``fastmodule.bench`` modules loaded once it is imported (in
    one fresh interpreter, importing the package, the case module, each group, then the
    registry)."""
    modules = (BENCH, CASE, *GROUPS, REGISTRY)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *modules],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("[")]
    assert [m for m, _ in rows] == list(modules)
    return {m: set(names) for m, names in rows}


def test_case_module_imports_no_group(loaded: dict[str, set[str]]) -> None:
    assert loaded[CASE].isdisjoint({*GROUPS, REGISTRY}), sorted(loaded[CASE])


@pytest.mark.parametrize("group", GROUPS)
def test_group_does_not_import_registry(loaded: dict[str, set[str]], group: str) -> None:
    assert group in loaded[group]
    assert REGISTRY not in loaded[group], sorted(loaded[group])


def test_package_loads_registry_on_first_use(loaded: dict[str, set[str]]) -> None:
    """``import fastmodule.bench`` alone loads no group and not the registry."""
    assert loaded[BENCH].isdisjoint({*GROUPS, REGISTRY}), sorted(loaded[BENCH])


def test_registry_imports_every_group(loaded: dict[str, set[str]]) -> None:
    assert set(GROUPS) <= loaded[REGISTRY]


def _imported(path: Path) -> set[str]:
    """Every module an ``import`` statement in ``path`` names, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_module_below_imports_the_registry() -> None:
    """Not even inside a function: only the package's ``__init__`` (its lazy names, for
    type checkers) names the registry."""
    root = Path(fastmodule.bench.__file__).parent
    importing = sorted(p.name for p in root.glob("*.py") if REGISTRY in _imported(p))
    assert importing == ["__init__.py"]
