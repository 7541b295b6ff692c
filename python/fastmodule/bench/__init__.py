"""Side-by-side benchmarks of ``fastmodule.Module`` against stock ``torch.nn.Module``.

Run them with ``python -m fastmodule bench``. :mod:`~fastmodule.bench.case` defines
the case type and the helpers the groups share; the groups of cases are
:mod:`~fastmodule.bench.synthetic`, :mod:`~fastmodule.bench.hook_cases`,
:mod:`~fastmodule.bench.models`, :mod:`~fastmodule.bench.user_cases` and
:mod:`~fastmodule.bench.workloads` (``workload_*``: whole user programs);
:mod:`~fastmodule.bench.registry` lists them all and selects by name or pattern.
:mod:`~fastmodule.bench.runner` times the cases and :mod:`~fastmodule.bench.report`
prints the table and writes the JSON report.

``CASES`` is the synthetic group (:data:`~fastmodule.bench.synthetic.SYNTHETIC_CASES`).
It and the registry's functions are loaded on first use, so that importing one group
(``import fastmodule.bench.models``) loads neither the registry nor the other groups.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastmodule.bench.case import KINDS, Case, Variant
from fastmodule.bench.runner import DEFAULT, QUICK, CaseResult, Settings, Stats, run_case

if TYPE_CHECKING:
    from fastmodule.bench.registry import (
        case_names,
        default_case_names,
        get_case,
        select_cases,
    )
    from fastmodule.bench.synthetic import SYNTHETIC_CASES as CASES

#: Names loaded on first use: name -> (module, name there).
_LAZY: dict[str, tuple[str, str]] = {
    "CASES": ("fastmodule.bench.synthetic", "SYNTHETIC_CASES"),
    "case_names": ("fastmodule.bench.registry", "case_names"),
    "default_case_names": ("fastmodule.bench.registry", "default_case_names"),
    "get_case": ("fastmodule.bench.registry", "get_case"),
    "select_cases": ("fastmodule.bench.registry", "select_cases"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CASES",
    "DEFAULT",
    "KINDS",
    "QUICK",
    "Case",
    "CaseResult",
    "Settings",
    "Stats",
    "Variant",
    "case_names",
    "default_case_names",
    "get_case",
    "run_case",
    "select_cases",
]
