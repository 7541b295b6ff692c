"""What a native path decided is checked again where torch's code would read it.

docs/design.md promises that ``nn.Module.__setattr__``'s body is compared at each
call "also where ``train()`` rebinds ``training``", that a class change is seen "at
every module of a walk", and that a miss answered natively reads what torch's
``__getattr__`` reads. Each scenario below changes one of those at run time (the
shapes of ``../shared/reference/repros`` 34, 35 and 36 and their neighbours) and
runs on three sides: stock classes, ``fastmodule.Module`` subclasses, and stock
classes accelerated in place; the fast sides must give exactly stock's results,
exceptions and logs of the user code that ran.

- 34: ``train()``/``eval()`` of a tree whose walk was recorded (and replayed) while
  ``nn.Module.__setattr__``'s ``__code__``/``__kwdefaults__`` are replaced: stock
  calls the new body once per module on every call, also where ``training`` is
  already the requested mode.
- 35: ``register_parameter``/``register_buffer``/``add_module`` (directly or through
  ``m.p = Parameter``) ask ``hasattr(self, name)``, whose miss in
  ``nn.Module.__getattr__`` builds a message from ``type(self).__name__``: a
  metaclass property of that name runs once per miss (and an exception from it
  replaces the miss), a metaclass ``__getattribute__`` sees it, a class name that is
  a ``str`` subclass is formatted through its ``__format__``.
- 36: a class or a mixin after ``nn.Module`` gains (or loses) ``__getattribute__``
  while a walk's iterator is suspended, or from a ``state_dict`` hook: stock reads
  every later module's registries through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.nn.modules.module as module_py
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import outcome

SIDES = ("stock", "fast", "accelerated")


def base_of(side: str) -> type[nn.Module]:
    return fastmodule.Module if side == "fast" else nn.Module


def on_each_side(make: Callable[[str], nn.Module], body: Callable[[nn.Module], Any]) -> Any:
    """``body(make(side))`` on each side (accelerated in place for the body on the
    third side, and on the second when the tree has only stock classes); every
    side's outcome equals stock's, which is returned."""
    results = []
    for side in SIDES:
        model = make(side)
        # A tree of stock classes only (no fastmodule.Module to subclass) is
        # accelerated on both fast sides.
        stock_classes = not any(isinstance(x, fastmodule.Module) for x in model.modules())
        ctx = (
            fastmodule.accelerated(model)
            if side == "accelerated" or (side == "fast" and stock_classes)
            else contextlib.nullcontext()
        )
        with ctx:
            results.append(outcome(lambda model=model: body(model)))
    stock = results[0]
    assert results[1] == stock, "fastmodule.Module subclasses differ from stock"
    assert results[2] == stock, "accelerated stock classes differ from stock"
    return stock


# --- 34: train()/eval() replays and a replaced __setattr__ body ----------------------


def block_tree(side: str) -> nn.Module:
    """A root of the side's base holding stock layers and a nested block: 6 modules."""

    class Block(base_of(side)):  # type: ignore[misc]
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.act = nn.ReLU()
            if depth:
                self.sub = Block(depth - 1)

    return Block(1)


def sequential_tree(side: str) -> nn.Module:
    """The repro's tree: stock containers and layers only (5 modules)."""
    del side  # stock classes on every side (accelerated on the fast ones)
    return nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.ReLU()))


@contextlib.contextmanager
def setattr_replaced(how: str, log: list[Any]) -> Iterator[None]:
    """``nn.Module.__setattr__`` with another body for the block: its ``__code__``
    (``how == "code"``), or its code and then its ``__kwdefaults__``
    (``"code_and_kwdefaults"``), logging each call and delegating to a copy of
    torch's body. The replacement's code has torch's free variable (``__class__``,
    for ``super()``) and reads its helpers from module.py's globals, which the
    function keeps."""
    f = nn.Module.__setattr__
    torch_body = type(f)(f.__code__, f.__globals__, "torch_body", f.__defaults__, f.__closure__)

    class Holder:
        def logged(self, name, value):  # type: ignore[no-untyped-def]
            __class__  # noqa: B018 - the free variable torch's body has
            _fm_test_log.append(name)  # type: ignore[name-defined] # noqa: F821
            return _fm_test_body(self, name, value)  # type: ignore[name-defined] # noqa: F821

        def tagged(self, name, value, *, tag="code"):  # type: ignore[no-untyped-def]
            __class__  # noqa: B018
            _fm_test_log.append((name, tag))  # type: ignore[name-defined] # noqa: F821
            return _fm_test_body(self, name, value)  # type: ignore[name-defined] # noqa: F821

    g = vars(module_py)
    g["_fm_test_log"], g["_fm_test_body"] = log, torch_body
    code, kwdefaults = f.__code__, f.__kwdefaults__
    try:
        if how == "code":
            f.__code__ = Holder.logged.__code__
        else:
            f.__code__ = Holder.tagged.__code__
            f.__kwdefaults__ = {"tag": "kwdefaults"}
        yield
    finally:
        f.__code__ = code
        f.__kwdefaults__ = kwdefaults
        del g["_fm_test_log"], g["_fm_test_body"]


TRAIN_CALLS = [
    ("train", "eval", "eval", "train", "train"),
    ("eval", "train"),
    # Already in the requested mode: stock still calls __setattr__ at every module.
    ("eval_same",),
]


@pytest.mark.parametrize("make", [block_tree, sequential_tree], ids=["block", "sequential"])
@pytest.mark.parametrize("how", ["code", "code_and_kwdefaults"])
@pytest.mark.parametrize("calls", TRAIN_CALLS, ids=lambda c: "-".join(c))
def test_replayed_train_calls_replaced_setattr(
    make: Callable[[str], nn.Module], how: str, calls: tuple[str, ...]
) -> None:
    def body(m: nn.Module) -> Any:
        for _ in range(3):  # recorded, then replayed
            m.train()
            m.eval()
        log: list[Any] = []
        seen = []
        with setattr_replaced(how, log):
            for call in calls:
                log.clear()
                if call == "eval_same":
                    m.eval()
                    log.clear()
                    m.train(False)
                else:
                    getattr(m, call)()
                seen.append((call, list(log), [x.training for x in m.modules()]))
        # Torch's body again: the same flags, no call of the replacement.
        log.clear()
        m.train()
        m.eval()
        seen.append(("restored", list(log), [x.training for x in m.modules()]))
        return seen

    result = on_each_side(make, body)
    n = len(list(make("stock").modules()))
    assert result[0] == "ok"
    assert all(len(log) == n for call, log, _ in result[1][:-1])


def test_replaced_setattr_is_never_replayed_and_restored_is_again() -> None:
    """While the body is replaced no call replays (each runs torch's walk, calling
    the new body); once restored, the tree is recorded and replayed again (the hand
    over did not leave it refused for good)."""
    with fastmodule.accelerated(sequential_tree("stock")) as m:
        for _ in range(3):
            m.train()
            m.eval()
        log: list[Any] = []
        with setattr_replaced("code", log):
            _, before = _core.eager_plan_stats()
            for _ in range(5):
                m.train()
                m.eval()
            assert _core.eager_plan_stats()[1] == before
        assert len(log) == 5 * 2 * 5
        _, before = _core.eager_plan_stats()
        for _ in range(40):
            m.train()
            m.eval()
        assert _core.eager_plan_stats()[1] > before
        assert [x.training for x in m.modules()] == [False] * 5
