"""One run of a model on example inputs, repeatable: the same RNG state, the same
parameters, buffers and grads before it, fresh copies of the inputs; what it returned
or raised, kept as a copy later runs cannot change."""

from __future__ import annotations

import contextlib
import os
import random
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parameter import is_lazy

from fastmodule.tools.check.compare import Captured, capture, is_numpy_array

__all__ = [
    "CheckError",
    "Inputs",
    "RunError",
    "RunResult",
    "Snapshot",
    "Way",
    "grad_mode",
    "run_once",
    "scalar_loss",
]

#: A way of running the model: a context manager factory (stock, or accelerated).
Way = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True)
class Inputs:
    """What each run calls, and with what: ``model(*args, **kwargs)``, or with
    ``method`` ``getattr(model, method)(*args, **kwargs)`` (``agent.get_action_and_value``,
    ``policy.predict``, ``lm.generate``), looked up on every call as a user's code
    looks it up."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: The model's method each run calls; None: the model itself (its ``forward``).
    method: str | None = None

    def fresh(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Copies of the tensors and NumPy arrays in the inputs (a model may change its
        inputs in place)."""
        return _fresh(self.args), _fresh(self.kwargs)

    def target(self, model: Any) -> Callable[..., Any]:
        """What a run calls: ``model``, or its bound ``method``."""
        return model if self.method is None else getattr(model, self.method)

    def call(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One call, exactly as a user makes it: ``model(*args, **kwargs)`` or
        ``getattr(model, method)(*args, **kwargs)``."""
        return self.target(model)(*args, **kwargs)

    @property
    def what(self) -> str:
        """What each run calls, in words: ``forward`` or the method's name."""
        return self.method or "forward"


def _fresh(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        copy = value.detach().clone()
        return copy.requires_grad_(value.requires_grad) if value.is_leaf else copy
    if is_numpy_array(value):
        return value.copy()
    if type(value) in (list, tuple):
        return type(value)(_fresh(v) for v in value)
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class RunError:
    """What a run raised: the exception's type and message, and where (the innermost
    frame outside torch and fastmodule, when there is one)."""

    type: str
    message: str
    where: str | None

    @classmethod
    def of(cls, error: BaseException) -> RunError:
        """The error as the report shows it."""
        frames = traceback.extract_tb(error.__traceback__)
        user = [f for f in frames if not _library_frame(f.filename)]
        frame = (user or frames or [None])[-1]
        where = f"{_shown_path(frame.filename)}:{frame.lineno}" if frame is not None else None
        t = type(error)
        name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        return cls(name, str(error), where)

    def same_as(self, other: RunError) -> bool:
        """The same exception type and message (where may differ: another code path)."""
        return (self.type, self.message) == (other.type, other.message)

    def __str__(self) -> str:
        at = f" (at {self.where})" if self.where else ""
        return f"{self.type}: {self.message}{at}"


def _shown_path(filename: str) -> str:
    """``filename`` relative to the current directory when it is under it."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive
        return filename
    return filename if relative.startswith("..") else relative


def _library_frame(filename: str) -> bool:
    parts = filename.replace("\\", "/").split("/")
    return "fastmodule" in parts or ("torch" in parts and "site-packages" in parts)


class CheckError(Exception):
    """``check`` could not compare anything: the model raised on the inputs in every run,
    or it cannot be run stock here. ``run`` names the run that raised (None when none
    did) and ``error`` is what it raised."""

    def __init__(self, message: str, run: str | None = None, error: RunError | None = None):
        super().__init__(message)
        self.run = run
        self.error = error


@dataclass
class RunResult:
    """What one run produced: its output (or what it raised), with ``train`` each
    parameter's grad, and the parameters and buffers after it."""

    output: Captured | None
    error: RunError | None
    grads: Captured | None
    #: Parameters and buffers after the run (running statistics, in-place updates).
    state_after: Captured


class Snapshot:
    """Parameters and buffers (the registered objects and their values), grads,
    training flags and every RNG state of a model, taken once and put back before each
    run (and after the last).

    Tensors are restored by rebinding what was registered (a buffer that ``forward``
    rebinds to a new tensor, of another shape, gets its original back, with its
    original values) and removing what a run registered anew. Lazy parameters not yet
    materialised are left alone."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.modules = [m for _, m in model.named_modules(remove_duplicate=False)]
        self.registered = {id(m): (dict(m._parameters), dict(m._buffers)) for m in self.modules}
        self.values = {
            id(t): t.detach().clone() for t in _registered_tensors(self.modules) if not is_lazy(t)
        }
        self.grads = {
            id(p): p.grad for m in self.modules for p in m._parameters.values() if p is not None
        }
        self.training = [(m, m.training) for m in self.modules]
        self.python_rng = random.getstate()
        self.torch_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self) -> None:
        """Put everything back as it was when the snapshot was taken."""
        for m in self.modules:
            params, buffers = self.registered[id(m)]
            for registry, saved in ((m._parameters, params), (m._buffers, buffers)):
                if list(registry) != list(saved) or any(
                    registry[k] is not v for k, v in saved.items()
                ):
                    registry.clear()
                    registry.update(saved)
        with torch.no_grad():
            for t in _registered_tensors(self.modules):
                value = self.values.get(id(t))
                if value is not None and not is_lazy(t):
                    if t.shape != value.shape:  # resized in place (resize_, set_)
                        t.set_(value.clone())
                    else:
                        t.copy_(value)
        for m in self.modules:
            for p in m._parameters.values():
                if p is not None and id(p) in self.grads:
                    p.grad = self.grads[id(p)]
        for m, training in self.training:
            m.training = training
        random.setstate(self.python_rng)
        torch.random.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def _registered_tensors(modules: list[torch.nn.Module]) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    for m in modules:
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                yield t


def scalar_loss(output: Any) -> torch.Tensor | None:
    """A scalar to call ``backward()`` on: the sum of every floating-point tensor of
    ``output`` that requires grad (None when there is none)."""
    parts = [t.float().sum() for t in _floating(output, set()) if t.requires_grad]
    if not parts:
        return None
    return torch.stack(parts).sum()


def _floating(value: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield value.real if value.is_complex() else value
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _floating(v, seen)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floating(v, seen)


def grad_mode(train: bool) -> contextlib.AbstractContextManager[Any]:
    """The grad mode of every run, compared and timed alike: ``torch.no_grad()`` for
    a forward, grad enabled for a train step."""
    return torch.enable_grad() if train else torch.no_grad()


def run_once(
    model: torch.nn.Module, inputs: Inputs, snapshot: Snapshot, *, train: bool, way: Way
) -> RunResult:
    """Restore ``snapshot``, run the model once inside ``way()`` (a call of it, or of
    ``inputs.method``, under ``torch.no_grad()``; with ``train``: in training mode with
    grad, then ``backward()`` of :func:`scalar_loss`) and keep copies of what it
    produced or what it raised."""
    snapshot.restore()
    args, kwargs = inputs.fresh()
    output: Any = None
    error: RunError | None = None
    grads: Captured | None = None
    if train:
        model.train()
        for p in model.parameters():
            p.grad = None
    try:
        with way(), grad_mode(train):
            output = inputs.call(model, args, kwargs)
            if train:
                loss = scalar_loss(output)
                if loss is not None:
                    loss.backward()
    except Exception as e:  # noqa: BLE001 - what the model raised is a result too
        error = RunError.of(e)
    if train:
        grads = capture(
            {
                name: (p.grad.detach().clone() if p.grad is not None else None)
                for name, p in model.named_parameters()
            }
        )
    captured = capture(output) if error is None else None
    return RunResult(captured, error, grads, capture(_values(model)))


def _values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: t
        for name, t in (*model.named_parameters(), *model.named_buffers())
        if t is not None and not is_lazy(t)
    }


@contextlib.contextmanager
def restored_after(snapshot: Snapshot) -> Iterator[None]:
    """Put the snapshot back when the block ends, however it ends."""
    try:
        yield
    finally:
        snapshot.restore()
