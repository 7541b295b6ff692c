"""``train()``/``eval()`` and no-op conversions from a recorded walk
(``src/plans/eager.rs``).

A complete ``train(mode)`` or recognised ``_apply`` (``.float()``, ``.to(...)``, ...)
of a tree is recorded; later calls replay it after checking every visited module
(``train``), or skip the walk when every tensor is already what the conversion asks
for (``_apply``). Each scenario runs on stock ``torch.nn.Module`` and on
``fastmodule.Module`` and compares what the calls returned or raised, every module's
``training`` and every tensor's identity, dtype and grad afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import high_then_low_limit, outcome
from tests.test_parity_traversal import (
    REPLAY_MUTATIONS,
    Base,
    Index,
    assert_same,
    sample_classes,
    sample_tree,
)


def _training_in_params(root: nn.Module, leaf: type[nn.Module]) -> None:
    # torch's __setattr__ then treats `training` as a parameter name and raises.
    root.inner.deep._parameters["training"] = None


def _training_in_modules(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.seq._modules["training"] = None


def _training_not_bool(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.training = 1


def _override_train(root: nn.Module, leaf: type[nn.Module]) -> None:
    cls = type(root.inner.deep)

    def train(self: nn.Module, mode: bool = True) -> nn.Module:
        self.seen_mode = mode
        return super(cls, self).train(not mode)

    cls.train = train


def _shadow_train(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.train = lambda mode=True: None


def _override_setattr(root: nn.Module, leaf: type[nn.Module]) -> None:
    cls = type(root.inner)

    def setattr_(self: nn.Module, name: str, value: Any) -> None:
        if name == "training":
            value = not value
        nn.Module.__setattr__(self, name, value)

    cls.__setattr__ = setattr_


def _class_training(root: nn.Module, leaf: type[nn.Module]) -> None:
    type(root.inner).training = property(lambda self: True, lambda self, v: None)


def _equal_leaves(root: nn.Module, leaf: type[nn.Module]) -> None:
    # named_children's memo then treats every Leaf as the first one.
    cls = type(root.a)
    cls.__eq__ = lambda self, other: isinstance(other, cls)
    cls.__hash__ = lambda self: 1


def _share_more(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.twin = root.seq
    root.seq.back = root.inner.deep


TRAIN_MUTATIONS = {
    **REPLAY_MUTATIONS,
    "training_in_params": _training_in_params,
    "training_in_modules": _training_in_modules,
    "training_not_bool": _training_not_bool,
    "override_train": _override_train,
    "shadow_train": _shadow_train,
    "override_setattr": _override_setattr,
    "class_training": _class_training,
    "equal_leaves": _equal_leaves,
    "share_more": _share_more,
}

CALLS = [("train", ()), ("eval", ()), ("train", (True,)), ("train", (False,)), ("train", ())]


def run_calls(root: nn.Module, ix: Index) -> list[Any]:
    """Each call's outcome and every module's ``training`` after it."""
    out = []
    for meth, args in CALLS:
        r = outcome(lambda: ix.label(getattr(root, meth)(*args)))
        out.append((meth, args, r, [getattr(m, "training", "-") for m in ix.modules]))
    return out


@pytest.mark.parametrize("mutation", list(TRAIN_MUTATIONS))
def test_tree_changed_between_train_calls(mutation: str) -> None:
    """Calls after a change see it, whether the walk replays or records afresh."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        leaf, _ = sample_classes(b)
        ix = Index(root)
        before = run_calls(root, ix)
        TRAIN_MUTATIONS[mutation](root, leaf)
        ix.extend(root)
        after = run_calls(root, ix)
        return before, after

    assert_same(sc)


@pytest.mark.requires_native("counts train/eval's recorded plans (_core.eager_plan_stats)")
def test_replay_and_flip_keep_the_recording() -> None:
    """White box: the second call replays, and so do calls that flip the mode; a
    changed tree is walked live and recorded again."""
    from fastmodule import _core

    root = sample_tree(fastmodule.Module)
    ix = Index(root)
    _core.clear_plans()
    recorded, replayed = _core.eager_plan_stats()
    root.train()
    assert _core.eager_plan_stats() == (recorded + 1, replayed)
    for mode in (True, False, False, True, False):
        root.train(mode)
        assert all(m.training is mode for m in ix.modules)
    assert _core.eager_plan_stats() == (recorded + 1, replayed + 5)
    root.inner.deep.late = nn.Linear(1, 1)
    root.train()
    assert root.inner.deep.late.training is True
    assert _core.eager_plan_stats() == (recorded + 2, replayed + 5)
    root.eval()
    assert _core.eager_plan_stats() == (recorded + 2, replayed + 6)
    assert not any(m.training for m in Index(root).modules)


def test_flip_after_a_child_flipped_alone() -> None:
    """A child set to the other mode by itself changes its dict: the plan is not
    trusted, and every module ends in the mode asked for."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        ix = Index(root)
        root.train()
        root.train()
        root.inner.eval()
        root.train()
        first = [m.training for m in ix.modules]
        root.inner.deep.train(False)
        root.eval()
        return first, [m.training for m in ix.modules]

    assert_same(sc)


def test_recursion_limit_lowered_after_recording() -> None:
    """A chain recorded under a high limit raises like stock once the limit is lower.
    (How many modules were set before the error depends on how many Python frames
    each level takes, which the native walk does not reproduce; not compared.)"""

    def sc(b: Base) -> Any:
        _, node = sample_classes(b)
        root = cur = node()
        for _ in range(1500):
            cur.c = node()
            cur = cur.c
        return high_then_low_limit(lambda: root.train(False) is root, lambda: root.train(True))

    assert_same(sc)


def test_train_on_wide_shared_tree() -> None:
    """Many children, each listed twice in one registry (named_children's memo)."""

    def sc(b: Base) -> Any:
        leaf, node = sample_classes(b)
        root = node()
        kids = [leaf() for _ in range(40)]
        for i, k in enumerate(kids):
            root.add_module(f"a{i}", k)
            root.add_module(f"b{i}", k)
        root.add_module("lin", torch.nn.Linear(1, 1))
        ix = Index(root)
        return [
            (outcome(lambda: getattr(root, meth)(*args) is root), [m.training for m in ix.modules])
            for meth, args in CALLS * 2
        ]

    assert_same(sc)


# --------------------------------------------------------------------------- _apply


def _data_double(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep.w.data = root.inner.deep.w.data.double()


def _grad_added(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.seq[0].w.grad = torch.ones(2)


def _grad_double(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.q.grad = torch.ones(1, dtype=torch.float64)


def _buffer_in_place_double(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep.rb.data = root.inner.deep.rb.data.double()


def _buffer_int(root: nn.Module, leaf: type[nn.Module]) -> None:
    root.inner.deep.register_buffer("steps", torch.zeros(1, dtype=torch.int64))


def _param_subclass(root: nn.Module, leaf: type[nn.Module]) -> None:
    class Sub(nn.Parameter):
        pass

    root.a.w.__class__ = Sub


def _override_apply(root: nn.Module, leaf: type[nn.Module]) -> None:
    cls = type(root.inner.deep)

    def _apply(self: nn.Module, fn: Any, recurse: bool = True) -> nn.Module:
        self.applied = getattr(self, "applied", 0) + 1
        return super(cls, self)._apply(fn, recurse)

    cls._apply = _apply


APPLY_MUTATIONS = {
    **REPLAY_MUTATIONS,
    "data_double": _data_double,
    "grad_added": _grad_added,
    "grad_double": _grad_double,
    "buffer_in_place_double": _buffer_in_place_double,
    "buffer_int": _buffer_int,
    "param_subclass": _param_subclass,
    "override_apply": _override_apply,
}

CONVERSIONS = [
    ("float", ()),
    ("to", ("cpu",)),
    ("double", ()),
    ("float", ()),
    ("cpu", ()),
    ("to", (torch.float32,)),
    ("half", ()),
    ("float", ()),
]


def tensor_state(root: nn.Module, ix: Index) -> list[Any]:
    """Every tensor reachable now: its label (same object as before?), class, dtype,
    and its grad's dtype."""
    now = Index(root)
    out: list[Any] = []
    for t in now.params + now.buffers:
        g = t.grad if isinstance(t, nn.Parameter) else None
        out.append((ix.label(t), type(t).__name__, t.dtype, None if g is None else g.dtype))
    out.append([getattr(m, "applied", 0) for m in now.modules])
    return out


def run_conversions(root: nn.Module, ix: Index) -> list[Any]:
    out = []
    for meth, args in CONVERSIONS:
        r = outcome(lambda: ix.label(getattr(root, meth)(*args)))
        out.append((meth, args, r, tensor_state(root, ix)))
        # Repeat: the second call of an unchanged tree replays.
        r = outcome(lambda: ix.label(getattr(root, meth)(*args)))
        out.append((meth, args, r, tensor_state(root, ix)))
    return out


@pytest.mark.parametrize("mutation", list(APPLY_MUTATIONS))
def test_tree_changed_between_conversions(mutation: str) -> None:
    """Conversions after a change see it, whether the walk is skipped or not."""

    def sc(b: Base) -> Any:
        root = sample_tree(b)
        leaf, _ = sample_classes(b)
        ix = Index(root)
        warm = [outcome(lambda: root.float() is root) for _ in range(3)]
        APPLY_MUTATIONS[mutation](root, leaf)
        ix.extend(root)
        return warm, run_conversions(root, ix)

    assert_same(sc)


@pytest.mark.requires_native("counts no-op conversions' replays (_core.eager_plan_stats)")
def test_noop_conversion_skips_the_walk() -> None:
    """White box: an unchanged float32 tree's second ``.float()`` (and ``.to('cpu')``)
    is answered from the recording; a conversion with work to do walks live."""
    from fastmodule import _core

    root = sample_tree(fastmodule.Module)
    _core.clear_plans()
    recorded, replayed = _core.eager_plan_stats()
    root.float()
    assert _core.eager_plan_stats() == (recorded + 1, replayed)
    root.float()
    root.to("cpu")
    root.cpu()
    assert _core.eager_plan_stats() == (recorded + 1, replayed + 3)
    root.double()  # work to do: live, then recorded afresh
    assert _core.eager_plan_stats() == (recorded + 2, replayed + 3)
    assert root.a.w.dtype == torch.float64
    root.double()
    assert _core.eager_plan_stats() == (recorded + 2, replayed + 4)


def test_recorded_trees_stay_collectable() -> None:
    """A plan holds no reference: a recorded tree is freed when its last user drops it,
    and a new tree at a reused address is walked live, not from the old plan."""
    import gc
    import weakref

    for _ in range(3):
        root = sample_tree(fastmodule.Module)
        for _ in range(2):
            root.train()
            root.eval()
            root.float()
        ref = weakref.ref(root)
        del root
        gc.collect()
        assert ref() is None
    fresh = sample_tree(fastmodule.Module)
    fresh.eval()
    assert not any(m.training for m in Index(fresh).modules)
