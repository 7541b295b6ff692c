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
import torch
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


@pytest.mark.requires_native("counts the replays of recorded train()/eval() walks")
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


# --- 35: a registration's hasattr miss reads type(self).__name__ ---------------------


class Counting(type(nn.Module)):  # type: ignore[misc]
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        LOG.append("__name__")
        return "Counted"


class Raising(type(nn.Module)):  # type: ignore[misc]
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        LOG.append("__name__")
        raise RuntimeError("metaclass __name__ raised")


class RaisingAttributeError(type(nn.Module)):  # type: ignore[misc]
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        LOG.append("__name__")
        raise AttributeError("no name")


class NotAStr(type(nn.Module)):  # type: ignore[misc]
    @property
    def __name__(cls) -> Any:  # type: ignore[override]
        LOG.append("__name__")
        return 42


class Routing(type(nn.Module)):  # type: ignore[misc]
    def __getattribute__(cls, name: str) -> Any:
        if name == "__name__":
            LOG.append("meta __getattribute__")
        return type.__getattribute__(cls, name)


class WithGetattr(type(nn.Module)):  # type: ignore[misc]
    def __getattr__(cls, name: str) -> Any:
        LOG.append(("meta __getattr__", name))
        raise AttributeError(name)


class LoggedName(str):
    def __format__(self, spec: str) -> str:
        LOG.append("__format__")
        return str.__format__(self, spec)


LOG: list[Any] = []

METACLASSES = {
    "type": type,
    "plain_subclass": type("PlainMeta", (type,), {}),
    "counting": Counting,
    "raising": Raising,
    "raising_attribute_error": RaisingAttributeError,
    "not_a_str": NotAStr,
    "routing": Routing,
    "with_getattr": WithGetattr,
}

REGISTRATIONS: dict[str, Callable[[nn.Module], Any]] = {
    "assign_parameter": lambda m: setattr(m, "p", nn.Parameter(torch.zeros(1))),
    "assign_parameter_twice": lambda m: (
        setattr(m, "p", nn.Parameter(torch.zeros(1))),
        setattr(m, "p", nn.Parameter(torch.ones(1))),
    ),
    "register_parameter": lambda m: m.register_parameter("q", nn.Parameter(torch.zeros(1))),
    "register_parameter_none": lambda m: m.register_parameter("q", None),
    "register_buffer": lambda m: m.register_buffer("b", torch.zeros(1)),
    "register_buffer_non_persistent": lambda m: m.register_buffer(
        "b", torch.zeros(1), persistent=False
    ),
    "add_module": lambda m: m.add_module("c", nn.Linear(1, 1)),
    "register_module": lambda m: m.register_module("c", nn.Linear(1, 1)),
    # No hasattr in torch's code here: the metaclass must not run either.
    "assign_module": lambda m: setattr(m, "c", nn.Linear(1, 1)),
    "assign_plain": lambda m: setattr(m, "x", 1),
    "hasattr": lambda m: hasattr(m, "missing"),
    "getattr_default": lambda m: getattr(m, "missing", "default"),
}


@pytest.mark.parametrize("meta", list(METACLASSES))
@pytest.mark.parametrize("op", list(REGISTRATIONS))
@pytest.mark.parametrize("name", ["plain", "str_subclass"])
def test_registration_miss_reads_class_name(meta: str, op: str, name: str) -> None:
    def make(side: str) -> nn.Module:
        cls = METACLASSES[meta]("Owner", (base_of(side),), {})
        if name == "str_subclass":
            # Through type's own setter: a metaclass property may shadow it.
            type.__dict__["__name__"].__set__(cls, LoggedName("Owner"))
        return cls()

    def body(m: nn.Module) -> Any:
        LOG.clear()
        try:
            return outcome(lambda: REGISTRATIONS[op](m)), list(LOG), registries(m)
        finally:
            LOG.clear()

    result = on_each_side(make, body)
    if meta == "counting" and op.startswith(("assign_parameter", "register_", "add_")):
        # Each registration misses once (the second assignment finds `p`).
        assert result[1][1] == ["__name__"]


def registries(m: nn.Module) -> tuple[list[str], ...]:
    d = m.__dict__
    return list(d["_parameters"]), list(d["_buffers"]), list(d["_modules"])


def test_registration_miss_after_metaclass_gains_name_property() -> None:
    """A metaclass that gains a ``__name__`` property (through a new base) after the
    class was used is seen at the next registration."""

    def make(side: str) -> nn.Module:
        meta = type("LateMeta", (type,), {})
        return meta("Owner", (base_of(side),), {})()

    def body(m: nn.Module) -> Any:
        meta = type(type(m))
        m.register_buffer("a", torch.zeros(1))
        log: list[str] = []
        # `meta.__name__ = ...` would rename the metaclass (type's setter wins).
        named = type("Named", (type,), {"__name__": property(lambda c: log.append("read") or "L")})
        meta.__bases__ = (named,)
        try:
            m.register_buffer("b", torch.zeros(1))
            m.c = nn.Parameter(torch.zeros(1))
            return log, registries(m)
        finally:
            meta.__bases__ = (type,)

    assert on_each_side(make, body)[1][0] == ["read", "read"]


# --- 36: __getattribute__ gained or lost in the middle of a walk -----------------------


def ga_tree(side: str) -> nn.Module:
    """``M(nn.Module, Mixin)`` four deep, each with a Linear and a buffer; the classes
    are the tree's own (``type(m).Mixin``, ``type(m).M``)."""

    class Mixin:
        pass

    class M(base_of(side), Mixin):  # type: ignore[misc]
        def __init__(self, depth: int = 3) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("buf", torch.zeros(1))
            if depth:
                self.sub = M(depth - 1)

    M.Mixin, M.M = Mixin, M  # type: ignore[attr-defined]
    return M()


def logging_getattribute(log: list[Any]) -> Callable[[Any, str], Any]:
    def __getattribute__(self: Any, name: str) -> Any:
        if name in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            log.append(name)
        return object.__getattribute__(self, name)

    return __getattribute__


def change(m: nn.Module, target: str, log: list[Any]) -> None:
    cls = type(m).M  # type: ignore[attr-defined]
    mixin = type(m).Mixin  # type: ignore[attr-defined]
    if target == "mixin_gains":
        mixin.__getattribute__ = logging_getattribute(log)
    elif target == "class_gains":
        cls.__getattribute__ = logging_getattribute(log)
    else:
        del mixin.__getattribute__


WALKS: dict[str, Callable[[nn.Module], Iterator[Any]]] = {
    "named_parameters": lambda m: m.named_parameters(),
    "named_parameters_all": lambda m: m.named_parameters(remove_duplicate=False),
    "named_parameters_prefix": lambda m: m.named_parameters(prefix="root"),
    "parameters": lambda m: m.parameters(),
    "named_buffers": lambda m: m.named_buffers(),
    "buffers": lambda m: m.buffers(),
    "named_modules": lambda m: m.named_modules(),
    "modules": lambda m: m.modules(),
    "children": lambda m: m.children(),
    "named_children": lambda m: m.named_children(),
}


@pytest.mark.parametrize("walk", list(WALKS))
@pytest.mark.parametrize("target", ["mixin_gains", "class_gains", "mixin_loses"])
@pytest.mark.parametrize("at", [0, 1, 4])
@pytest.mark.parametrize("warm", [True, False], ids=["replayed", "first_walk"])
def test_getattribute_changed_mid_walk(walk: str, target: str, at: int, warm: bool) -> None:
    def body(m: nn.Module) -> Any:
        log: list[Any] = []
        if target == "mixin_loses":
            type(m).Mixin.__getattribute__ = logging_getattribute(log)  # type: ignore[attr-defined]
        if warm:
            for _ in range(3):
                list(WALKS[walk](m))
        log.clear()
        out = []
        for i, x in enumerate(WALKS[walk](m)):
            out.append(x[0] if isinstance(x, tuple) else type(x).__name__)
            if i == at:
                change(m, target, log)
        return out, log

    result = on_each_side(ga_tree, body)
    if walk == "named_parameters" and target == "mixin_gains" and at == 1:
        # The repro: every later M's registries, through the new __getattribute__.
        assert result[1][1] == ["_parameters", "_modules"] * 3


@pytest.mark.parametrize("target", ["mixin_gains", "class_gains"])
@pytest.mark.parametrize("hook", ["pre", "post"])
def test_getattribute_gained_in_state_dict_hook(target: str, hook: str) -> None:
    def body(m: nn.Module) -> Any:
        for _ in range(3):
            m.state_dict()
        log: list[Any] = []
        sub = m.sub  # type: ignore[attr-defined]
        if hook == "pre":
            sub.register_state_dict_pre_hook(lambda *a: change(m, target, log))
        else:
            sub.lin._register_state_dict_hook(lambda *a: change(m, target, log))
        first = list(m.state_dict())
        second = list(m.state_dict())
        return first, second, log

    on_each_side(ga_tree, body)


WHOLE_TREE: dict[str, Callable[[nn.Module, dict[str, Any]], Any]] = {
    "load_state_dict": lambda m, sd: m.load_state_dict(sd),
    "load_state_dict_assign": lambda m, sd: m.load_state_dict(sd, assign=True),
    "zero_grad": lambda m, sd: m.zero_grad(),
    "requires_grad_": lambda m, sd: m.requires_grad_(True),
    "to": lambda m, sd: m.to(torch.float32),
}


@pytest.mark.parametrize(
    ("op", "trigger"),
    [(op, "torch_function") for op in WHOLE_TREE]
    + [(op, "load_pre_hook") for op in WHOLE_TREE if op.startswith("load")],
)
def test_getattribute_gained_mid_whole_tree_call(op: str, trigger: str) -> None:
    """User code in the middle of a whole-tree call (a parameter's
    ``__torch_function__``, a load pre-hook) gives a mixin ``__getattribute__``: the
    later modules' registries are read through it, as torch's recursion reads them."""

    def body(m: nn.Module) -> Any:
        log: list[Any] = []
        mixin = type(m).Mixin  # type: ignore[attr-defined]

        def gain(*args: Any) -> None:
            if "__getattribute__" not in vars(mixin):
                change(m, "mixin_gains", log)

        sub = m.sub  # type: ignore[attr-defined]
        if trigger == "torch_function":

            class Param(nn.Parameter):
                @classmethod
                def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                    gain()
                    return super().__torch_function__(func, types, args, kwargs or {})

            sub.lin.weight = Param(sub.lin.weight.detach())
        else:
            sub.lin.register_load_state_dict_pre_hook(gain)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        log.clear()
        result = outcome(lambda: WHOLE_TREE[op](m, sd))
        return result[0], log

    on_each_side(ga_tree, body)
