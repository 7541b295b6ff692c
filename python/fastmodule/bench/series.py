"""Size series: how whole-tree operations grow with the tree's width.

The wide tree of the suite (N blocks of Linear(4,4) + LayerNorm(4) + a buffer:
3N+1 modules, 5N tensors) for several N; stock and fastmodule
``state_dict()`` and ``load_state_dict(sd)``, best of a few runs each. Stock
``load_state_dict`` is quadratic in the width, so it is skipped above
``stock_max`` blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastmodule.bench.synthetic import FastTree, StockTree

__all__ = ["DEFAULT_SIZES", "QUICK_SIZES", "SeriesPoint", "format_series", "run_series"]

DEFAULT_SIZES = (500, 1000, 2000, 4000, 8000)
QUICK_SIZES = (250, 500, 1000)


@dataclass(frozen=True)
class SeriesPoint:
    """One operation at one size: best-of times in ms (stock None when skipped)."""

    operation: str
    blocks: int
    stock_ms: float | None
    fast_ms: float


def _best_ms(fn: Callable[[], object], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def run_series(
    sizes: tuple[int, ...] = DEFAULT_SIZES, stock_max: int = 2000, runs: int = 3
) -> list[SeriesPoint]:
    """Time ``state_dict()`` and ``load_state_dict(sd)`` at each size."""
    points: list[SeriesPoint] = []
    for n in sizes:
        torch.manual_seed(0)
        stock, fast = StockTree(n), FastTree(n)
        sd = stock.state_dict()
        ops: dict[str, Callable[[torch.nn.Module], object]] = {
            "state_dict": lambda m: m.state_dict(),
            "load_state_dict": lambda m, sd=sd: m.load_state_dict(sd),
        }
        for name, op in ops.items():
            heavy = name == "load_state_dict"
            fast_ms = _best_ms(lambda op=op, m=fast: op(m), runs)
            stock_ms = None
            if not (heavy and n > stock_max):
                stock_ms = _best_ms(lambda op=op, m=stock: op(m), 1 if heavy else runs)
            points.append(SeriesPoint(name, n, stock_ms, fast_ms))
    return points


def format_series(points: list[SeriesPoint]) -> str:
    """A table: operation, blocks, stock, fastmodule, speedup, and each side's growth
    from the previous size."""
    head = ["operation", "blocks", "stock ms", "fastmodule ms", "speedup", "fast growth"]
    rows = []
    previous: dict[str, SeriesPoint] = {}
    for p in points:
        prev = previous.get(p.operation)
        growth = f"{p.fast_ms / prev.fast_ms:.2f}x" if prev else ""
        stock = f"{p.stock_ms:.1f}" if p.stock_ms is not None else "skipped"
        speed = f"{p.stock_ms / p.fast_ms:.1f}x" if p.stock_ms is not None else ""
        rows.append([p.operation, str(p.blocks), stock, f"{p.fast_ms:.1f}", speed, growth])
        previous[p.operation] = p
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "blocks: N blocks = 3N+1 modules, 5N tensors; best of runs; growth = vs previous N"
    )
    return "\n".join(lines)
