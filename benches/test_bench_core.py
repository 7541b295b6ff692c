"""pytest-benchmark view of the ``fastmodule bench`` cases.

Run with ``pytest benches --benchmark-only``. Each case's ``stock``, ``fast`` and
``lower`` variants share a benchmark group, so they are compared side by side.
Timings here include one Python function call per op (pytest-benchmark times a
callable); ``python -m fastmodule bench`` times tight loops without it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fastmodule.bench import CASES, KINDS, Case, Variant

_built: dict[str, dict[str, Variant]] = {}


def _variants(case: Case) -> dict[str, Variant]:
    """Build each case once per session (on CPU), shared by its three benchmarks."""
    if case.name not in _built:
        _built[case.name] = case.build(torch.device("cpu"))
    return _built[case.name]


@pytest.mark.benchmark(max_time=0.1, min_rounds=5, warmup=False)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_core(benchmark: Any, case: Case, kind: str) -> None:
    benchmark.group = case.name
    variant = _variants(case)[kind]
    op = variant.as_callable()
    with variant.context():
        benchmark(op)
