"""What ``check`` found: a readable summary, and JSON for machines."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fastmodule.tools.check.handovers import CallCount
from fastmodule.tools.check.parity import Parity
from fastmodule.tools.check.runs import CheckError
from fastmodule.tools.check.timing import NOISY, Timing, Timings

__all__ = [
    "CheckReport",
    "EXIT_DIFFERENT",
    "EXIT_NONDETERMINISTIC",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "SCHEMA",
    "raised_json",
]

#: The JSON layout's version; bumped when a field changes meaning or goes away.
SCHEMA = 1
#: Exit statuses of ``python -m fastmodule check``.
EXIT_OK = 0
EXIT_DIFFERENT = 1
#: The factory, the options or the inputs cannot be used, or the model raised on the
#: inputs in every run.
EXIT_UNUSABLE = 2
EXIT_NONDETERMINISTIC = 3


def raised_json(error: CheckError | None) -> dict[str, Any] | None:
    """For the JSON of an error (``check --json`` when nothing could be compared): which
    run raised and what, when the model raised; None otherwise."""
    if error is None or error.error is None:
        return None
    return {
        "run": error.run,
        "type": error.error.type,
        "message": error.error.message,
        "where": error.error.where,
    }


@dataclass(frozen=True)
class CheckReport:
    """The model checked, the parity verdict and (unless skipped) the timings."""

    model: str
    inputs: str
    mode: str
    device: str
    parity: Parity
    #: Module calls of one run, and those that stay on torch's path, by class and why.
    calls: CallCount
    timings: Timings | None
    #: torch's intra-op threads during the check.
    threads: int = 1
    #: Things to know about this check (lazy modules materialised, not timed, ...).
    notes: list[str] = field(default_factory=list)
    #: The model's method each run called (None: the model itself, its forward).
    method: str | None = None

    def __str__(self) -> str:
        return self.format()

    @property
    def all_notes(self) -> list[str]:
        """:attr:`notes`, and a note when the timings say the machine is noisy."""
        notes = list(self.notes)
        t = self.timings
        if t is not None and t.noisy:
            notes.append(
                f"the timings are noisy: the slowest round took {t.spread:.1f}x the fastest "
                f"(over {NOISY:g}x): the machine is busy, so the speedups are rough; rerun "
                "on an idle machine or with more --repeats"
            )
        return notes

    @property
    def exit_status(self) -> int:
        """0 identical, 1 different, 3 nondeterministic (nothing could be compared)."""
        if self.parity.nondeterministic:
            return EXIT_NONDETERMINISTIC
        return EXIT_OK if self.parity.identical else EXIT_DIFFERENT

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``schema`` gives the layout's version)."""
        return {
            "schema": SCHEMA,
            "model": self.model,
            "method": self.method,
            "inputs": self.inputs,
            "mode": self.mode,
            "device": self.device,
            "threads": self.threads,
            "parity": dataclasses.asdict(self.parity),
            "module_calls": self.calls.calls,
            "native_calls": self.calls.native_calls,
            "handovers": [dataclasses.asdict(h) for h in self.calls.handovers],
            "timings": dataclasses.asdict(self.timings) if self.timings else None,
            "speedup": self.timings.speedup if self.timings else None,
            "compiled_speedup": self.timings.compiled_speedup if self.timings else None,
            "notes": self.all_notes,
            "exit_status": self.exit_status,
        }

    def dumps(self) -> str:
        """:meth:`to_json` as a JSON text."""
        return json.dumps(self.to_json(), indent=2)

    def format(self) -> str:
        """The report as lines for a terminal."""
        p = self.parity
        threads = f"{self.threads} thread{'' if self.threads == 1 else 's'}"
        called = f"{self.model}.{self.method}" if self.method else self.model
        lines = [
            f"fastmodule check  {called}  ({self.mode}, {self.device}, {threads}, "
            f"inputs {self.inputs})"
        ]
        if p.nondeterministic:
            lines.append("parity       NOT CHECKED: two stock runs from the same state differ")
            lines += [f"             {d}" for d in p.stock_differences]
            lines.append(
                "             the model is nondeterministic (not a fastmodule difference); "
                "make it deterministic (torch.use_deterministic_algorithms(True), eval "
                "mode) to check it"
            )
        elif p.identical:
            lines.append(f"parity       identical  ({p.compared})")
        else:
            lines.append("parity       DIFFERENT from stock")
            lines += [f"             {d}" for d in p.differences]
        lines += [f"             not compared: {n}" for n in p.not_compared]
        d = p.diverged
        if d is not None and d.module is not None:
            lines.append(f"diverges at  {d.describe()}: the first module whose output differs")
            lines += [f"             {x}" for x in d.differences]
            if d.note:
                lines.append(f"             ({d.note})")
        elif d is not None:
            lines.append("diverges at  no module named" + (f": {d.note}" if d.note else ""))
            lines += [f"             {x}" for x in d.differences]
        c = self.calls
        lines.append(
            f"module calls {c.native_calls} of {c.calls} in one run take fastmodule's native path"
        )
        if c.handovers:
            lines.append("torch's path (class, modules, calls: why)")
            width = max(len(h.cls) for h in c.handovers)
            lines += [
                f"  {h.cls:<{width}}  {_count(h.modules, 'module'):>11}  "
                f"{_count(h.calls, 'call'):>11}: {h.reason}"
                for h in c.handovers
            ]
        t = self.timings
        if t is not None:
            lines.append(
                f"timing       per call, median (min-max) of {t.repeats} interleaved rounds"
            )
            lines.append(f"  stock          {_fmt(t.stock)}")
            lines.append(f"  fastmodule     {_fmt(t.fast)}  {t.speedup:.2f}x")
            if t.compiled is not None and t.compiled_speedup is not None:
                lines.append(
                    f"  torch.compile  {_fmt(t.compiled)}  {t.compiled_speedup:.2f}x"
                    f"  (compiling took {t.compile_s:.1f} s)"
                )
            elif t.compile_note:
                lines.append(f"  torch.compile  {t.compile_note}")
        lines += [f"note         {n}" for n in self.all_notes]
        return "\n".join(lines)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def _fmt(t: Timing) -> str:
    return f"{_seconds(t.median):>10}  ({_seconds(t.min)}-{_seconds(t.max)})"
