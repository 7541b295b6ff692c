"""Side-by-side benchmarks of ``fastmodule.Module`` against stock ``torch.nn.Module``.

Run them with ``python -m fastmodule bench``. :mod:`~fastmodule.bench.case` defines
the case type and the helpers the groups share; the groups of cases are
:mod:`~fastmodule.bench.synthetic`, :mod:`~fastmodule.bench.hook_cases`,
:mod:`~fastmodule.bench.models` and :mod:`~fastmodule.bench.user_cases`;
:mod:`~fastmodule.bench.registry` lists them all and selects by name or pattern.
:mod:`~fastmodule.bench.runner` times the cases and :mod:`~fastmodule.bench.report`
prints the table and writes the JSON report.

``CASES`` is the synthetic group (:data:`~fastmodule.bench.synthetic.SYNTHETIC_CASES`).
"""

from fastmodule.bench.case import KINDS, Case, Variant
from fastmodule.bench.registry import case_names, default_case_names, get_case, select_cases
from fastmodule.bench.runner import DEFAULT, QUICK, CaseResult, Settings, Stats, run_case
from fastmodule.bench.synthetic import SYNTHETIC_CASES as CASES

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
