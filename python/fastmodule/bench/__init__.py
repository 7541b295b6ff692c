"""Side-by-side benchmarks of ``fastmodule.Module`` against stock ``torch.nn.Module``.

Run them with ``python -m fastmodule bench``. :mod:`~fastmodule.bench.cases` defines
the cases, :mod:`~fastmodule.bench.runner` times them and
:mod:`~fastmodule.bench.report` prints the table and writes the JSON report.
"""

from fastmodule.bench.cases import (
    CASES,
    KINDS,
    Case,
    Variant,
    case_names,
    default_case_names,
    get_case,
    select_cases,
)
from fastmodule.bench.runner import DEFAULT, QUICK, CaseResult, Settings, Stats, run_case

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
