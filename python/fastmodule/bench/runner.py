"""Timing: tight compiled loops, interleaved repeats, per-op statistics."""

from __future__ import annotations

import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastmodule.bench.case import KINDS, Case, Variant, set_scale

__all__ = ["DEFAULT", "QUICK", "CaseResult", "Settings", "Stats", "run_case"]

#: Below this many ns of stock-over-lower-bound overhead, "overhead removed" is undefined.
MIN_OVERHEAD_NS = 1.0


@dataclass(frozen=True)
class Settings:
    """How long to measure: ``repeats`` interleaved rounds of ~``target_s`` loops each."""

    repeats: int
    target_s: float
    #: Size factor of the whole-tree cases.
    scale: float = 1.0
    #: Also time ``torch.compile`` where a case offers it (compile time apart).
    compile: bool = False


DEFAULT = Settings(repeats=21, target_s=0.08)
QUICK = Settings(repeats=5, target_s=0.01, scale=0.25)


@dataclass(frozen=True)
class Stats:
    """Per-op time in ns over the repeats."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats:
        """Summarise per-op samples (ns)."""
        return cls(statistics.median(samples), min(samples), max(samples))


@dataclass(frozen=True)
class CaseResult:
    """Statistics of one case for each of ``stock``, ``fast`` and ``lower``."""

    case: str
    device: str
    stats: dict[str, Stats]
    iterations: dict[str, int]
    #: ``torch.compile`` steady state, and the seconds its first call took.
    compiled: Stats | None = None
    compile_s: float | None = None

    @property
    def speedup(self) -> float | None:
        """Median stock time over median fast time."""
        fast = self.stats["fast"].median
        return self.stats["stock"].median / fast if fast > 0 else None

    @property
    def overhead_removed(self) -> float | None:
        """``(stock - fast) / (stock - lower)``: the share of module overhead removed."""
        stock, fast, lower = (self.stats[k].median for k in KINDS)
        if stock - lower < MIN_OVERHEAD_NS:
            return None
        return (stock - fast) / (stock - lower)


def make_loop(variant: Variant) -> Callable[[int], int]:
    """Return ``run(number) -> ns`` timing ``number`` executions of ``variant.stmt``."""
    sync = variant.sync
    if sync is None:
        clock = time.perf_counter_ns
    else:

        def clock() -> int:
            sync()
            return time.perf_counter_ns()

    timer = timeit.Timer(variant.stmt, globals=variant.namespace, timer=clock)

    def run(number: int) -> int:
        with variant.context():
            return int(timer.timeit(number))

    return run


def calibrate(run: Callable[[int], int], target_ns: float) -> int:
    """Find a loop count whose run takes about ``target_ns`` (doubles as warm-up)."""
    number = 1
    while True:
        elapsed = run(number)
        if elapsed >= target_ns / 10 or number >= 10**8:
            break
        number *= 10
    return max(1, round(number * target_ns / max(elapsed, 1)))


def run_case(case: Case, device: torch.device, settings: Settings) -> CaseResult:
    """Build ``case`` and time its three variants, interleaved, ``settings.repeats`` times."""
    device = device if case.uses_device else torch.device("cpu")
    set_scale(settings.scale)
    variants = case.build(device)
    loops = {kind: make_loop(variants[kind]) for kind in KINDS}
    target_ns = settings.target_s * 1e9
    numbers = {kind: calibrate(loops[kind], target_ns) for kind in KINDS}
    for kind in KINDS:  # warm-up at the final loop count
        loops[kind](numbers[kind])
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(settings.repeats):
        for kind in KINDS:
            samples[kind].append(loops[kind](numbers[kind]) / numbers[kind])
    compiled = compile_s = None
    if settings.compile and "compiled" in variants:
        compiled, compile_s = _time_compiled(variants["compiled"], target_ns, settings.repeats)
    return CaseResult(
        case=case.name,
        device=str(device),
        stats={kind: Stats.of(samples[kind]) for kind in KINDS},
        iterations=numbers,
        compiled=compiled,
        compile_s=compile_s,
    )


def _time_compiled(variant: Variant, target_ns: float, repeats: int) -> tuple[Stats, float]:
    """The first call (compilation) apart, then the steady state."""
    loop = make_loop(variant)
    compile_s = loop(1) / 1e9
    number = calibrate(loop, target_ns)
    loop(number)
    return Stats.of([loop(number) / number for _ in range(repeats)]), compile_s
