"""Which module calls of one run stay on torch's path when accelerated, and why:
the calls are counted on a stock run (a global forward pre-hook, which sends every
call of that one run through torch's code anyway), and each called module is then
asked, accelerated, what its next call would do (``_core.call_handover``: the
native call's own checks)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from fastmodule import _core
from fastmodule.acceleration import NATIVE
from fastmodule.tools.check.runs import Inputs, Snapshot, Way, run_once

__all__ = ["Handover", "CallCount", "count_handovers"]


@dataclass(frozen=True)
class Handover:
    """Calls of one class that run torch's ``_wrapped_call_impl``, for one reason."""

    cls: str
    reason: str
    calls: int
    modules: int


@dataclass(frozen=True)
class CallCount:
    """Module calls in one run, and those that stay on torch's path (by class and why)."""

    calls: int
    handovers: list[Handover]

    @property
    def native_calls(self) -> int:
        """Calls that take fastmodule's native path."""
        return self.calls - sum(h.calls for h in self.handovers)


def count_handovers(
    model: torch.nn.Module,
    inputs: Inputs,
    snapshot: Snapshot,
    *,
    train: bool,
    stock: Way,
    fast: Way,
) -> CallCount:
    """Count one run's module calls (run the ``stock`` way; a run that raises counts
    the calls made until then) and explain, the ``fast`` way, those that hand over to
    torch."""
    counts: Counter[int] = Counter()
    modules: dict[int, torch.nn.Module] = {}

    def count(module: torch.nn.Module, args: object) -> None:
        counts[id(module)] += 1
        modules[id(module)] = module

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        run_once(model, inputs, snapshot, train=train, way=stock)
    finally:
        handle.remove()
        snapshot.restore()
    total = sum(counts.values())
    grouped: Counter[tuple[str, str]] = Counter()
    instances: dict[tuple[str, str], set[int]] = {}
    with fast():
        for key, n in counts.items():
            module = modules[key]
            reason = (
                _core.call_handover(module)
                if NATIVE
                else "fastmodule's native paths are off here (fastmodule doctor says why)"
            )
            if reason is None:
                continue
            group = (type(module).__qualname__, reason)
            grouped[group] += n
            instances.setdefault(group, set()).add(key)
    handovers = [
        Handover(cls, reason, calls, len(instances[(cls, reason)]))
        for (cls, reason), calls in sorted(grouped.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return CallCount(total, handovers)
