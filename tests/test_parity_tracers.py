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
    m = fastmodule.accelerate(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert events_under(sys.setprofile, m) == stock


def test_without_a_tracer_the_call_has_no_frames_of_its_own() -> None:
    assert caller_of_forward(nn.Module) == "_call_impl"
    assert caller_of_forward(fastmodule.Module) == "caller_of_forward"


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
