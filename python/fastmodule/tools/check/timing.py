"""Stock, accelerated and ``torch.compile`` timed on the same model, interleaved."""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fastmodule.tools.check.runs import (
    CheckError,
    Inputs,
    RunError,
    Snapshot,
    Way,
    grad_mode,
    restored_after,
    scalar_loss,
)

if TYPE_CHECKING:
    from fastmodule.bench.progress import Progress

__all__ = ["NOISY", "Timing", "Timings", "time_model"]

#: Slowest over fastest sample of one way of running above this: the machine is noisy.
NOISY = 2.0


@dataclass(frozen=True)
class Timing:
    """Seconds per call over the repeats: median, min and max."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        """Summarise per-call samples."""
        return cls(statistics.median(samples), min(samples), max(samples))

    @property
    def spread(self) -> float:
        """Slowest sample over fastest."""
        return self.max / self.min if self.min > 0 else float("inf")


@dataclass(frozen=True)
class Timings:
    """Each way of running the model, and torch.compile's first call apart."""

    stock: Timing
    fast: Timing
    compiled: Timing | None
    compile_s: float | None
    #: Why torch.compile was not timed (off, or the error it raised).
    compile_note: str | None
    calls_per_sample: int
    repeats: int

    @property
    def speedup(self) -> float:
        """Median stock time over median accelerated time."""
        return self.stock.median / self.fast.median

    @property
    def compiled_speedup(self) -> float | None:
        """Median stock time over median compiled time."""
        return self.stock.median / self.compiled.median if self.compiled else None

    @property
    def spread(self) -> float:
        """The widest slowest-over-fastest ratio of stock, fastmodule and compiled."""
        return max(t.spread for t in (self.stock, self.fast, self.compiled) if t is not None)

    @property
    def noisy(self) -> bool:
        """Samples of one way of running spread wider than :data:`NOISY` times."""
        return self.spread > NOISY


def _step(
    model: torch.nn.Module,
    run: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    inputs: Inputs,
    train: bool,
    sync: Callable[[], None] | None,
) -> Callable[[], None]:
    """One timed call: ``run(args, kwargs)`` on fresh copies of the inputs (the model's
    grads cleared first with ``train``)."""
    args, kwargs = inputs.fresh()

    def call() -> None:
        # The grad mode of the parity runs (runs.grad_mode).
        with grad_mode(train):
            if train:
                for p in model.parameters():
                    p.grad = None
                loss = scalar_loss(run(args, kwargs))
                if loss is not None:
                    loss.backward()
            else:
                run(args, kwargs)
        if sync is not None:
            sync()

    return call


def _compiled(twin: torch.nn.Module, inputs: Inputs) -> Callable[..., Any]:
    """``torch.compile`` of what each run calls: the model (its ``forward``), or with a
    method the twin's bound method (``torch.compile(twin.generate)``: the model's
    compiled call would reach the method uncompiled, through its ``__getattr__``)."""
    return torch.compile(inputs.target(twin))


def _loop(
    kind: str, call: Callable[[], None], context: Way, reset: Callable[[], None]
) -> Callable[[int], float]:
    def run(number: int) -> float:
        reset()  # each timed loop from the same state (untimed)
        try:
            with context():
                start = time.perf_counter()
                for _ in range(number):
                    call()
                return time.perf_counter() - start
        except Exception as e:
            error = RunError.of(e)
            raise CheckError(
                f"the {kind} run raised while being timed (calls in a row, each from the "
                f"state the one before left): {error}",
                run=f"{kind} run (timing)",
                error=error,
            ) from e

    return run


def time_model(
    model: torch.nn.Module,
    inputs: Inputs,
    *,
    train: bool,
    repeats: int = 15,
    target_s: float = 0.1,
    compile: bool = True,
    progress: Progress | None = None,
    stock: Way = contextlib.nullcontext,
    fast: Way | None = None,
) -> Timings:
    """Time ``model`` run the ``stock`` way, the ``fast`` way (default: accelerated) and
    (with ``compile``) ``torch.compile`` of a copy of it, ``repeats`` interleaved rounds
    of about ``target_s`` seconds each. Each call is what ``inputs`` says (the model,
    or its method; compiled: ``torch.compile`` of the copy's bound method). Each timed
    loop of calls starts from the state the model had (its parameters, buffers, grads
    and RNG put back, untimed).

    Raises:
        CheckError: a run raised while being timed (``check`` notes it: no timings).
    """
    if fast is None:
        from fastmodule.acceleration import accelerated

        fast_way: Way = lambda: accelerated(model)  # noqa: E731
    else:
        fast_way = fast
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    snapshot = Snapshot(model)
    with restored_after(snapshot):
        if train:
            model.train()
        call = _step(
            model, lambda args, kwargs: inputs.call(model, args, kwargs), inputs, train, sync
        )

        def reset() -> None:
            snapshot.restore()
            if train:
                model.train()

        loops = {
            "stock": _loop("stock", call, stock, reset),
            "fast": _loop("accelerated", call, fast_way, reset),
        }
        compiled_note: str | None = None
        compile_s: float | None = None
        if compile:
            if progress:
                progress.step("torch.compile (first call compiles)")
            try:
                twin = copy.deepcopy(model)
                twin_snapshot = Snapshot(twin)

                def reset_twin() -> None:
                    twin_snapshot.restore()
                    if train:
                        twin.train()

                compiled = _compiled(twin, inputs)
                compiled_call = _step(
                    twin, lambda args, kwargs: compiled(*args, **kwargs), inputs, train, sync
                )
                start = time.perf_counter()
                compiled_call()
                compile_s = time.perf_counter() - start
                loops["compiled"] = _loop(
                    "torch.compile", compiled_call, contextlib.nullcontext, reset_twin
                )
            except Exception as error:  # noqa: BLE001 - reported, the rest still runs
                compiled_note = f"torch.compile failed: {type(error).__name__}: {error}"
        else:
            compiled_note = "not timed (--no-compile)"
        # A warm-up call of each (caches, allocator, lazy init), then one timed call
        # each for a loop count of about target_s.
        for loop in loops.values():
            loop(1)
        single = {kind: max(loop(1), 1e-9) for kind, loop in loops.items()}
        number = max(1, round(target_s / max(single.values())))
        samples: dict[str, list[float]] = {kind: [] for kind in loops}
        for r in range(repeats):
            if progress:
                progress.step(f"timing round {r + 1}/{repeats}")
            for kind, loop in loops.items():
                samples[kind].append(loop(number) / number)
    return Timings(
        stock=Timing.of(samples["stock"]),
        fast=Timing.of(samples["fast"]),
        compiled=Timing.of(samples["compiled"]) if "compiled" in samples else None,
        compile_s=compile_s,
        compile_note=compiled_note,
        calls_per_sample=number,
        repeats=repeats,
    )
