"""Regression tests for differences the stateful fuzzer found (stock against fast).

Each test names the fuzzer's minimised case it keeps fixed.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from tests.conftest import outcome


def _leaf_and_root(base: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))
            self.register_buffer("b", torch.zeros(2))
            self.register_buffer("c", torch.zeros(2))

    class Root(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.leaf = Leaf()

    r = Root()
    return r, r.leaf


def _dtypes(m: nn.Module) -> dict[str, str]:
    return {k: str(v.dtype) for k, v in m._buffers.items()}


def _replaced_buffer_finalizer(base: type[nn.Module], watched: str) -> Any:
    r, leaf = _leaf_and_root(base)
    log: list[str] = []

    def fire() -> None:
        log.append("freed")
        leaf.register_buffer("late", torch.ones(2))

    weakref.finalize(getattr(leaf, watched), fire)
    out = []
    for _ in range(2):
        res = outcome(lambda: r.bfloat16() is r)
        out.append((res, list(log), _dtypes(leaf)))
    return out


def test_replaced_buffer_is_released_when_torch_releases_it(base: type[nn.Module]) -> None:
    """fuzz 06: ``_apply`` keeps each old buffer in its loop variable until the
    next item is read (or the module's ``_apply`` returns), so its finalizer runs
    then: a buffer it adds makes the iterator raise after the next buffer was
    converted, or not at all for the last one."""
    for watched in ("b", "c"):
        stock = _replaced_buffer_finalizer(nn.Module, watched)
        assert _replaced_buffer_finalizer(base, watched) == stock, watched


def _converted_result_finalizer(base: type[nn.Module]) -> Any:
    r, leaf = _leaf_and_root(base)
    log: list[Any] = []

    def fn(t: torch.Tensor) -> torch.Tensor:
        out = t.double()
        weakref.finalize(out, lambda: log.append(("freed", _dtypes(leaf))))
        return out

    res = outcome(lambda: r._apply(fn) is r)
    return res, log, _dtypes(leaf), str(leaf.w.dtype)


def test_converted_tensors_are_released_when_torch_releases_them(
    base: type[nn.Module],
) -> None:
    """``param_applied`` lives until the next parameter is taken or ``_apply``
    returns; a finalizer on ``fn``'s result sees the module as it is then."""
    assert _converted_result_finalizer(base) == _converted_result_finalizer(nn.Module)
