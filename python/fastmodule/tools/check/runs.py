"""One run of a model on example inputs, repeatable: the same RNG state, the same
parameters, buffers and grads before it, fresh copies of the inputs."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fastmodule.tools.check.compare import detached

__all__ = ["Inputs", "RunResult", "Snapshot", "run_once", "scalar_loss"]


@dataclass(frozen=True)
class Inputs:
    """Example positional and keyword arguments of ``model(*args, **kwargs)``."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def fresh(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Copies of the tensors in the inputs (a model may change its inputs in place)."""
        return _fresh(self.args), _fresh(self.kwargs)


def _fresh(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_(value.requires_grad) if value.is_leaf else copy
    if type(value) in (list, tuple):
        return type(value)(_fresh(v) for v in value)
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    return value


@dataclass
class RunResult:
    """What one run produced: its output, and with ``train`` each parameter's grad."""

    output: Any
    grads: dict[str, torch.Tensor | None] | None
    #: Parameters and buffers after the run (running statistics, in-place updates).
    state_after: dict[str, torch.Tensor]


class Snapshot:
    """Parameters' and buffers' values, grads, training flags and every RNG state of
    a model, taken once and put back before each run (and after the last)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.values = _values(model)
        self.grads = {name: p.grad for name, p in model.named_parameters()}
        self.training = {name: m.training for name, m in model.named_modules()}
        self.python_rng = random.getstate()
        self.torch_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        """Put everything back as it was when the snapshot was taken."""
        with torch.no_grad():
            for name, t in _tensors(self.model):
                if t is not None and name in self.values:
                    t.copy_(self.values[name])
        for name, p in self.model.named_parameters():
            p.grad = self.grads.get(name)
        for name, m in self.model.named_modules():
            if name in self.training:
                m.training = self.training[name]
        random.setstate(self.python_rng)
        torch.random.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor | None]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def scalar_loss(output: Any) -> torch.Tensor | None:
    """A scalar to call ``backward()`` on: the sum of every floating-point tensor of
    ``output`` that requires grad (None when there is none)."""
    parts = [t.float().sum() for t in _floating(output) if t.requires_grad]
    if not parts:
        return None
    return torch.stack(parts).sum()


def _floating(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield value.real if value.is_complex() else value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _floating(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floating(v)


def run_once(
    model: torch.nn.Module, inputs: Inputs, snapshot: Snapshot, *, train: bool
) -> RunResult:
    """Restore ``snapshot``, run the model once (with ``train``: in training mode, then
    ``backward()`` of :func:`scalar_loss`) and keep copies of what it produced."""
    snapshot.restore()
    args, kwargs = inputs.fresh()
    if not train:
        output = model(*args, **kwargs)
        return RunResult(detached(output), None, _values(model))
    model.train()
    for p in model.parameters():
        p.grad = None
    output = model(*args, **kwargs)
    loss = scalar_loss(output)
    if loss is not None:
        loss.backward()
    grads = {
        name: (p.grad.detach().clone() if p.grad is not None else None)
        for name, p in model.named_parameters()
    }
    return RunResult(detached(output), grads, _values(model))


def _values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {name: t.detach().clone() for name, t in _tensors(model) if t is not None}


@contextlib.contextmanager
def restored_after(snapshot: Snapshot) -> Iterator[None]:
    """Put the snapshot back when the block ends, however it ends."""
    try:
        yield
    finally:
        snapshot.restore()
