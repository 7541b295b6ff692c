"""``fastmodule.check(model, *args, **kwargs)``: is the accelerated model exactly the
stock one on these inputs, and how much faster is it?

Acceleration is per class and in place, so the comparison runs in one process on one
model object: stock, stock again (a model that differs from itself is reported as
nondeterministic), then accelerated, each from the same parameters, buffers, grads
and RNG states; then the three ways of running it (stock, accelerated,
``torch.compile`` of a copy) are timed interleaved.
"""

from __future__ import annotations

from typing import Any

import torch

from fastmodule import _core
from fastmodule.acceleration import NATIVE
from fastmodule.module import Module
from fastmodule.tools.check.handovers import CallCount, count_handovers
from fastmodule.tools.check.parity import Parity, check_parity
from fastmodule.tools.check.report import CheckReport
from fastmodule.tools.check.runs import Inputs, Snapshot
from fastmodule.tools.check.timing import Timings, time_model

__all__ = ["CallCount", "CheckReport", "Parity", "Timings", "check", "describe_inputs"]


def _core_accelerated(cls: type) -> bool:
    return NATIVE and _core.is_accelerated_class(cls)


def describe_inputs(inputs: Inputs) -> str:
    """``1x3x224x224 float32`` for each tensor argument, ``name=...`` for keywords."""

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            shape = "x".join(str(n) for n in value.shape) or "scalar"
            return f"{shape} {str(value.dtype).removeprefix('torch.')}"
        return type(value).__name__

    parts = [one(a) for a in inputs.args] + [f"{k}={one(v)}" for k, v in inputs.kwargs.items()]
    return ", ".join(parts) or "none"


def check(
    model: torch.nn.Module,
    *example_args: Any,
    train: bool = False,
    timing: bool = True,
    compile: bool = True,
    repeats: int = 15,
    progress: bool = True,
    **example_kwargs: Any,
) -> CheckReport:
    """Compare ``model(*example_args, **example_kwargs)`` stock and accelerated, exactly,
    and time both (and ``torch.compile`` unless ``compile=False``).

    With ``train=True`` each run is a forward and a ``backward()`` of the sum of the
    floating-point outputs in training mode, and the grads are compared too. The
    parameters, buffers, grads, training flags and RNG states of ``model`` are as
    before when this returns; classes that were accelerated before stay so.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: the model holds ``fastmodule.Module`` subclasses (they have no
            stock version to compare with: build it from ``torch.nn`` classes).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fastmodule.check expects a torch.nn.Module, got {type(model).__name__}")
    native_classes = sorted(
        {type(m).__qualname__ for m in model.modules() if isinstance(m, Module)}
    )
    if native_classes:
        raise ValueError(
            "fastmodule.check compares a model with its stock self, and these classes are "
            f"fastmodule.Module subclasses with no stock version: {', '.join(native_classes)}. "
            "Build the model from torch.nn classes; check accelerates it itself."
        )
    inputs = Inputs(tuple(example_args), dict(example_kwargs))
    # Classes accelerated before (accelerate(), install()) run stock for the check.
    before = [cls for cls in {type(m): None for m in model.modules()} if _core_accelerated(cls)]
    for cls in before:
        _core.restore_class(cls)
    try:
        steps = 1 + ((repeats + (1 if compile else 0)) if timing else 0)
        bar = None
        if progress:
            # (The bench package is imported only when a check runs.)
            from fastmodule.bench.progress import Progress

            bar = Progress(steps)
        if bar:
            bar.step("parity: stock, stock again, accelerated; counting module calls")
        parity = check_parity(model, inputs, train=train)
        calls = count_handovers(model, inputs, Snapshot(model), train=train)
        timings = (
            time_model(model, inputs, train=train, repeats=repeats, compile=compile, progress=bar)
            if timing
            else None
        )
        if bar:
            bar.done()
    finally:
        for cls in before:
            _core.accelerate_class(cls)
    device = next((str(t.device) for t in model.parameters()), "cpu")
    return CheckReport(
        model=type(model).__qualname__,
        inputs=describe_inputs(inputs),
        mode="train step (forward + backward)" if train else "forward",
        device=device,
        parity=parity,
        calls=calls,
        timings=timings,
    )
