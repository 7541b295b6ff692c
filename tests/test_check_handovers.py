"""``check``'s account of module calls that stay on torch's path: ``_core.call_handover``
gives a reason exactly when a call really runs torch's ``_call_impl`` (seen from the
frame that calls ``forward``), and the report counts them per class and reason."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core
from fastmodule.tools.check import check

TORCH_MODULE_PY = nn.Module._call_impl.__code__.co_filename

pytestmark = pytest.mark.requires_native(
    "why the native call path hands a call over to torch (_core.call_handover)"
)


class Probe(nn.Module):
    """Records whether torch's ``_call_impl`` called its forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's _call_impl calls forward itself, or through its nested `inner`
        # when hooks run; the native path calls it from the module call's caller.
        frame = sys._getframe(1)
        self.via_torch = frame.f_code.co_filename == TORCH_MODULE_PY and (
            frame.f_code.co_name in ("_call_impl", "inner")
        )
        return x


class OwnCall(Probe):
    def __call__(self, *args: object, **kwargs: object) -> object:
        return super().__call__(*args, **kwargs)


class OwnCallImpl(Probe):
    def _call_impl(self, *args: object, **kwargs: object) -> object:
        return nn.Module._call_impl(self, *args, **kwargs)


class OwnGetattribute(Probe):
    def __getattribute__(self, name: str) -> object:
        return super().__getattribute__(name)


class Mixin:
    """A plain class after nn.Module in the MRO (as transformers' PreTrainedModel has)."""


class WithMixin(Probe, Mixin):
    pass


def _one(module: Probe) -> Iterator[Probe]:
    yield module


def _plain() -> Iterator[Probe]:
    yield Probe()


def _forward_hook() -> Iterator[Probe]:
    m = Probe()
    m.register_forward_hook(lambda *a: None)
    yield m


def _pre_hook() -> Iterator[Probe]:
    m = Probe()
    m.register_forward_pre_hook(lambda *a: None)
    yield m


def _global_hook() -> Iterator[Probe]:
    handle = nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        yield Probe()
    finally:
        handle.remove()


def _backward_hook() -> Iterator[Probe]:
    m = Probe()
    m.register_full_backward_hook(lambda *a: None)
    yield m


def _global_backward_hook() -> Iterator[Probe]:
    # Registering sets this flag for good; the test puts it back.
    was = nn.modules.module._global_is_full_backward_hook
    handle = nn.modules.module.register_module_full_backward_hook(lambda *a: None)
    try:
        yield Probe()
    finally:
        handle.remove()
        nn.modules.module._global_is_full_backward_hook = was


class Registry(OrderedDict):
    """A hook registry of a class of its own (its truth value could be anything)."""


def _odd_registry() -> Iterator[Probe]:
    m = Probe()
    m._forward_hooks = Registry()
    yield m


def _odd_key() -> Iterator[Probe]:
    m = Probe()
    m.__dict__[1] = "not a str key"
    yield m


SCENARIOS: dict[str, tuple[Callable[[], Iterator[Probe]], str | None]] = {
    "plain": (_plain, None),
    # Registration and whole-tree methods stay torch's for it; the call is native.
    "bases after nn.Module": (lambda: _one(WithMixin()), None),
    # Forward hooks are dispatched natively (fastmodule._verified.hook_dispatch).
    "forward hook": (_forward_hook, None),
    "pre-hook": (_pre_hook, None),
    "global hook": (_global_hook, None),
    "backward hook": (_backward_hook, "it has backward hooks"),
    "global backward hook": (_global_backward_hook, "global backward hooks"),
    "registry not a dict": (_odd_registry, "not a dict or OrderedDict"),
    "non-str key": (_odd_key, "unusual"),
    "own __call__": (lambda: _one(OwnCall()), "own __call__"),
    "own _call_impl": (lambda: _one(OwnCallImpl()), "_call_impl"),
    "own __getattribute__": (lambda: _one(OwnGetattribute()), "__getattribute__"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_reason_given_exactly_when_torch_runs_the_call(scenario: str) -> None:
    make, expected = SCENARIOS[scenario]
    scene = make()
    module = next(scene)
    try:
        fastmodule.accelerate(module)
        try:
            reason = _core.call_handover(module)
            module(torch.ones(1))
        finally:
            fastmodule.restore(module)
    finally:
        scene.close()
    if expected is None:
        assert reason is None
        assert module.via_torch is False
    else:
        assert reason is not None and expected in reason
        # An own __call__ calling super().__call__ reaches the native path again
        # from CPython 3.12 on (torch's function is called through its entry point).
        if scenario != "own __call__":
            assert module.via_torch is True


def test_not_accelerated_class() -> None:
    assert _core.call_handover(Probe()) == "its class is not accelerated"


def test_report_counts_handovers_per_class() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.register_full_backward_hook(lambda *a: None)
            self.c = nn.Sequential(nn.ReLU(), nn.Linear(4, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(self.a(x)))

    report = check(Net(), torch.ones(2, 4), timing=False, progress=False)
    assert report.parity.identical
    assert report.calls.calls == 6 and report.calls.native_calls == 5
    [handover] = report.calls.handovers
    assert (handover.cls, handover.calls, handover.modules) == ("Linear", 1, 1)
    assert "backward hooks" in handover.reason
    text = report.format()
    assert "module calls 5 of 6 in one run take fastmodule's native path" in text
    assert "  Linear     1 module       1 call: it has backward hooks" in text
    data = report.to_json()
    assert data["module_calls"] == 6 and data["native_calls"] == 5
    assert data["handovers"] == [
        {"cls": "Linear", "reason": handover.reason, "calls": 1, "modules": 1}
    ]
