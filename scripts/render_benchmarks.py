"""Render ``python -m fastmodule bench --json`` results as the tables of BENCHMARKS.md.

Usage: python scripts/render_benchmarks.py RESULT.json [MORE.json ...] > section.md
Each JSON file becomes one section with its machine, versions, date and table.

       python scripts/render_benchmarks.py --bound RESULT.json [MORE.json ...]
The same, with two more columns: fast / lower bound (how far fastmodule is from the
lower bound; at most 1.25 is issue 28's target for the root_* cases) and stock / lower
bound (the most a runtime as fast as the lower bound would gain).

       python scripts/render_benchmarks.py --compare A.json B.json [C.json ...]
One table of every case's speedup in each file side by side (columns named by their
Python version), with the last file's speedup as a share of the one before it, and
that share as it would be if fastmodule took the lower bound's time in both (stock /
lower bound in each): where that is low too, the gap is stock's own change between
the two runs, which no fastmodule change can close.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _fmt(ns: float) -> str:
    return f"{ns:.1f} ns" if ns < 1000 else f"{ns / 1000:.2f} µs"


def _cell(stats: dict[str, float]) -> str:
    return f"{_fmt(stats['median'])} ({_fmt(stats['min'])}–{_fmt(stats['max'])})"


def render(path: str, bound: bool = False) -> str:
    """One markdown section for one JSON result file (``bound``: with the fast / lower
    and stock / lower columns)."""
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    meta = data["meta"]
    lines = [
        f"### {meta['date']} — Python {meta['python']}, torch {meta['torch']}, {meta['device']}",
        "",
        f"- machine: {meta['platform']}, CPU {meta['cpu']}, {os.cpu_count()} cores, "
        f"{meta['threads']} torch thread(s)",
        f"- fastmodule {meta['fastmodule']}; {meta['repeats']} interleaved repeats of "
        f"~{meta['target_s'] * 1000:.0f} ms loops per column",
        "",
        "| case | stock | fastmodule | lower bound | speedup | overhead removed "
        + ("| fast / lower | stock / lower " if bound else "")
        + "| torch.compile (compile time) |",
        "|---|---|---|---|---|---|---|" + ("---|---|" if bound else ""),
    ]
    for r in data["results"]:
        removed = r.get("overhead_removed")
        removed_s = "n/a" if removed is None else f"{removed * 100:.0f}%"
        compiled = ""
        if "compiled" in r:
            compiled = f"{_cell(r['compiled'])} ({r['compile_s']:.1f} s)"
        ratios = ""
        if bound:
            lower = r["lower"]["median"]
            ratios = f"| {r['fast']['median'] / lower:.2f} | {r['stock']['median'] / lower:.2f}x "
        lines.append(
            f"| {r['case']} | {_cell(r['stock'])} | {_cell(r['fast'])} | {_cell(r['lower'])} "
            f"| {r['speedup']:.2f}x | {removed_s} {ratios}| {compiled} |"
        )
    if data.get("series"):
        lines += [
            "",
            "Size series (best of runs; N blocks = 3N+1 modules, 5N tensors):",
            "",
            "| operation | blocks | stock ms | fastmodule ms | speedup | fast growth |",
            "|---|---|---|---|---|---|",
        ]
        previous: dict[str, float] = {}
        for p in data["series"]:
            stock = p["stock_ms"]
            prev = previous.get(p["operation"])
            growth = f"{p['fast_ms'] / prev:.2f}x" if prev else ""
            fast = p["fast_ms"]
            stock_s = "skipped" if stock is None else f"{stock:.1f}"
            speed = "" if stock is None else f"{stock / fast:.1f}x"
            cells = [p["operation"], str(p["blocks"]), stock_s, f"{fast:.1f}", speed, growth]
            lines.append("| " + " | ".join(cells) + " |")
            previous[p["operation"]] = p["fast_ms"]
    return "\n".join(lines) + "\n"


def compare(paths: list[str]) -> str:
    """Speedups of several result files side by side, case by case."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    names = [f"Python {r['meta']['python']}, torch {r['meta']['torch']}" for r in runs]
    speedups = [{res["case"]: res["speedup"] for res in r["results"]} for r in runs]
    # stock / lower bound: the speedup a fastmodule as fast as the lower bound would have.
    limits = [
        {res["case"]: res["stock"]["median"] / res["lower"]["median"] for res in r["results"]}
        for r in runs[-2:]
    ]
    cases = [res["case"] for res in runs[-1]["results"]]
    cases += [c for s in speedups for c in s if c not in cases]
    last, before = names[-1].split(",")[0], names[-2].split(",")[0]
    lines = [
        "| case | " + " | ".join(names) + f" | {last} / {before} | the same at the lower bound |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for case in dict.fromkeys(cases):
        cells = [f"{s[case]:.2f}x" if case in s else "" for s in speedups]
        a, b = speedups[-1].get(case), speedups[-2].get(case)
        share = f"{a / b * 100:.0f}%" if a and b else ""
        la, lb = limits[-1].get(case), limits[-2].get(case)
        bound = f"{la / lb * 100:.0f}%" if la and lb else ""
        lines.append(f"| {case} | " + " | ".join(cells) + f" | {share} | {bound} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "--compare":
        if len(argv) < 3:
            print(__doc__, file=sys.stderr)
            return 2
        print(compare(argv[1:]))
        return 0
    bound = argv[0] == "--bound"
    paths = argv[1:] if bound else argv
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(render(p, bound) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
