"""Environment metadata, the side-by-side table and the JSON report."""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any, TextIO

import torch

import fastmodule  # upward: its __version__, defined once in the package's __init__
from fastmodule.bench.case import KINDS
from fastmodule.bench.runner import CaseResult, Settings
from fastmodule.bench.series import SeriesPoint
from fastmodule.bench.synthetic import FastIdentity
from fastmodule.module import slots_of

__all__ = ["collect_meta", "format_header", "format_table", "result_to_dict", "write_json"]


def cpu_model() -> str:
    """The CPU model from ``/proc/cpuinfo`` ("model name"), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def collect_meta(threads: int, device: str, settings: Settings, quick: bool) -> dict[str, Any]:
    """Everything needed to interpret (and reproduce) a run."""
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastmodule": fastmodule.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "threads": threads,
        "device": device,
        "quick": quick,
        "repeats": settings.repeats,
        "target_s": settings.target_s,
        "fast_slots": dict(
            zip(("call", "getattr", "setattr"), slots_of(FastIdentity), strict=True)
        ),
    }
    if device == "cuda":
        meta["cuda_device"] = torch.cuda.get_device_name()
    return meta


def _symbols(stream: TextIO) -> tuple[str, str]:
    """``(micro, dash)``, falling back to ASCII when ``stream`` cannot encode them."""
    try:
        "µ–".encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return "u", "-"
    return "µ", "–"


def _cell(stats: Any, micro: str, dash: str) -> str:
    """``median (min–max)`` in ns below 1 µs, else in µs."""
    if stats.median < 1e3:
        scale, unit, digits = 1.0, "ns", 1
    else:
        scale, unit, digits = 1e3, f"{micro}s", 2 if stats.median < 1e5 else 1
    med, lo, hi = (v / scale for v in (stats.median, stats.min, stats.max))
    return f"{med:.{digits}f} {unit} ({lo:.{digits}f}{dash}{hi:.{digits}f})"


def format_header(meta: dict[str, Any]) -> str:
    """The lines printed above the table."""
    slots = ", ".join(k for k, on in meta["fast_slots"].items() if on) or "none"
    device = meta["device"] + (f" ({meta['cuda_device']})" if "cuda_device" in meta else "")
    return "\n".join(
        [
            f"fastmodule bench  {meta['date']}",
            f"python {meta['python']}  torch {meta['torch']}  fastmodule {meta['fastmodule']}",
            f"platform {meta['platform']}  cpu {meta['cpu']}",
            f"threads {meta['threads']}  device {device}  native slots: {slots}",
            f"{meta['repeats']} interleaved repeats of ~{meta['target_s'] * 1e3:g} ms loops"
            + ("  (--quick)" if meta["quick"] else ""),
        ]
    )


def format_table(results: list[CaseResult], stream: TextIO = sys.stdout) -> str:
    """The side-by-side table: per-op median (min–max) per column, speedup, overhead removed."""
    micro, dash = _symbols(stream)
    head = ["case", "stock", "fastmodule", "lower bound", "speedup", "overhead removed"]
    with_compile = any(r.compiled is not None for r in results)
    if with_compile:
        head += ["torch.compile", "compile time"]
    rows = []
    for r in results:
        speedup = f"{r.speedup:.2f}x" if r.speedup is not None else "n/a"
        removed = r.overhead_removed
        row = (
            [r.case]
            + [_cell(r.stats[k], micro, dash) for k in KINDS]
            + [speedup, f"{removed * 100:.0f}%" if removed is not None else "n/a"]
        )
        if with_compile:
            if r.compiled is not None and r.compile_s is not None:
                row += [_cell(r.compiled, micro, dash), f"{r.compile_s:.1f} s"]
            else:
                row += ["", ""]
        rows.append(row)
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)])

    out = [line(head), line(["-" * w for w in widths])] + [line(row) for row in rows]
    out.append(
        "per-op median (min-max) over repeats; speedup = stock/fast; "
        "overhead removed = (stock - fast)/(stock - lower)\n"
        "lower bound: the same math without modules (real models: every module call goes "
        "straight to forward, attribute reads stay stock, so fastmodule can beat it: >100%)"
    )
    if any(r.case.startswith("root_") for r in results):
        out.append(
            "root_*: lower bound = the same tree with each module whose class has bases after "
            "nn.Module made a plain nn.Module node (same names), accelerated"
        )
    if any(r.case.startswith("step_") for r in results):
        out.append(
            "step_*: lower bound = module calls straight to forward, registered names also "
            "plain instance attributes, clip over a pre-built list: stock/lower is the most a "
            "module runtime could win"
        )
    if any(r.case.startswith("workload_") for r in results):
        out.append(
            "workload_*: the whole program timed (data prep, env step, solver, optimizer); "
            "lower bound = its model math in functional calls on the same weights (RL, ODE, "
            "PINN) or module calls straight to forward (timm, sentence encoder)"
        )
    return "\n".join(out)


def result_to_dict(result: CaseResult) -> dict[str, Any]:
    """One entry of the JSON ``results`` list."""
    entry: dict[str, Any] = {"case": result.case, "unit": "ns", "device": result.device}
    for kind in KINDS:
        s = result.stats[kind]
        entry[kind] = {"median": s.median, "min": s.min, "max": s.max}
    entry["speedup"] = result.speedup
    entry["overhead_removed"] = result.overhead_removed
    entry["iterations"] = result.iterations
    if result.compiled is not None:
        c = result.compiled
        entry["compiled"] = {"median": c.median, "min": c.min, "max": c.max}
        entry["compile_s"] = result.compile_s
    return entry


def write_json(
    path: str | Path,
    meta: dict[str, Any],
    results: list[CaseResult],
    series: list[SeriesPoint] | None = None,
) -> None:
    """Write ``{"meta": ..., "results": [...], "series": [...]}`` to ``path``."""
    data: dict[str, Any] = {"meta": meta, "results": [result_to_dict(r) for r in results]}
    if series is not None:
        data["series"] = [dataclasses.asdict(p) for p in series]
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
