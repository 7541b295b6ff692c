"""Stock against accelerated on the same inputs, exactly; stock against itself first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fastmodule.acceleration import accelerated
from fastmodule.tools.check.compare import differences
from fastmodule.tools.check.runs import Inputs, RunResult, Snapshot, restored_after, run_once

__all__ = ["Parity", "compare_runs", "check_parity"]


@dataclass(frozen=True)
class Parity:
    """The verdict: ``identical`` (stock and accelerated agree exactly), or where they
    differ; ``nondeterministic`` when two stock runs already differ (then nothing can be
    said about fastmodule)."""

    identical: bool
    nondeterministic: bool
    #: Where the accelerated run differs from the stock run.
    differences: list[str] = field(default_factory=list)
    #: Where the second stock run differs from the first.
    stock_differences: list[str] = field(default_factory=list)
    #: What was compared, in words ("output: 1 tensor; state_dict: 4 entries").
    compared: str = ""


def compare_runs(a: RunResult, b: RunResult) -> list[str]:
    """Where two runs differ: output, then grads, then parameters and buffers after."""
    found = differences(a.output, b.output, "output")
    if a.grads is not None or b.grads is not None:
        found += differences(a.grads, b.grads, "grad")
    found += differences(a.state_after, b.state_after, "after the run")
    return found


def _state_dict(model: torch.nn.Module) -> dict[str, Any]:
    sd = model.state_dict()
    return {
        "keys": list(sd.keys()),
        "values": dict(sd),
        "_metadata": getattr(sd, "_metadata", None),
    }


def _count_tensors(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_count_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_count_tensors(v) for v in value)
    return 0


def check_parity(model: torch.nn.Module, inputs: Inputs, *, train: bool) -> Parity:
    """Run ``model`` stock twice and accelerated once from the same state and compare.

    The model, its grads, training flags and the RNG states are as before when this
    returns (or raises)."""
    snapshot = Snapshot(model)
    with restored_after(snapshot):
        first = run_once(model, inputs, snapshot, train=train)
        second = run_once(model, inputs, snapshot, train=train)
        snapshot.restore()
        stock_sd = _state_dict(model)
        with accelerated(model):
            fast = run_once(model, inputs, snapshot, train=train)
            snapshot.restore()
            fast_sd = _state_dict(model)
    compared = (
        f"output: {_count_tensors(first.output)} tensor(s); "
        + (f"grads: {sum(g is not None for g in first.grads.values())}; " if first.grads else "")
        + f"parameters and buffers after the run: {len(first.state_after)}; "
        + f"state_dict: {len(stock_sd['keys'])} entries"
    )
    stock_differences = compare_runs(first, second)
    if stock_differences:
        return Parity(
            identical=False,
            nondeterministic=True,
            stock_differences=stock_differences,
            compared=compared,
        )
    found = compare_runs(first, fast) + differences(stock_sd, fast_sd, "state_dict")
    return Parity(identical=not found, nondeterministic=False, differences=found, compared=compared)
