"""The registry of all benchmark cases: every group in run order, lookup by name and
``--only`` pattern selection.

The groups, in run order: :mod:`~fastmodule.bench.synthetic`,
:mod:`~fastmodule.bench.hook_cases`, :mod:`~fastmodule.bench.models`,
:mod:`~fastmodule.bench.user_cases` (whose ``root_*`` and ``step_*`` cases have
``default=False``: they run only when ``--only`` names them or a pattern matches
them) and :mod:`~fastmodule.bench.workloads` (``workload_*``, in the default run).
This module sits above the groups and the case type (:mod:`~fastmodule.bench.case`);
none of them imports it.
"""

from __future__ import annotations

import fnmatch

from fastmodule.bench.case import Case
from fastmodule.bench.hook_cases import HOOK_CASES
from fastmodule.bench.models import MODEL_CASES
from fastmodule.bench.synthetic import SYNTHETIC_CASES
from fastmodule.bench.user_cases import USER_CASES
from fastmodule.bench.workloads import WORKLOAD_CASES

__all__ = [
    "ALL_CASES",
    "case_names",
    "default_case_names",
    "get_case",
    "select_cases",
]

#: Every case, in run order (real-model cases only where their packages are installed).
ALL_CASES: tuple[Case, ...] = (
    SYNTHETIC_CASES + HOOK_CASES + MODEL_CASES + USER_CASES + WORKLOAD_CASES
)


def case_names() -> list[str]:
    """Names of all cases, in run order (real-model cases when their packages exist)."""
    return [c.name for c in ALL_CASES]


def default_case_names() -> list[str]:
    """Names of the cases a plain ``fastmodule bench`` runs, in run order."""
    return [c.name for c in ALL_CASES if c.default]


def select_cases(patterns: list[str]) -> list[str]:
    """The cases named by ``patterns`` (names, or shell-style patterns such as
    ``root_*``), in the order given, each once; a pattern matches in run order.

    Raises:
        KeyError: a name or pattern that matches no case (the first such).
    """
    known = case_names()
    chosen: dict[str, None] = {}
    for pattern in patterns:
        matched = [n for n in known if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise KeyError(pattern)
        chosen.update(dict.fromkeys(matched))
    return list(chosen)


def get_case(name: str) -> Case:
    """Look a case up by name; raises ``KeyError`` if unknown."""
    for case in ALL_CASES:
        if case.name == name:
            return case
    raise KeyError(name)
