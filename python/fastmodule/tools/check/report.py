"""What ``check`` found: a readable summary, and JSON for machines."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from fastmodule.tools.check.handovers import CallCount
from fastmodule.tools.check.parity import Parity
from fastmodule.tools.check.timing import Timing, Timings

__all__ = ["CheckReport", "EXIT_DIFFERENT", "EXIT_NONDETERMINISTIC", "EXIT_OK", "SCHEMA"]

#: The JSON layout's version; bumped when a field changes meaning or goes away.
SCHEMA = 1
#: Exit statuses of ``python -m fastmodule check``.
EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_NONDETERMINISTIC = 3


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
            "inputs": self.inputs,
            "mode": self.mode,
            "device": self.device,
            "parity": dataclasses.asdict(self.parity),
            "module_calls": self.calls.calls,
            "native_calls": self.calls.native_calls,
            "handovers": [dataclasses.asdict(h) for h in self.calls.handovers],
            "timings": dataclasses.asdict(self.timings) if self.timings else None,
            "speedup": self.timings.speedup if self.timings else None,
            "compiled_speedup": self.timings.compiled_speedup if self.timings else None,
            "exit_status": self.exit_status,
        }

    def dumps(self) -> str:
        """:meth:`to_json` as a JSON text."""
        return json.dumps(self.to_json(), indent=2)

    def format(self) -> str:
        """The report as lines for a terminal."""
        p = self.parity
        lines = [
            f"fastmodule check  {self.model}  ({self.mode}, {self.device}, inputs {self.inputs})"
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
