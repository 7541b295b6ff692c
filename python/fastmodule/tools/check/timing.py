"""Stock, accelerated and ``torch.compile`` timed on the same model, interleaved."""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fastmodule.acceleration import accelerated
from fastmodule.tools.check.runs import Inputs, Snapshot, restored_after, scalar_loss

if TYPE_CHECKING:
    from fastmodule.bench.progress import Progress

__all__ = ["Timing", "Timings", "time_model"]


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


def _step(
    model: torch.nn.Module, inputs: Inputs, train: bool, sync: Callable[[], None] | None
) -> Callable[[], None]:
    args, kwargs = inputs.fresh()

    def call() -> None:
        if train:
            for p in model.parameters():
                p.grad = None
            loss = scalar_loss(model(*args, **kwargs))
            if loss is not None:
                loss.backward()
        else:
            with torch.no_grad():
                model(*args, **kwargs)
        if sync is not None:
            sync()

    return call


def _loop(
    call: Callable[[], None], context: Callable[[], contextlib.AbstractContextManager[object]]
):
    def run(number: int) -> float:
        with context():
            start = time.perf_counter()
            for _ in range(number):
                call()
            return time.perf_counter() - start

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
) -> Timings:
    """Time stock, accelerated and (with ``compile``) ``torch.compile`` of a copy of
    ``model``, ``repeats`` interleaved rounds of about ``target_s`` seconds each."""
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    snapshot = Snapshot(model)
    with restored_after(snapshot):
        if train:
            model.train()
        call = _step(model, inputs, train, sync)

        @contextlib.contextmanager
        def fast() -> Iterator[None]:
            with accelerated(model):
                yield

        loops = {"stock": _loop(call, contextlib.nullcontext), "fast": _loop(call, fast)}
        compiled_note: str | None = None
        compile_s: float | None = None
        if compile:
            if progress:
                progress.step("torch.compile (first call compiles)")
            try:
                twin = copy.deepcopy(model)
                compiled_model = torch.compile(twin)
                compiled_call = _step(compiled_model, inputs, train, sync)  # type: ignore[arg-type]
                start = time.perf_counter()
                compiled_call()
                compile_s = time.perf_counter() - start
                loops["compiled"] = _loop(compiled_call, contextlib.nullcontext)
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
