"""Scaling series for whole-tree operations: how cost grows with the tree's width.

Builds the wide tree of the benchmark suite (N blocks of Linear(4,4) + LayerNorm(4)
+ a buffer; 3N+1 modules, 5N tensors) for several N and times stock and fastmodule
``load_state_dict(sd)``, ``state_dict()`` and ``list(named_parameters())``, best of
a few runs. Stock ``load_state_dict`` is quadratic, so it is skipped above
``--stock-max`` blocks. Prints a markdown table.

Usage: python benches/scaling.py [--sizes 500 1000 2000 4000 8000] [--stock-max 4000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from fastmodule.bench.cases import FastTree, StockTree


def best_ms(fn: Callable[[], object], runs: int) -> float:
    """Fastest of ``runs`` calls, in milliseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000])
    parser.add_argument("--stock-max", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| blocks | modules | tensors | operation | stock ms | fastmodule ms | speedup |")
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        torch.manual_seed(0)
        stock, fast = StockTree(n), FastTree(n)
        sd = stock.state_dict()
        ops: dict[str, Callable[[torch.nn.Module], object]] = {
            "load_state_dict(sd)": lambda m, sd=sd: m.load_state_dict(sd),
            "state_dict()": lambda m: m.state_dict(),
            "list(named_parameters())": lambda m: list(m.named_parameters()),
        }
        for name, op in ops.items():
            quadratic = name.startswith("load") and n > args.stock_max
            runs = 1 if name.startswith("load") else args.runs
            f_ms = best_ms(lambda op=op, m=fast: op(m), runs)
            s_ms = None if quadratic else best_ms(lambda op=op, m=stock: op(m), runs)
            s_txt = "skipped" if s_ms is None else f"{s_ms:.1f}"
            ratio = "" if s_ms is None else f"{s_ms / f_ms:.1f}x"
            print(f"| {n} | {3 * n + 1} | {5 * n} | {name} | {s_txt} | {f_ms:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
