"""``zero_grad`` reading the grads from the recorded parameters walk first
(``src/walk/zero_grad.rs``).

Once ``parameters()`` of a tree was walked completely, ``zero_grad`` reads the
grads of the parameters it would visit in one checked pass: when all are None
the call is over; otherwise the usual walk runs and skips the leading ones the
pass already read. Each scenario runs on stock ``torch.nn.Module`` and on
``fastmodule.Module`` and compares every grad (values, identity, requires_grad,
grad_fn) and what the calls returned or raised.
"""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import LogFunctions, assert_gc_state_kept, high_then_low_limit, outcome
from tests.test_parity_traversal import (
    REPLAY_MUTATIONS,
    Base,
    Index,
    assert_same,
    grads,
    sample_classes,
    sample_tree,
)


def set_grads(ix: Index, which: list[int]) -> list[Any]:
    """Give the parameters at ``which`` a grad (its index as values); every grad after."""
    for i in which:
        p = ix.params[i]
        p.grad = torch.full_like(p, float(i))
    return [p.grad for p in ix.params]


def calls(root: nn.Module, ix: Index, set_to_none: bool) -> list[Any]:
    """zero_grad twice (the second may come from the pass), and the grads after each."""
    out = []
    for _ in range(2):
        before = [p.grad for p in ix.params]
        out.append((outcome(lambda: root.zero_grad(set_to_none)), grads(ix, before)))
    return out


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("which", [[], [0], [3], [-1], [2, 5], "all"])
def test_grads_found_after_none(which: Any, set_to_none: bool) -> None:
    """Grads on the first, a middle, the last, several or every parameter, given after
    calls that found none: each is cleared (or zeroed) as in stock; the others stay None."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        first = calls(root, ix, set_to_none)
        idx = list(range(len(ix.params))) if which == "all" else which
        set_grads(ix, [i % len(ix.params) for i in idx])
        return first, calls(root, ix, set_to_none)

    assert_same(sc)


@pytest.mark.parametrize("mutation", list(REPLAY_MUTATIONS))
def test_tree_changed_between_calls(mutation: str) -> None:
    """A change between calls, then a grad on every parameter of the changed tree:
    every grad is cleared, on new parameters too."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        leaf, _ = sample_classes(b)
        ix = Index(root)
        first = calls(root, ix, True)
        REPLAY_MUTATIONS[mutation](root, leaf)
        ix.extend(root)
        middle = calls(root, ix, True)
        set_grads(ix, list(range(len(ix.params))))
        return first, middle, calls(root, ix, True)

    assert_same(sc)


def test_parameter_subclass_grad_property() -> None:
    """A parameter whose class reads ``grad`` in Python: every read happens, in
    stock's order."""

    reads: list[str] = []

    class Watched(nn.Parameter):
        @property  # type: ignore[override]
        def grad(self) -> Any:
            reads.append(self.tag)
            return None

        @grad.setter
        def grad(self, v: Any) -> None:
            reads.append(f"set {self.tag}")

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        root.zero_grad()
        root.zero_grad()
        w = Watched(torch.ones(1))
        w.tag = "w"
        root.inner.deep.watched = w
        reads.clear()
        root.zero_grad()
        root.zero_grad()
        return list(reads)

    assert_same(sc)


def test_mode_sees_every_grad_read() -> None:
    """Under a TorchFunctionMode, the mode sees stock's sequence of calls."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        root.zero_grad()
        root.zero_grad()
        log: list[Any] = []
        with LogFunctions(log):
            root.zero_grad()
        return log

    stock = sc(nn.Module)
    assert stock  # the mode saw the reads
    assert_same(sc)


def test_finalizer_gives_a_grad_while_clearing() -> None:
    """Clearing one grad runs a weakref callback that gives grads to an earlier and a
    later parameter: the later one is cleared too, the earlier one kept, as in stock."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        root.zero_grad()
        root.zero_grad()
        k = len(ix.params) // 2
        early, late = ix.params[1], ix.params[-1]
        g = torch.ones_like(ix.params[k])

        def give(_: Any) -> None:
            early.grad = torch.full_like(early, 7.0)
            late.grad = torch.full_like(late, 8.0)

        ref = weakref.ref(g, give)
        ix.params[k].grad = g
        del g
        before = [p.grad for p in ix.params]
        r = outcome(lambda: root.zero_grad())
        return r, ref() is None, grads(ix, before)

    assert_same(sc)


def test_gc_state_is_kept() -> None:
    """The pass pauses the cyclic GC and leaves it as it found it."""
    root = sample_tree(fastmodule.Module)
    root.zero_grad()
    assert_gc_state_kept(root.zero_grad)


def test_recursion_limit_lowered_after_recording() -> None:
    """A chain whose walk was recorded under a high limit raises like stock under a
    lower one."""

    def sc(b: Base) -> Any:
        leaf, node = sample_classes(b)
        root = cur = node()
        for _ in range(1500):
            cur.c = leaf()
            cur = cur.c
        return high_then_low_limit(root.zero_grad)

    assert_same(sc)


@pytest.mark.requires_native("counts zero_grad's replays (_core.plan_stats)")
def test_pass_counts_and_skips() -> None:
    """White box: a call whose grads are all None comes from the pass; one with a grad
    walks (and still clears it)."""
    from fastmodule import _core

    root = sample_tree(fastmodule.Module)
    ix = Index(root)
    _core.clear_plans()
    root.zero_grad()
    recorded, replayed = _core.plan_stats()
    for _ in range(3):
        root.zero_grad()
    assert _core.plan_stats() == (recorded, replayed + 3)
    ix.params[-1].grad = torch.ones_like(ix.params[-1])
    root.zero_grad()
    assert ix.params[-1].grad is None
    # The pass read the plan, then the walk replayed it.
    assert _core.plan_stats() == (recorded, replayed + 4)
