"""``load_state_dict`` from a recorded walk (``src/state/load_state_dict_plan.rs``).

A complete load of a tree with no load hooks and no overriding classes is recorded;
the next load of the unchanged tree whose dict holds exactly the expected keys copies
from the recording. Each scenario runs on stock ``torch.nn.Module`` and on
``fastmodule.Module`` (``check`` of ``test_parity_load_state_dict``: outcomes, hook
logs, warnings and the final tree compared), loads twice first so that later loads can
replay, changes the tree, and then loads a series of dicts: exact ones, and ones with a
missing, an extra, a mis-shaped, a non-tensor or an integer entry, non-strict,
``assign=True`` and a plain dict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import fastmodule
from tests.conftest import outcome
from tests.test_parity_load_state_dict import Base, Ctx, check, classes, describe, fresh


def plannable(b: Base) -> nn.Module:
    """Stock and custom children, nesting, a shared module, a tied parameter, None
    entries and non-persistent buffers (no BatchNorm, whose class overrides
    ``_load_from_state_dict``); fresh classes per call, since scenarios patch them
    (``classes`` is cached per base)."""

    class Inner(classes(b).Inner):  # type: ignore[misc, name-defined]
        pass

    class Net(b):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 3)
            self.inner = Inner()
            self.seq = nn.Sequential(nn.Linear(3, 2), Inner())
            self.register_module("empty", None)
            self.shared = self.inner
            self.lin2 = nn.Linear(2, 3)
            self.lin2.weight = self.lin.weight

    return Net()


def _without(sd: OrderedDict, key: str) -> OrderedDict:
    del sd[key]
    return sd


def _with(sd: OrderedDict, key: str, v: Any) -> OrderedDict:
    sd[key] = v
    return sd


def _load(
    edit: Callable[[OrderedDict], Any] = lambda sd: sd, shift: float = 0.5, **kwargs: Any
) -> Callable[[nn.Module, Ctx], Any]:
    """``m.load_state_dict(edit(fresh(m)), **kwargs)``."""
    return lambda m, c: m.load_state_dict(edit(fresh(m, c, shift)), **kwargs)


INT = torch.ones(2, dtype=torch.int64)
LOADS: list[tuple[str, Callable[[nn.Module, Ctx], Any]]] = [
    ("exact", _load()),
    ("exact again", _load(shift=1.0)),
    ("missing", _load(lambda sd: _without(sd, "inner.p"))),
    ("missing non-strict", _load(lambda sd: _without(sd, "lin.bias"), strict=False)),
    ("extra", _load(lambda sd: _with(sd, "zzz", torch.ones(1)))),
    ("extra nested", _load(lambda sd: _with(sd, "seq.1.q", torch.ones(1)))),
    ("extra state key", _load(lambda sd: _with(sd, "inner._extra_state", 1))),
    ("shape", _load(lambda sd: _with(sd, "inner.p", torch.ones(3)))),
    ("not a tensor", _load(lambda sd: _with(sd, "seq.0.bias", 1.5))),
    ("integer", _load(lambda sd: _with(sd, "inner.b", INT))),
    ("non-str key", _load(lambda sd: _with(sd, 3, torch.ones(1)))),
    ("plain dict", _load(dict, 2.0)),
    ("exact 3", _load(shift=3.0)),
    ("assign", _load(shift=4.0, assign=True)),
    ("exact 4", _load(shift=5.0)),
    ("exact 5", _load(shift=6.0)),
]


def _add(m: nn.Module) -> None:
    m.late = nn.Linear(1, 1)


def _delete(m: nn.Module) -> None:
    del m.lin2


def _set_none(m: nn.Module) -> None:
    m._modules["lin2"] = None


def _replace_module(m: nn.Module) -> None:
    m.seq[1] = type(m.inner)()


def _add_nested_param(m: nn.Module) -> None:
    m.seq[1].late_p = nn.Parameter(torch.zeros(1))


def _replace_param(m: nn.Module) -> None:
    m.inner.p = nn.Parameter(torch.zeros(2))


def _reshape_param(m: nn.Module) -> None:
    m.inner.p.data = torch.zeros(4)


def _make_non_persistent(m: nn.Module) -> None:
    m.inner._non_persistent_buffers_set.add("b")


def _make_persistent(m: nn.Module) -> None:
    m.seq[1]._non_persistent_buffers_set.discard("np")


def _pre_hook(m: nn.Module) -> None:
    def hook(module: nn.Module, sd: Any, prefix: str, *args: Any) -> None:
        m.__dict__.setdefault("pre_seen", []).append((prefix, sorted(sd)))

    m.seq[1].register_load_state_dict_pre_hook(hook)


def _post_hook(m: nn.Module) -> None:
    def hook(module: nn.Module, keys: Any) -> None:
        keys.missing_keys.clear()

    m.inner.register_load_state_dict_post_hook(hook)


def _override_load(m: nn.Module) -> None:
    cls = type(m.inner)

    def _load_from_state_dict(self: nn.Module, sd: Any, prefix: str, *args: Any) -> None:
        sd.pop(prefix + "b", None)
        super(cls, self)._load_from_state_dict(sd, prefix, *args)

    cls._load_from_state_dict = _load_from_state_dict


def _set_extra_state(m: nn.Module) -> None:
    type(m.inner).set_extra_state = lambda self, state: None
    type(m.inner).get_extra_state = lambda self: 7


def _param_subclass(m: nn.Module) -> None:
    class Sub(nn.Parameter):
        pass

    m.lin.bias.__class__ = Sub


def _meta_param(m: nn.Module) -> None:
    m.seq[0].bias.data = torch.empty(2, device="meta")


def _tie(m: nn.Module) -> None:
    m.seq[0].weight = m.lin2.weight if m.seq[0].weight.shape == m.lin2.weight.shape else None


def _new_dict(m: nn.Module) -> None:
    m.inner.__dict__ = dict(m.inner.__dict__)


def _dotted_name(m: nn.Module) -> None:
    m.inner._parameters["x.y"] = nn.Parameter(torch.zeros(1))


MUTATIONS: dict[str, Callable[[nn.Module], None]] = {
    "none": lambda m: None,
    "add": _add,
    "delete": _delete,
    "set_none": _set_none,
    "replace_module": _replace_module,
    "add_nested_param": _add_nested_param,
    "replace_param": _replace_param,
    "reshape_param": _reshape_param,
    "make_non_persistent": _make_non_persistent,
    "make_persistent": _make_persistent,
    "pre_hook": _pre_hook,
    "post_hook": _post_hook,
    "override_load": _override_load,
    "set_extra_state": _set_extra_state,
    "param_subclass": _param_subclass,
    "meta_param": _meta_param,
    "tie": _tie,
    "new_dict": _new_dict,
    "dotted_name": _dotted_name,
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_tree_changed_between_loads(mutation: str) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        warm = [describe(outcome(lambda: m.load_state_dict(fresh(m, ctx, s)))) for s in (0.1, 0.2)]
        MUTATIONS[mutation](m)
        later = []
        for name, load in LOADS:
            later.append((name, describe(outcome(lambda: load(m, ctx)))))
        later.append(m.__dict__.get("pre_seen"))
        return warm, later

    check(plannable, act)


@pytest.mark.requires_native("counts load_state_dict's recorded plans (_core.load_plan_stats)")
def test_second_load_replays() -> None:
    """White box: an unchanged tree's second exact load replays; an inexact dict is
    loaded live and keeps the plan; a tree with a BatchNorm (which overrides
    ``_load_from_state_dict``) is never recorded."""
    from fastmodule import _core

    m = plannable(fastmodule.Module)
    _core.clear_plans()
    recorded, replayed = _core.load_plan_stats()
    m.load_state_dict(fresh(m))
    assert _core.load_plan_stats() == (recorded + 1, replayed)
    m.load_state_dict(fresh(m, shift=1.0))
    assert _core.load_plan_stats() == (recorded + 1, replayed + 1)
    m.load_state_dict(_without(fresh(m), "lin.bias"), strict=False)
    m.load_state_dict(fresh(m, shift=2.0))
    assert _core.load_plan_stats() == (recorded + 1, replayed + 2)
    assert torch.equal(m.inner.p, fresh(m, shift=0.0)["inner.p"])
    m.bn = nn.BatchNorm1d(2)
    for _ in range(3):
        m.load_state_dict(fresh(m))
    assert _core.load_plan_stats() == (recorded + 1, replayed + 2)


@pytest.mark.parametrize("context", ["swap_flag", "mode"])
def test_load_under_flag_or_mode(context: str) -> None:
    """torch's swap_tensors flag and torch-function modes are torch's code's to honour:
    a load under them never replays."""

    class Log(TorchFunctionMode):
        def __init__(self, log: list[Any]) -> None:
            super().__init__()
            self.log = log

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            self.log.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.load_state_dict(fresh(m, ctx, 0.1))
        m.load_state_dict(fresh(m, ctx, 0.2))
        sd = fresh(m, ctx, 0.3)
        if context == "swap_flag":
            torch.__future__.set_swap_module_params_on_conversion(True)
            try:
                return describe(outcome(lambda: m.load_state_dict(sd)))
            finally:
                torch.__future__.set_swap_module_params_on_conversion(False)
        log: list[Any] = []
        with Log(log):
            r = describe(outcome(lambda: m.load_state_dict(sd)))
        return r, log

    check(plannable, act)
