"""Every native entry point of fastmodule, a few times each, for valgrind's memcheck
(``make test-memcheck``; tests/memcheck/run.sh). Not a pytest file: under valgrind
every Python line costs ~50x, so this is one short script with plain asserts that
only check each path was taken (parity is the suite's job).

Covered: module call (hooks of every kind, global hooks, errors), attribute reads,
setattr/delattr on every registry, every ``register_*``, every walk and its replay
(abandoned and mutated walks too), train/eval, requires_grad_, zero_grad, apply,
``_apply`` and the conversions, state_dict, load_state_dict (and their replays),
get_submodule & co., the containers, accelerate/restore/accelerated/install, deep
trees (native RecursionError), non-str registry keys whose ``__eq__`` runs code,
finalizers that run during a delete or replacement, and threads.
"""

from __future__ import annotations

import gc
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import fastmodule
from fastmodule import _core

RUN: list[tuple[str, Callable[[], None]]] = []


def step(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register the decorated function as one step of the run, named for the log."""

    def deco(fn: Callable[[], None]) -> Callable[[], None]:
        RUN.append((name, fn))
        return fn

    return deco


def raises(exc: type[BaseException], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except exc:
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def tolerate(fn: Callable[[], Any]) -> None:
    """Run ``fn``; an exception is fine (whether stock raises here is the suite's job)."""
    try:
        fn()
    except Exception:  # noqa: BLE001, S110 - only the memory accesses matter here
        pass


# --------------------------------------------------------------------------- a tree


class Leaf(fastmodule.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
        self.register_buffer("b", torch.zeros(n))
        self.register_buffer("scratch", torch.zeros(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w + self.b


class Net(fastmodule.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Leaf())
        self.blocks = nn.ModuleList([Leaf(), Leaf()])
        self.named = nn.ModuleDict({"a": Leaf(), "b": nn.Identity()})
        self.bn = nn.BatchNorm1d(3)
        self.leaf = Leaf()
        self.shared = self.leaf  # one module under two names
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.seq(self.lin(x))
        for b in self.blocks:
            x = b(x)
        x = self.named["a"](x)
        return self.bn(self.leaf(x)) * self.scale


def net() -> Net:
    torch.manual_seed(0)
    return Net()


X = torch.ones(2, 3)


# --------------------------------------------------------------------------- calls


@step("module call, hooks, errors")
def calls() -> None:
    m = net()
    for _ in range(3):
        m(X)
    log: list[str] = []
    hs = [
        m.register_forward_pre_hook(lambda mod, a: log.append("pre")),
        m.register_forward_hook(lambda mod, a, o: log.append("post")),
        m.register_forward_pre_hook(lambda mod, a, k: (a, k), with_kwargs=True),
        m.register_forward_hook(lambda mod, a, k, o: o, with_kwargs=True, always_call=True),
        m.leaf.register_full_backward_hook(lambda mod, gi, go: None),
        m.leaf.register_full_backward_pre_hook(lambda mod, go: None),
    ]
    g = [
        torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, a: None),
        torch.nn.modules.module.register_module_forward_hook(lambda mod, a, o: None),
    ]
    for _ in range(3):
        m(X).sum().backward()
    assert log.count("pre") == 3, log
    for h in hs + g:
        h.remove()
    m.zero_grad()
    m(X)

    class Boom(fastmodule.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    b = Boom()
    b.register_forward_hook(lambda mod, a, o: o, always_call=True)
    for _ in range(3):
        raises(ValueError, lambda: b(X))
    raises(TypeError, lambda: m())  # forward's missing argument
    # A forward replaced on the instance, then removed.
    m.leaf.forward = lambda x: x + 1
    m(X)
    del m.leaf.forward
    m(X)


# --------------------------------------------------------------------------- attributes


@step("attribute reads, setattr, delattr")
def attributes() -> None:
    m = net()
    for _ in range(3):
        m.lin, m.leaf.w, m.leaf.b, m.scale, m.training, m.seq[2].w
    raises(AttributeError, lambda: m.missing)
    raises(AttributeError, lambda: m.leaf.missing)
    m.leaf.w = nn.Parameter(torch.zeros(3))  # replace a parameter
    m.leaf.b = torch.ones(3)  # replace a buffer
    m.leaf.b = None
    m.leaf.w = None
    raises(TypeError, lambda: setattr(m.leaf, "w", torch.ones(3)))  # tensor to a param slot
    m.lin = nn.Linear(3, 3)  # replace a module
    m.extra = nn.Linear(1, 1)  # new module
    m.p = nn.Parameter(torch.ones(1))  # new parameter
    m.plain = [1, 2]
    raises(TypeError, lambda: setattr(m, "lin", 3))  # non-module to a module slot
    del m.extra, m.p, m.plain, m.leaf.w, m.leaf.b, m.shared
    raises(AttributeError, lambda: delattr(m, "nothing"))
    m.training = False
    m.__dict__["in_dict"] = 1
    assert m.in_dict == 1
    object.__setattr__(m, "raw", 2)
    assert m.raw == 2


# --------------------------------------------------------------------------- registration


@step("every register_*")
def registration() -> None:
    m = fastmodule.Module()
    m.register_parameter("p", nn.Parameter(torch.ones(2)))
    m.register_parameter("none_p", None)
    m.register_buffer("b", torch.ones(2))
    m.register_buffer("np", torch.ones(2), persistent=False)
    m.register_buffer("none_b", None)
    m.register_module("c", nn.Linear(1, 1))
    m.add_module("d", None)
    m.register_module("e", Leaf())
    for bad in ("", "a.b"):
        raises(KeyError, lambda bad=bad: m.register_parameter(bad, None))
        raises(KeyError, lambda bad=bad: m.register_buffer(bad, None))
        raises(KeyError, lambda bad=bad: m.register_module(bad, None))
    raises(KeyError, lambda: m.register_buffer("p", torch.ones(1)))  # name taken
    raises(TypeError, lambda: m.register_parameter(1, None))  # type: ignore[arg-type]
    raises(TypeError, lambda: m.register_buffer("x", 3))  # type: ignore[arg-type]
    raises(TypeError, lambda: m.register_module("x", 3))  # type: ignore[arg-type]
    log: list[str] = []
    hs = [
        torch.nn.modules.module.register_module_parameter_registration_hook(
            lambda mod, n, v: log.append(n)
        ),
        torch.nn.modules.module.register_module_buffer_registration_hook(
            lambda mod, n, v: log.append(n)
        ),
        torch.nn.modules.module.register_module_module_registration_hook(
            lambda mod, n, v: log.append(n)
        ),
    ]
    m.q = nn.Parameter(torch.ones(1))
    m.register_buffer("rb", torch.ones(1))
    m.f = nn.Identity()
    for h in hs:
        h.remove()
    assert log == ["q", "rb", "f"], log
    for hook in (
        m.register_forward_pre_hook,
        m.register_forward_hook,
        m.register_full_backward_hook,
        m.register_full_backward_pre_hook,
        m.register_state_dict_pre_hook,
        m.register_state_dict_post_hook,
        m.register_load_state_dict_pre_hook,
        m.register_load_state_dict_post_hook,
    ):
        hook(lambda *a, **k: None).remove()


# --------------------------------------------------------------------------- walks


WALKS = [
    "named_modules",
    "modules",
    "named_children",
    "children",
    "named_parameters",
    "parameters",
    "named_buffers",
    "buffers",
]


@step("every walk, recorded and replayed, abandoned and mutated")
def walks() -> None:
    m = net()
    _core.clear_plans()
    for _ in range(3):
        for w in WALKS:
            list(getattr(m, w)())
    list(m.named_modules(memo=set(), prefix="p", remove_duplicate=False))
    list(m.named_parameters(prefix="x", recurse=False))
    list(m.named_buffers(remove_duplicate=False))
    list(m.parameters(recurse=False))
    recorded, replayed = _core.plan_stats()
    assert recorded > 0 and replayed > 0, (recorded, replayed)
    # Abandoned mid-walk, then collected.
    for w in WALKS:
        it = getattr(m, w)()
        next(it)
        del it
    # The tree changes under a walk.
    it = m.named_parameters()
    next(it)
    m.late = nn.Linear(1, 1)
    m.leaf.w = nn.Parameter(torch.ones(3))
    tolerate(lambda: list(it))
    it2 = m.named_modules()
    next(it2)
    del m.late
    tolerate(lambda: list(it2))
    gc.collect()


@step("train/eval, requires_grad_, zero_grad, apply")
def eager() -> None:
    m = net()
    for _ in range(3):
        m.train()
        m.eval()
        m.train(False)
    raises(ValueError, lambda: m.train("yes"))  # type: ignore[arg-type]
    m.requires_grad_(False)
    m.requires_grad_(True)
    for set_to_none in (True, False, True):
        m(X).sum().backward()
        m.zero_grad(set_to_none=set_to_none)
        m.zero_grad()
    m.apply(lambda mod: None)
    recorded, replayed = _core.eager_plan_stats()
    assert recorded > 0 and replayed > 0, (recorded, replayed)


@step("_apply and conversions")
def conversions() -> None:
    m = net()
    m(X).sum().backward()
    for _ in range(2):
        m.double()
        m.float()
        m.to(torch.float64)
        m.to("cpu")
        m.to(torch.device("cpu"), torch.float32)
        m.to(torch.ones(1, dtype=torch.float64))
        m.half()
        m.bfloat16()
        m.type(torch.float32)
        m.cpu()
        m.float()  # no-op: replayed
        m.float()
    raises(RuntimeError, lambda: m.to("nope"))
    e = net()
    with torch.device("meta"):
        meta = Net()
    meta.to_empty(device="cpu")
    meta.load_state_dict(e.state_dict())


# --------------------------------------------------------------------------- state dicts


@step("state_dict and load_state_dict, live and replayed")
def state_dicts() -> None:
    m = net()
    for _ in range(3):
        sd = m.state_dict()
    m.state_dict(prefix="p.", keep_vars=True)
    dest: dict[str, Any] = {}
    m.state_dict(destination=dest)
    assert dest
    m.register_state_dict_pre_hook(lambda mod, prefix, keep_vars: None)
    m.state_dict()
    other = net()
    for _ in range(3):
        r = other.load_state_dict(sd)
    assert not r.missing_keys and not r.unexpected_keys
    other.load_state_dict(sd, assign=True)
    partial = dict(sd)
    partial.pop("lin.weight")
    partial["nope"] = torch.ones(1)
    raises(RuntimeError, lambda: other.load_state_dict(partial))
    other.load_state_dict(partial, strict=False)
    bad = dict(sd)
    bad["lin.weight"] = torch.ones(5)
    raises(RuntimeError, lambda: other.load_state_dict(bad))
    raises(TypeError, lambda: other.load_state_dict([]))  # type: ignore[arg-type]
    recorded, replayed = _core.state_dict_plan_stats()
    assert recorded > 0, recorded


# --------------------------------------------------------------------------- paths


@step("get_submodule & co.")
def paths() -> None:
    m = net()
    for _ in range(3):
        m.get_submodule("seq.2")
        m.get_parameter("seq.2.w")
        m.get_buffer("bn.running_mean")
        m.get_submodule("")
    raises(AttributeError, lambda: m.get_submodule("seq.9"))
    raises(AttributeError, lambda: m.get_parameter("seq.2.nope"))
    raises(AttributeError, lambda: m.get_buffer("lin.weight"))
    m.set_submodule("named.b", nn.Linear(1, 1))
    raises(AttributeError, lambda: m.set_submodule("nope.x", nn.Linear(1, 1)))


@step("containers")
def containers() -> None:
    s = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    ml = nn.ModuleList([nn.Identity(), nn.Identity()])
    md = nn.ModuleDict({"x": nn.Identity()})
    fastmodule.accelerate(s)
    fastmodule.accelerate(ml)
    fastmodule.accelerate(md)
    try:
        for _ in range(3):
            s(torch.ones(1, 2))
            list(s), len(s), s[0], s[-1], s[:1]
            list(ml), len(ml), ml[1]
            list(md), md["x"], len(md)
        raises(IndexError, lambda: s[5])
        raises(KeyError, lambda: md["nope"])
    finally:
        fastmodule.restore(s)
        fastmodule.restore(ml)
        fastmodule.restore(md)


# --------------------------------------------------------------------------- acceleration


class StockLeaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


@step("accelerate, restore, accelerated, install")
def acceleration() -> None:
    model = nn.Sequential(nn.Linear(3, 3), StockLeaf(), nn.Sequential(StockLeaf()))
    for _ in range(2):
        fastmodule.accelerate(model)
        assert fastmodule.is_accelerated(model[1])
        model(X)
        model.state_dict()
        list(model.named_parameters())
        model[1].w = nn.Parameter(torch.zeros(3))
        fastmodule.restore(model)
        model(X)
    with fastmodule.accelerated(model):
        model(X)
    raises(TypeError, lambda: fastmodule.accelerate(3))  # type: ignore[arg-type]
    fastmodule.install()
    try:

        class Later(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x

        assert fastmodule.is_accelerated(Later())
        Later()(X)
        model(X)
    finally:
        fastmodule.uninstall()
    assert not fastmodule.is_accelerated(model[1])


# --------------------------------------------------------------------------- hard cases


@step("deep tree: native RecursionError")
def deep() -> None:
    root = cur = Leaf(1)
    for _ in range(1200):
        cur.c = Leaf(1)
        cur = cur.c

    errors: list[BaseException] = []

    def under_limit() -> None:  # in a fresh thread: a known depth
        try:
            for call in (
                lambda: list(root.named_modules()),
                lambda: root.train(False),
                lambda: root.double(),
                lambda: root.state_dict(),
            ):
                raises(RecursionError, call)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        t = threading.Thread(target=under_limit)
        t.start()
        t.join()
    finally:
        sys.setrecursionlimit(old)
    assert not errors, errors


class Key(str):
    """A registry key that is not an exact str: a lookup runs its ``__eq__``."""

    def __eq__(self, other: object) -> bool:
        gc.collect()  # code that can free and reallocate while native code waits
        return str.__eq__(self, other)

    __hash__ = str.__hash__


@step("non-str registry keys whose __eq__ runs code")
def colliding_keys() -> None:
    m = net()
    m.leaf._parameters[Key("w2")] = nn.Parameter(torch.ones(3))
    m._modules[Key("extra")] = Leaf()
    m.leaf._buffers[Key("b2")] = torch.ones(3)
    for _ in range(2):
        m.leaf.w2, m.extra, m.leaf.b2, m.leaf.w
        m(X)
        for w in WALKS:
            list(getattr(m, w)())
        m.train()
        m.state_dict()
        m.double()
        m.float()
        m.zero_grad()
    m.leaf.w2 = nn.Parameter(torch.zeros(3))
    del m.leaf.b2
    m._modules[1] = None  # type: ignore[index]
    list(m.named_modules())


class Finalizer:
    """Runs code in ``__del__``: replaces a registry of its module."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __del__(self) -> None:
        self.owner.__dict__["_buffers"] = dict(self.owner.__dict__["_buffers"])
        gc.collect()


@step("finalizers during deletes and replacements")
def finalizers() -> None:
    for _ in range(2):
        m = Leaf()
        t = torch.ones(3)
        t.fin = Finalizer(m)  # type: ignore[attr-defined]
        m.b = t
        del t
        m.b = torch.zeros(3)  # the old value's finalizer runs during the replacement
        t = torch.ones(3)
        t.fin = Finalizer(m)  # type: ignore[attr-defined]
        m.b = t
        del t
        del m.b  # ... during the delete
        p = nn.Parameter(torch.ones(3))
        p.fin = Finalizer(m)  # type: ignore[attr-defined]
        m.w = p
        del p
        m.w = nn.Parameter(torch.zeros(3))
        child = Leaf()
        child.fin = Finalizer(m)
        m.c = child
        del child
        m.c = Leaf()
        del m.c
        m.state_dict()
        list(m.named_buffers())


@step("threads calling one model")
def threads() -> None:
    m = net()
    m.eval()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                m(X)
                m.state_dict()
                list(m.parameters())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@step("cycles and teardown")
def teardown() -> None:
    for _ in range(2):
        m = net()
        m.me = m  # type: ignore[assignment]  # a cycle through _modules
        m.cb = m.forward
        list(m.named_modules())
        tolerate(m.state_dict)  # a module that contains itself: RecursionError, as stock
        del m
        gc.collect()
    _core.clear_plans()
    gc.collect()


def main() -> int:
    warnings.simplefilter("ignore")  # expected torch warnings (dtype casts and such)
    for name, fn in RUN:
        print(f"memcheck step: {name}", flush=True)
        fn()
    print(f"memcheck entry points: {len(RUN)} steps ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
