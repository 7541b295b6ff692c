"""Code that runs in the middle of a native layer step sees, and is seen by, what stock
torch's ``forward`` would show it.

torch releases the GIL inside its kernels and lets a ``TorchDispatchMode`` (or a
finalizer) run Python code in the middle of an op, so another thread can change a layer
while its ``forward`` is under way. ``_BatchNorm.forward`` reads ``self.momentum``,
``self.training``, the running statistics, ``self.weight``, ``self.bias`` and
``self.eps`` after ``self.num_batches_tracked.add_(1)``: whatever changed inside that
``add_`` is what it uses. These tests make the change deterministically, from a dispatch
mode on the first ``aten.add_``, and compare stock with an accelerated layer: the output,
the running statistics, the parameters by identity, the ops dispatched and, where a
class-level hook was installed in the middle, every attribute read in its order.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.batchnorm as batchnorm
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fastmodule
from fastmodule._verified import layers
from tests.conftest import outcome

pytestmark = pytest.mark.skipif(layers.LAYERS is not None, reason="layer forwards not native here")

C = 3


def _full(v: float) -> torch.Tensor:
    return torch.full((C,), v)


class Recorder:
    """What the run saw: the attribute reads logged by a ``__getattribute__`` installed
    on the layer's class in the middle, the calls of patched functions."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.calls: list[str] = []


def _log_reads(bn: nn.Module, rec: Recorder) -> None:
    """From now on, every attribute read on ``bn`` (its own class) is logged."""

    def logged(self: Any, name: str) -> Any:
        if self is bn and not name.startswith("_"):
            rec.reads.append(name)
        return object.__getattribute__(self, name)

    type(bn).__getattribute__ = logged  # type: ignore[method-assign]


def _counting_property(bn: nn.Module, name: str, rec: Recorder) -> None:
    """``name`` becomes a property of ``bn``'s own class, over its instance value."""
    value = bn.__dict__.pop(name)

    def get(self: Any) -> Any:
        rec.reads.append(name)
        return value

    setattr(type(bn), name, property(get))


@contextlib.contextmanager
def _patched(owner: Any, name: str, new: Any) -> Any:
    old = owner.__dict__[name]
    setattr(owner, name, new)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _patch_f_batch_norm(rec: Recorder) -> Any:
    original = F.batch_norm

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec.calls.append(f"F.batch_norm/{len(args)}")
        return original(*args, **kwargs)

    return _patched(F, "batch_norm", wrapper)


def _shadow_float(rec: Recorder) -> Any:
    def counting_float(x: Any) -> float:
        rec.calls.append("float")
        return float(x) + 1.0

    return _patched_global(batchnorm.__dict__, "float", counting_float)


@contextlib.contextmanager
def _patched_global(g: dict[str, Any], name: str, value: Any) -> Any:
    g[name] = value
    try:
        yield
    finally:
        del g[name]


# What runs inside `self.num_batches_tracked.add_(1)`: (bn, recorder) -> a context
# manager to leave after the call, or None.
MUTATIONS: dict[str, Callable[[nn.Module, Recorder], Any]] = {
    "eval": lambda bn, r: setattr(bn, "training", False),
    "momentum_none": lambda bn, r: setattr(bn, "momentum", None),
    "momentum_half": lambda bn, r: setattr(bn, "momentum", 0.5),
    "momentum_int": lambda bn, r: setattr(bn, "momentum", 1),
    "weight": lambda bn, r: setattr(bn, "weight", nn.Parameter(_full(7.0))),
    "bias_none": lambda bn, r: setattr(bn, "bias", None),
    "running_mean": lambda bn, r: setattr(bn, "running_mean", _full(2.0)),
    "stats_none_eval": lambda bn, r: (
        setattr(bn, "running_mean", None),
        setattr(bn, "running_var", None),
        setattr(bn, "training", False),
    ),
    "untracked": lambda bn, r: setattr(bn, "track_running_stats", False),
    "eval_untracked": lambda bn, r: (
        setattr(bn, "training", False),
        setattr(bn, "track_running_stats", False),
    ),
    "eps": lambda bn, r: setattr(bn, "eps", 0.5),
    "eps_zero": lambda bn, r: setattr(bn, "eps", 0.0),
    "eps_int": lambda bn, r: setattr(bn, "eps", 1),
    "training_int": lambda bn, r: setattr(bn, "training", 0),
    "tracked_replaced": lambda bn, r: (
        setattr(bn, "momentum", None),
        setattr(bn, "num_batches_tracked", torch.tensor(41)),
    ),
    "read_order": lambda bn, r: _log_reads(bn, r),
    "read_order_cma": lambda bn, r: (setattr(bn, "momentum", None), _log_reads(bn, r)),
    "read_order_eval": lambda bn, r: (setattr(bn, "training", False), _log_reads(bn, r)),
    "momentum_property": lambda bn, r: _counting_property(bn, "momentum", r),
    "eps_property": lambda bn, r: _counting_property(bn, "eps", r),
    "patched_f": lambda bn, r: _patch_f_batch_norm(r),
    "shadowed_float": lambda bn, r: (setattr(bn, "momentum", None), _shadow_float(r))[1],
}


class MutateInAdd(TorchDispatchMode):
    """On the first ``aten.add_``: notes whether torch's ``forward`` is on the stack,
    then runs the mutation. Logs every op."""

    def __init__(self, bn: nn.Module, what: str, rec: Recorder) -> None:
        super().__init__()
        self.bn, self.what, self.rec = bn, what, rec
        self.ops: list[str] = []
        self.forward_frame: bool | None = None
        self.leave: Any = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        if func is torch.ops.aten.add_.Tensor and self.forward_frame is None:
            f: Any = sys._getframe(1)
            seen = False
            while f is not None:
                seen |= f.f_code is batchnorm._BatchNorm.forward.__code__
                f = f.f_back
            self.forward_frame = seen
            self.leave = MUTATIONS[self.what](self.bn, self.rec)
            if not hasattr(self.leave, "__exit__"):
                self.leave = None
            else:
                self.leave.__enter__()
        return func(*args, **(kwargs or {}))


def _tensor(x: Any) -> Any:
    return None if x is None else (x.dtype, x.tolist())


def run(cls: type[nn.Module], what: str, shape: tuple[int, ...], accelerate: bool) -> Any:
    """The scenario on a fresh subclass of ``cls`` (class-level changes stay in it)."""
    sub = type(cls.__name__ + "Sub", (cls,), {})
    torch.manual_seed(0)
    bn = sub(C)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    weight, bias = bn.weight, bn.bias
    x = torch.randn(*shape) * 3 + 1
    rec = Recorder()
    mode = MutateInAdd(bn, what, rec)
    ctx = fastmodule.accelerated(bn) if accelerate else contextlib.nullcontext()
    with ctx:
        try:
            with torch.no_grad(), mode:
                got = outcome(lambda: _tensor(bn(x)))
        finally:
            if mode.leave is not None:
                mode.leave.__exit__(None, None, None)
            for name in ("__getattribute__", "momentum", "eps"):
                if name in sub.__dict__:
                    delattr(sub, name)
    d = bn.__dict__
    return {
        "out": got,
        "running_mean": _tensor(d["_buffers"].get("running_mean")),
        "running_var": _tensor(d["_buffers"].get("running_var")),
        "tracked": _tensor(d["_buffers"].get("num_batches_tracked")),
        "weight_same": d["_parameters"].get("weight") is weight,
        "bias_same": d["_parameters"].get("bias") is bias,
        "ops": mode.ops,
        "reads": rec.reads,
        "calls": rec.calls,
        "forward_frame": mode.forward_frame,
    }


@pytest.mark.parametrize("what", list(MUTATIONS))
@pytest.mark.parametrize(
    ("cls", "shape"),
    [(nn.BatchNorm1d, (4, C)), (nn.BatchNorm1d, (4, C, 2)), (nn.BatchNorm2d, (2, C, 2, 2))],
    ids=["bn1d_2d", "bn1d_3d", "bn2d"],
)
def test_batch_norm_reads_after_add_as_stock(
    cls: type[nn.Module], shape: tuple[int, ...], what: str
) -> None:
    stock = run(cls, what, shape, accelerate=False)
    fast = run(cls, what, shape, accelerate=True)
    # The stock side ran torch's forward; the accelerated one the native step.
    assert stock.pop("forward_frame") is True
    assert fast.pop("forward_frame") is False
    assert fast == stock
    if what.startswith("read_order"):
        assert stock["reads"], "the reads after add_ were logged"
    if what in ("momentum_property", "eps_property", "patched_f", "shadowed_float"):
        assert stock["reads"] or stock["calls"]


def test_batch_norm_without_add_reads_as_stock() -> None:
    """Eval mode and untracked statistics make no ``add_``: the step's reads are plain,
    and the values are those set before the call."""
    for setup in (
        lambda bn: bn.eval(),
        lambda bn: setattr(bn, "track_running_stats", False),
        lambda bn: setattr(bn, "momentum", None),
    ):
        results = []
        for accelerate in (False, True):
            torch.manual_seed(0)
            bn = nn.BatchNorm1d(C)
            setup(bn)
            x = torch.randn(4, C)
            ctx = fastmodule.accelerated(bn) if accelerate else contextlib.nullcontext()
            with ctx, torch.no_grad():
                out = [outcome(lambda: _tensor(bn(x))) for _ in range(2)]
            results.append((out, _tensor(bn.running_mean), _tensor(bn.num_batches_tracked)))
        assert results[0] == results[1]
