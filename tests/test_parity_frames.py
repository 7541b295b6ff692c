"""torch's own forwards that count their caller's frames keep stock's frames.

A native module call has no ``_wrapped_call_impl``/``_call_impl`` frames. torch's
softmax family (``dim=None``) and ``InstanceNorm`` warn with a ``stacklevel`` that
reaches past ``forward``; such calls run torch's ``_wrapped_call_impl``
(``fastmodule._verified.frame_counting``), so the warning's file, line, module registry and
"once per location" behaviour are stock's: compared here, stock against fast, by
every way a module gets called."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core
from fastmodule._verified import frame_counting

Make = Callable[[], nn.Module]

WARNING_LAYERS: dict[str, tuple[Make, tuple[int, ...]]] = {
    "Softmax()": (lambda: nn.Softmax(), (2, 3)),
    "Softmin()": (lambda: nn.Softmin(), (2, 3)),
    "LogSoftmax()": (lambda: nn.LogSoftmax(), (2, 3)),
    # affine=False and a num_features the input does not match: a warning.
    "InstanceNorm1d(4)": (lambda: nn.InstanceNorm1d(4), (2, 3, 5)),
}


class Outer(nn.Module):
    """A user module calling the layer (through the getattr slot and the call slot)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _direct(m: nn.Module) -> nn.Module:
    return m


WRAPS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "direct": _direct,
    "in Sequential": lambda m: nn.Sequential(nn.Identity(), m),
    "in a user module": Outer,
}


def _call_directly(m: nn.Module, x: torch.Tensor) -> Any:
    return m(x)


def _call_module_call(m: nn.Module, x: torch.Tensor) -> Any:
    return nn.Module.__call__(m, x)


def _call_with_hook(m: nn.Module, x: torch.Tensor) -> Any:
    handle = m.register_forward_hook(lambda mod, args, out: None)
    try:
        return m(x)
    finally:
        handle.remove()


CALLS = {"m(x)": _call_directly, "nn.Module.__call__": _call_module_call, "hooked": _call_with_hook}


def _record(model: nn.Module, x: torch.Tensor, call: Callable[..., Any], times: int) -> Any:
    """Warnings shown (under the default "once per location" action) by `times`
    calls from two different lines, with what each points at."""
    registry = nn.modules.module.__dict__.get("__warningregistry__")
    if registry is not None:
        registry.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(times):
            out_a = call(model, x)
            out_b = call(model, x)
    shown = [(str(w.message), w.category, w.filename, w.lineno) for w in seen]
    return shown, out_a.tolist(), out_b.tolist()


def _run(make: Make, shape: tuple[int, ...], wrap: str, call: str, fast: bool) -> Any:
    torch.manual_seed(0)
    model = WRAPS[wrap](make())
    x = torch.randn(*shape)
    if not fast:
        return _record(model, x, CALLS[call], 2)
    with fastmodule.accelerated(model):
        return _record(model, x, CALLS[call], 2)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("layer", WARNING_LAYERS)
def test_warning_points_where_stock_does(layer: str, wrap: str, call: str) -> None:
    make, shape = WARNING_LAYERS[layer]
    stock = _run(make, shape, wrap, call, fast=False)
    fast = _run(make, shape, wrap, call, fast=True)
    assert fast == stock
    assert stock[0], "the case must warn"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: nn.Softmax(), "counts its caller's frames"),
        (lambda: nn.LogSoftmax(), "counts its caller's frames"),
        (lambda: nn.InstanceNorm2d(3), "counts its caller's frames"),
        (lambda: nn.Softmax(dim=1), None),
        (lambda: nn.LogSoftmax(dim=-1), None),
        (lambda: nn.Softmax2d(), None),
        (lambda: nn.Linear(2, 2), None),
    ],
)
@pytest.mark.requires_native("which calls the native call path hands over (_core.call_handover)")
def test_only_frame_counting_calls_hand_over(make: Make, reason: str | None) -> None:
    m = make()
    with fastmodule.accelerated(m):
        got = _core.call_handover(m)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_dim_read_on_every_call() -> None:
    def go(fast: bool) -> Any:
        torch.manual_seed(0)
        m = nn.Softmax(dim=1)
        x = torch.randn(2, 3)
        out = []
        ctx = fastmodule.accelerated(m) if fast else warnings.catch_warnings()
        with ctx, warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for dim in (1, None, 0, None):
                m.dim = dim
                out.append(m(x).tolist())
            # The instance dict changed only by rebinding a key it has.
            m.__dict__["dim"] = 1
            out.append(m(x).tolist())
            m.__dict__["dim"] = None
            out.append(m(x).tolist())
        return out, [(str(w.message), w.filename, w.lineno) for w in seen]

    assert go(True) == go(False)
    if fastmodule._verified.layers.LAYERS is None:
        m = nn.Softmax(dim=1)
        with fastmodule.accelerated(m):
            assert _core.call_handover(m) is None
            m.__dict__["dim"] = None
            assert _core.call_handover(m) is not None


def test_user_code_is_not_classified() -> None:
    """User forwards run without torch's frames whatever they do (README)."""

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("user", stacklevel=2)
        return x

    code = forward.__code__
    assert frame_counting.classify(code) == frame_counting.NONE
    assert frame_counting.classify(nn.Softmax.forward.__code__) == frame_counting.WHEN_DIM_NONE
    assert frame_counting.classify(nn.Softmax2d.forward.__code__) == frame_counting.NONE
    assert frame_counting.classify(nn.InstanceNorm1d.forward.__code__) == frame_counting.ALWAYS
    assert frame_counting.classify(nn.Linear.forward.__code__) == frame_counting.NONE


@pytest.mark.requires_native("check's count of calls the native call path hands over")
def test_check_reports_the_handover() -> None:
    from fastmodule.tools.check import check

    model = nn.Sequential(nn.Linear(4, 4), nn.Unflatten(1, (2, 2)), nn.InstanceNorm1d(2))
    report = check(model, torch.ones(3, 4), timing=False, progress=False)
    assert report.parity.identical
    [handover] = report.calls.handovers
    assert handover.cls == "InstanceNorm1d"
    assert "counts its caller's frames" in handover.reason
