"""Debuggers, profilers and coverage see stock frames for module calls.

While a trace or profile function is set, the module call runs torch's own
``_wrapped_call_impl``/``_call_impl``; without one, fastmodule's call has no
frames of its own (the README's known differences).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core


def make(base: type[nn.Module]) -> nn.Module:
    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x).relu()

    return Net()


def caller_of_forward(base: type[nn.Module]) -> str:
    class Probe(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any) -> str:
            return sys._getframe(1).f_code.co_name

    return Probe()(1)


def events_under(install: Callable[[Callable[..., Any]], None], m: nn.Module) -> list[str]:
    """Names of the Python functions called during ``m(x)`` while a tracer is set."""
    seen: list[str] = []

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code.co_name)

    x = torch.ones(1, 2)
    install(tracer)
    try:
        m(x)
    finally:
        install(None)  # type: ignore[arg-type]
    return seen


@pytest.mark.requires_native("the native paths' tracer check (_core.tracer_check_known)")
def test_the_thread_state_fields_were_found() -> None:
    assert _core.tracer_check_known()


def test_profile_function_sees_stock_frames(base: type[nn.Module]) -> None:
    stock = events_under(sys.setprofile, make(nn.Module))
    assert "_call_impl" in stock
    assert events_under(sys.setprofile, make(base)) == stock


def test_trace_function_sees_stock_frames(base: type[nn.Module]) -> None:
    stock = events_under(sys.settrace, make(nn.Module))
    assert events_under(sys.settrace, make(base)) == stock


def test_accelerated_model_under_a_tracer() -> None:
    stock = events_under(sys.setprofile, nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with fastmodule.accelerated(m):
        assert events_under(sys.setprofile, m) == stock


def whole_tree_events(m: nn.Module) -> list[str]:
    """Python functions called by whole-tree methods while a profile function is set."""
    seen: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        m.train()
        list(m.named_parameters())
        m.state_dict()
        m.zero_grad()
        m.float()
    finally:
        sys.setprofile(None)
    return seen


def collapsed(names: list[str]) -> list[str]:
    """Runs of one name as one: ``fastmodule.Module``'s own method frame calls torch's
    method of the same name (the README's known differences: two frames there)."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def test_whole_tree_methods_under_a_profiler(base: type[nn.Module]) -> None:
    stock = whole_tree_events(make(nn.Module))
    assert "named_parameters" in stock and "_named_members" in stock
    assert collapsed(whole_tree_events(make(base))) == collapsed(stock)


def test_whole_tree_methods_of_an_accelerated_model_under_a_profiler() -> None:
    stock = whole_tree_events(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    with fastmodule.accelerated(m):
        assert whole_tree_events(m) == stock


@pytest.mark.requires_native("the native call runs forward without frames of its own")
def test_without_a_tracer_the_call_has_no_frames_of_its_own() -> None:
    assert caller_of_forward(nn.Module) == "_call_impl"
    assert caller_of_forward(fastmodule.Module) == "caller_of_forward"


@pytest.mark.requires_native("the native call runs forward without frames of its own")
def test_a_tracer_on_another_thread_changes_nothing_here() -> None:
    started, done = threading.Event(), threading.Event()

    def other() -> None:
        sys.settrace(lambda *a: None)
        started.set()
        done.wait(10)
        sys.settrace(None)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert started.wait(10)
        assert caller_of_forward(fastmodule.Module) == "caller_of_forward"
    finally:
        done.set()
        t.join()
