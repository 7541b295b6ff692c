"""How deep nested module calls go before RecursionError (a documented difference).

Stock runs three Python frames per nested module call (``_wrapped_call_impl``,
``_call_impl``, ``forward``); an accelerated call runs the ``forward`` frame alone, so
a stack of containers three times deeper fits under the same recursion limit. The
README's known differences say so. What must hold on both sides: RecursionError,
never a crash, past the depth each allows, and the same result wherever both return.
Where the containers' own forwards run natively (``Sequential``), a level takes no
Python frame at all, and how deep the native recursion goes depends on CPython's
own guard for C recursion.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import NATIVE, outcome
from tests.isolation import at_fixed_depth


def nested(depth: int) -> nn.Module:
    m: nn.Module = nn.Linear(2, 2)
    for _ in range(depth):
        m = nn.Sequential(m)
    return m


def run(side: str, depth: int) -> tuple[object, ...]:
    torch.manual_seed(0)
    model = nested(depth)
    x = torch.ones(1, 2)
    if side == "stock":
        return outcome(lambda: at_fixed_depth(lambda: model(x).tolist()))
    with contextlib.ExitStack() as stack:
        # Entering walks the tree the way stock's named_modules does: deep enough.
        at_fixed_depth(lambda: stack.enter_context(fastmodule.accelerated(model)), limit=100000)
        return outcome(lambda: at_fixed_depth(lambda: model(x).tolist()))


def test_shallow_stack_same_result() -> None:
    assert run("fast", 200) == run("stock", 200)


def test_400_deep_stack_raises_on_stock_and_returns_accelerated() -> None:
    stock = run("stock", 400)
    assert stock[0] == "raised" and stock[1] is RecursionError
    fast = run("fast", 400)
    if not NATIVE:  # torch's code runs every call: stock's three frames per level
        assert fast == stock
        return
    torch.manual_seed(0)
    assert fast == ("ok", nn.Linear(2, 2)(torch.ones(1, 2)).tolist())


def test_stock_raises_past_its_limit() -> None:
    got = run("stock", 1500)
    assert got[0] == "raised" and got[1] is RecursionError


@pytest.mark.parametrize("depth", [1500, 5000])
def test_accelerated_stack_returns_or_raises_recursion_error(depth: int) -> None:
    """Never a crash: either the right result or RecursionError, where the native
    call's own guard stops it (the recursion limit on 3.11; CPython's C recursion
    guard from 3.12 on, the thread's stack on 3.14)."""
    got = run("fast", depth)
    torch.manual_seed(0)
    expected = nn.Linear(2, 2)(torch.ones(1, 2)).tolist()
    assert got == ("ok", expected) or (got[0] == "raised" and got[1] is RecursionError), got
