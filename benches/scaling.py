"""Scaling series for whole-tree operations (also ``python -m fastmodule bench --series``).

Usage: python benches/scaling.py [--sizes 500 1000 2000 4000 8000] [--stock-max 2000]
"""

from __future__ import annotations

import argparse

import torch

from fastmodule.bench.series import DEFAULT_SIZES, format_series, run_series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--stock-max", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(format_series(run_series(tuple(args.sizes), args.stock_max, args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
