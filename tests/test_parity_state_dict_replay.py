"""``state_dict()`` from a recorded walk (``src/state/state_dict_plan.rs``).

A complete ``state_dict()`` with no destination is recorded; the next call on an
unchanged tree checks every visited module and builds the result from the recording.
Each scenario runs on stock ``torch.nn.Module`` and on ``fastmodule.Module``, calls
``state_dict`` twice first (so that the call under test can replay), changes the tree,
and compares every later result by keys, values, identities and ``_metadata``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import LogFunctions, assert_gc_state_kept
from tests.test_parity_state_dict import Base, Index, assert_same, classes, summary


def plannable(b: Base) -> nn.Module:
    """A tree a plan can describe: stock and custom children, nesting, a module shared
    under two names, a tied parameter, None entries, non-persistent buffers, BatchNorm
    and a class with its own ``_version`` (no extra state, no hooks)."""
    C = classes(b)

    # Fresh classes for the modules whose class a scenario patches (``classes`` is
    # cached per base).
    class Sub(C.Node):  # type: ignore[misc, name-defined]
        pass

    class Deep(C.Versioned):  # type: ignore[misc, name-defined]
        pass

    root = C.Node()
    root.lin = nn.Linear(2, 2)
    root.bn = nn.BatchNorm1d(2)
    root.sub = Sub(persistent_tmp=True)
    root.sub.deep = Deep()
    root.sub.seq = nn.Sequential(nn.Linear(2, 2), C.Node(), nn.BatchNorm1d(2))
    root.register_module("empty", None)
    root.shared = root.sub.deep
    root.lin2 = nn.Linear(2, 2)
    root.lin2.weight = root.lin.weight
    return root


def _hook_log(root: nn.Module) -> list[Any]:
    log = root.__dict__.setdefault("_test_log", [])
    return log


def _add(root: nn.Module) -> None:
    root.late = type(root)()


def _delete(root: nn.Module) -> None:
    del root.lin


def _set_none(root: nn.Module) -> None:
    root._modules["lin"] = None


def _replace_module(root: nn.Module) -> None:
    root.sub.deep = type(root)()


def _add_nested_param(root: nn.Module) -> None:
    root.sub.deep.late_p = nn.Parameter(torch.ones(1))


def _replace_param(root: nn.Module) -> None:
    root.w = nn.Parameter(torch.ones(2))


def _data_double(root: nn.Module) -> None:
    root.sub.w.data = root.sub.w.data.double()


def _make_non_persistent(root: nn.Module) -> None:
    root.sub._non_persistent_buffers_set.add("b")


def _make_persistent(root: nn.Module) -> None:
    root._non_persistent_buffers_set.discard("tmp")


def _pre_hook(root: nn.Module) -> None:
    log = _hook_log(root)
    root.sub.deep.register_state_dict_pre_hook(lambda m, prefix, keep: log.append(("pre", prefix)))


def _post_hook(root: nn.Module) -> None:
    log = _hook_log(root)
    root.sub.seq[0].register_state_dict_post_hook(
        lambda m, sd, prefix, meta: log.append(("post", prefix, len(sd)))
    )


def _private_hook(root: nn.Module) -> None:
    def hook(m: nn.Module, sd: Any, prefix: str, meta: Any) -> None:
        sd[prefix + "hooked"] = torch.zeros(1)

    root.sub._register_state_dict_hook(hook)


def _class_version(root: nn.Module) -> None:
    type(root.sub.deep)._version = 9


def _instance_version(root: nn.Module) -> None:
    root.lin._version = 5


def _extra_state(root: nn.Module) -> None:
    type(root.sub).get_extra_state = lambda self: {"n": 1}


def _param_subclass(root: nn.Module) -> None:
    class Sub(nn.Parameter):
        pass

    root.w.__class__ = Sub


def _buffer_none(root: nn.Module) -> None:
    root.sub._buffers["b"] = None


def _shadow_state_dict(root: nn.Module) -> None:
    inner = root.sub.deep

    def state_dict(*args: Any, **kwargs: Any) -> Any:
        _hook_log(root).append(("shadow", kwargs.get("prefix")))
        return type(inner).state_dict(inner, *args, **kwargs)

    inner.state_dict = state_dict


def _patch_class(root: nn.Module) -> None:
    cls = type(root.sub.deep)
    log = _hook_log(root)

    def state_dict(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        log.append(("override", kwargs.get("prefix")))
        return super(cls, self).state_dict(*args, **kwargs)

    cls.state_dict = state_dict


def _tie(root: nn.Module) -> None:
    root.sub.w = root.w


def _new_dict(root: nn.Module) -> None:
    root.sub.__dict__ = dict(root.sub.__dict__)


MUTATIONS: dict[str, Callable[[nn.Module], None]] = {
    "add": _add,
    "delete": _delete,
    "set_none": _set_none,
    "replace_module": _replace_module,
    "add_nested_param": _add_nested_param,
    "replace_param": _replace_param,
    "data_double": _data_double,
    "make_non_persistent": _make_non_persistent,
    "make_persistent": _make_persistent,
    "pre_hook": _pre_hook,
    "post_hook": _post_hook,
    "private_hook": _private_hook,
    "class_version": _class_version,
    "instance_version": _instance_version,
    "extra_state": _extra_state,
    "param_subclass": _param_subclass,
    "buffer_none": _buffer_none,
    "shadow_state_dict": _shadow_state_dict,
    "patch_class": _patch_class,
    "tie": _tie,
    "new_dict": _new_dict,
}

CALLS: list[dict[str, Any]] = [{}, {"keep_vars": True}, {"prefix": "p."}, {}, {"keep_vars": True}]


def run_calls(root: nn.Module) -> list[Any]:
    out = []
    for kwargs in CALLS:
        ix = Index(root)
        out.append((kwargs, summary(root.state_dict(**kwargs), ix)))
    out.append(list(root.__dict__.get("_test_log", [])))
    return out


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_tree_changed_between_state_dicts(mutation: str) -> None:
    """Calls after a change see it, whether they replay or walk live."""

    def sc(b: Base) -> Any:
        root = plannable(b)
        before = run_calls(root)
        MUTATIONS[mutation](root)
        return before, run_calls(root)

    assert_same(sc)


@pytest.mark.requires_native("counts state_dict's recorded plans (_core.state_dict_plan_stats)")
def test_second_state_dict_replays() -> None:
    """White box: an unchanged tree's second state_dict replays (with or without
    keep_vars, for the same prefix); a tree with extra state is never recorded."""
    from fastmodule import _core

    root = plannable(fastmodule.Module)
    _core.clear_plans()
    recorded, replayed = _core.state_dict_plan_stats()
    first = root.state_dict()
    assert _core.state_dict_plan_stats() == (recorded + 1, replayed)
    second = root.state_dict()
    root.state_dict(keep_vars=True)
    assert _core.state_dict_plan_stats() == (recorded + 1, replayed + 2)
    assert list(first) == list(second) and first._metadata == second._metadata
    assert all(first[k] is not second[k] for k in first)
    root.state_dict(prefix="p.")  # another prefix: its own recording
    assert _core.state_dict_plan_stats() == (recorded + 2, replayed + 2)
    C = classes(fastmodule.Module)
    with_extra = plannable(fastmodule.Module)
    with_extra.extra = C.Extra()
    for _ in range(3):
        with_extra.state_dict()
    assert _core.state_dict_plan_stats() == (recorded + 2, replayed + 2)


def test_modes_see_every_detach() -> None:
    """Under a TorchFunctionMode, the mode sees stock's sequence of calls."""

    def sc(b: Base) -> Any:
        root = plannable(b)
        root.state_dict()
        root.state_dict()
        log: list[Any] = []
        with LogFunctions(log):
            sd = root.state_dict()
        return log, list(sd)

    assert_same(sc)


def test_gc_state_is_kept() -> None:
    """The replay pauses the cyclic GC and leaves it as it found it."""
    root = plannable(fastmodule.Module)
    root.state_dict()
    assert_gc_state_kept(root.state_dict)


def test_recorded_tree_stays_collectable() -> None:
    """A plan holds its key strings only: the tree is freed when dropped."""
    import weakref

    root = plannable(fastmodule.Module)
    root.state_dict()
    root.state_dict()
    ref = weakref.ref(root)
    del root
    gc.collect()
    assert ref() is None
