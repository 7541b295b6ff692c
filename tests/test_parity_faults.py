"""Faults halfway through a call leave the tree as stock leaves it.

An exception raised inside a forward, a forward (pre-)hook, a state_dict or load hook, a
``_load_from_state_dict`` override, an ``_apply`` function at its N-th tensor, a ``.to()``
meeting a tensor that refuses to convert, an ``apply`` function at its N-th module, and a
``KeyboardInterrupt`` raised from a walk's consumer, a hook, or such a function: each
stops the call where it stops torch's code, so what was done stays done and the rest is
untouched. The calls after it (each twice, so a recorded plan would be replayed) must
then see the tree as it is, not as a plan recorded before the fault remembers it.

Every scenario runs on stock ``torch.nn.Module``, on ``fastmodule.Module`` and on stock
classes accelerated in place (``fastmodule.accelerate``, restored afterwards), and the
three observations must be equal: what each call returned or raised (type and text),
which hooks and functions ran in which order, and every module's flags, tensors (by
name path, dtype, values, requires_grad) and grads.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE
from tests.test_parity_traversal import ITERATORS, Index

SIDES = ["stock", "fast", "accel"]
Log = list[Any]


class Boom(RuntimeError):
    """The fault the scenarios raise."""


def throw(exc: BaseException) -> Callable[..., None]:
    """A hook that raises ``exc``."""

    def hook(*args: Any) -> None:
        raise exc

    return hook


# --------------------------------------------------------------------------- the tree


def make_classes(base: type[nn.Module], log: Log) -> dict[str, type[nn.Module]]:
    """One side's classes. Every forward logs itself; a Leaf or Node whose ``fail``
    attribute is set raises that exception from its forward."""

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))
            self.register_buffer("nb", torch.randn(2), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            log.append(("forward", self.tag))
            self.calls = self.__dict__.get("calls", 0) + 1
            fail = self.__dict__.get("fail")
            if fail is not None:
                raise fail
            return x * self.w + self.b

    class Node(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            log.append(("forward", self.tag))
            fail = self.__dict__.get("fail")
            if fail is not None:
                raise fail
            for c in self._modules.values():
                if c is not None:
                    x = c(x)
            return x

    class Lin(nn.Linear):
        def __init__(self) -> None:
            super().__init__(2, 2)

    class BN(nn.BatchNorm1d):
        def __init__(self) -> None:
            super().__init__(2)

    if base is not nn.Module:  # torch's layers under fastmodule.Module on the fast side
        Lin = type("Lin", (base, Lin), {})  # type: ignore[misc]  # noqa: N806
        BN = type("BN", (base, BN), {})  # type: ignore[misc]  # noqa: N806
    return {"Leaf": Leaf, "Node": Node, "Lin": Lin, "BN": BN}


def build(base: type[nn.Module], log: Log, bn: bool = True) -> nn.Module:
    """Leaves with parameters, persistent and non-persistent buffers, a Linear, a
    BatchNorm (running stats change in a forward; without it, as for loads, no class
    overrides ``_load_from_state_dict``, so loads are recorded and replayed), a shared
    subtree, a tied parameter."""
    torch.manual_seed(0)
    c = make_classes(base, log)
    root = c["Node"]()
    root.a = c["Leaf"]()
    root.seq = c["Node"]()
    root.seq.x = c["Leaf"]()
    root.seq.lin = c["Lin"]()
    root.seq.bn = c["BN"]() if bn else c["Leaf"]()
    root.seq.y = c["Leaf"]()
    root.c = c["Leaf"]()
    root.again = root.a
    root.register_parameter("tied", root.seq.x.w)
    for m in modules_in_order(root):
        m.__dict__["tag"] = ".".join(Index(root).label(m)[1]) or "root"
    return root


@contextlib.contextmanager
def tree(side: str, log: Log, bn: bool = True) -> Iterator[nn.Module]:
    """``build``'s tree for ``side``; the accelerated side's classes are restored after."""
    root = build(fastmodule.Module if side == "fast" else nn.Module, log, bn)
    if side != "accel":
        yield root
        return
    classes = {type(m) for m in modules_in_order(root)}
    fastmodule.accelerate(root)
    # (Where no native path is on, accelerate() changes nothing: the side runs stock.)
    assert all(fastmodule.is_accelerated(m) for m in modules_in_order(root)) is NATIVE
    try:
        yield root
    finally:
        for cls in classes if NATIVE else ():
            _core.restore_class(cls)


def modules_in_order(root: nn.Module) -> list[nn.Module]:
    """Modules in named_modules order, read from the registries (no walk under test)."""
    return Index(root).modules


# --------------------------------------------------------------------------- observing


def outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """``fn()``'s value, or its exception (KeyboardInterrupt included): type and text."""
    try:
        return ("ok", fn())
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the outcome under test
        return ("raised", type(e).__name__, str(e))


def tensor(ix: Index, t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    g = t.grad if t.is_leaf else None
    return (
        ix.label(t),
        type(t).__name__,
        str(t.dtype),
        t.detach().double().flatten().tolist(),
        t.requires_grad,
        None if g is None else (str(g.dtype), g.double().flatten().tolist()),
    )


def snapshot(root: nn.Module, ix: Index) -> list[Any]:
    """Every module's flags, counters and tensors, read from the registries directly."""
    ix.extend(root)
    out = []
    for m in ix.modules:
        d = m.__dict__
        out.append(
            (
                ix.label(m),
                type(m).__name__,
                d.get("training"),
                d.get("calls"),
                d.get("seen"),
                [(k, tensor(ix, v)) for k, v in d["_parameters"].items()],
                [(k, tensor(ix, v)) for k, v in d["_buffers"].items()],
                sorted(d["_non_persistent_buffers_set"]),
            )
        )
    return out


def described(ix: Index, v: Any) -> Any:
    """A call's value as comparable data (tensors by label and values, modules by path)."""
    if isinstance(v, torch.Tensor):
        return tensor(ix, v)
    if isinstance(v, nn.Module):
        return ix.label(v)
    if isinstance(v, dict):
        return (type(v).__name__, [(k, described(ix, x)) for k, x in v.items()])
    if isinstance(v, list | tuple):
        return [described(ix, x) for x in v]
    return v


def after(root: nn.Module, ix: Index) -> list[Any]:
    """Each walk twice: the first after a fault may record, the second replays."""
    out = []
    x = torch.ones(3, 2)
    for _ in range(2):
        for meth in ITERATORS:
            out.append((meth, outcome(lambda meth=meth: ix.items(getattr(root, meth)()))))
        out.append(("state_dict", outcome(lambda: described(ix, root.state_dict()))))
        out.append(("train", outcome(lambda: ix.label(root.train()))))
        out.append(("eval", outcome(lambda: ix.label(root.eval()))))
        out.append(("forward", outcome(lambda: described(ix, root(x)))))
        out.append(("snapshot", snapshot(root, ix)))
    return out


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread (a pool costs milliseconds per op here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def assert_same(scenario: Callable[[nn.Module, Index, Log], Any], bn: bool = True) -> None:
    """``scenario(root, index, log)`` on each side; each side's result, log and final
    state equal stock's."""
    seen = {}
    for side in SIDES:
        log: Log = []
        with tree(side, log, bn) as root:
            ix = Index(root)
            r = outcome(lambda: scenario(root, ix, log))  # noqa: B023
            during = log[:]
            seen[side] = (r, during, snapshot(root, ix), after(root, ix), log[len(during) :])
    for side in SIDES[1:]:
        assert seen[side] == seen["stock"], f"{side}: " + difference(seen["stock"], seen[side])


def difference(a: Any, b: Any, path: str = "") -> str:
    """Where two observations first differ."""
    if type(a) is type(b) and isinstance(a, list | tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return difference(x, y, f"{path}[{i}]")
    return f"at {path}: stock {a!r:.800} != {b!r:.800}"


def warm(root: nn.Module) -> None:
    """Record and replay the plans the calls keep (walks, train, state_dict, load, _apply)."""
    for _ in range(2):
        for meth in ITERATORS:
            list(getattr(root, meth)())
        root.train()
        sd = root.state_dict()
        root.load_state_dict(sd)
        root.float()
        root.zero_grad()


def give_grads(root: nn.Module) -> None:
    """A grad on every parameter that takes part in a forward."""
    root(torch.ones(3, 2)).sum().backward()


N_MODULES = 8  # modules_in_order(build(...)): root, a, seq, x, lin, bn, y, c (`again` is a)
# Where a fault is placed: the root, a leaf, a Leaf inside seq, the Linear, the
# BatchNorm, the last module.
AT = [0, 1, 3, 4, 5, 7]


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("where", ["forward", "hook", "pre_hook", "pre_hook_prepend"])
@pytest.mark.parametrize("at", AT)
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_exception_inside_a_forward(where: str, at: int, exc: type) -> None:
    """A forward, forward hook or pre-hook of the ``at``-th module raises: the modules
    called before it ran (BatchNorm's running stats updated), the rest did not, an
    always_call hook still ran; then forwards run normally."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        target = modules_in_order(root)[at]
        root.register_forward_hook(lambda m, a, o: log.append(("always", m.tag)), always_call=True)
        fault = exc(f"at {target.tag}")
        if where == "forward":
            if isinstance(target, nn.Linear | nn.BatchNorm1d):  # torch's forward: a hook
                target.register_forward_pre_hook(throw(fault))
            else:
                target.fail = fault
        else:

            def hook(m: nn.Module, *rest: Any) -> None:
                log.append((where, m.tag))
                raise fault

            if where == "hook":
                handle = target.register_forward_hook(hook)
            else:
                handle = target.register_forward_pre_hook(hook, prepend=where.endswith("prepend"))
        r = outcome(lambda: described(ix, root(torch.ones(3, 2))))
        if where == "forward":
            target.__dict__.pop("fail", None)
            target._forward_pre_hooks.clear()
        else:
            handle.remove()
        return r

    assert_same(sc)


def test_exception_in_forward_during_backward_hooks() -> None:
    """A full backward hook raising halfway through backward; grads given before it
    stay, later ones are not given; then zero_grad and backward again."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        handle = root.seq.register_full_backward_hook(throw(Boom("backward")))
        r = outcome(lambda: root(torch.ones(3, 2)).sum().backward())
        handle.remove()
        return r, [outcome(lambda: root.zero_grad()), outcome(lambda: give_grads(root))]

    assert_same(sc)


# --------------------------------------------------------------------------- state_dict


@pytest.mark.parametrize("kind", ["pre", "post", "private"])
@pytest.mark.parametrize("at", AT)
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_exception_inside_a_state_dict_hook(kind: str, at: int, exc: type) -> None:
    """A state_dict hook of the ``at``-th module raises (after recorded, replayed
    state_dicts); the next state_dicts see the tree, and the hook once removed."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        target = modules_in_order(root)[at]

        def hook(m: nn.Module, *rest: Any) -> None:
            log.append(("state_dict hook", kind, m.tag))
            raise exc(f"at {m.tag}")

        if kind == "pre":
            handle = target.register_state_dict_pre_hook(hook)
        elif kind == "post":
            handle = target.register_state_dict_post_hook(hook)
        else:
            handle = target._register_state_dict_hook(hook)
        first = [outcome(lambda: described(ix, root.state_dict())) for _ in range(2)]
        handle.remove()
        return first, [outcome(lambda: described(ix, root.state_dict())) for _ in range(2)]

    assert_same(sc)


# --------------------------------------------------------------------------- load_state_dict


def shifted(root: nn.Module) -> dict[str, Any]:
    """The tree's own state dict with every floating value moved, so a copy shows."""
    sd = root.state_dict()
    for k, v in sd.items():
        if v.is_floating_point():
            sd[k] = v + 10
    return sd


@pytest.mark.parametrize("where", ["override", "pre_hook", "post_hook"])
@pytest.mark.parametrize("at", AT)
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_exception_while_loading(where: str, at: int, exc: type) -> None:
    """``load_state_dict`` after recorded and replayed loads; the ``at``-th module's own
    ``_load_from_state_dict`` (an instance attribute), a load pre-hook or post-hook
    raises: the modules loaded before it keep the new values, the rest their old
    ones; then loads again, twice."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        target = modules_in_order(root)[at]
        sd = shifted(root)
        fault = exc(f"at {target.tag}")

        def fail(*args: Any) -> None:
            log.append(("load", where, target.tag))
            raise fault

        handle = None
        if where == "override":
            target.__dict__["_load_from_state_dict"] = fail
        elif where == "pre_hook":
            handle = target.register_load_state_dict_pre_hook(fail)
        else:
            handle = target.register_load_state_dict_post_hook(fail)
        first = outcome(lambda: described(ix, root.load_state_dict(sd)))
        state = snapshot(root, ix)
        target.__dict__.pop("_load_from_state_dict", None)
        if handle is not None:
            handle.remove()
        again = [
            outcome(lambda: described(ix, root.load_state_dict(shifted(root)))) for _ in range(2)
        ]
        return first, state, again

    assert_same(sc, bn=False)


# --------------------------------------------------------------------------- _apply and .to()


def tensor_count(root: nn.Module) -> int:
    """How many tensors torch's ``_apply`` hands to ``fn`` after ``give_grads``."""
    n = 0
    for m in modules_in_order(root):
        for p in m._parameters.values():
            if p is not None:
                n += 1 + (p.grad is not None)
        n += sum(b is not None for b in m._buffers.values())
    return n


@pytest.mark.parametrize("at", range(1, 33, 3))
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_apply_fn_raising_at_the_nth_tensor(at: int, exc: type) -> None:
    """``m._apply(fn)`` whose ``fn`` converts to float64 and raises at its ``at``-th
    call: what was converted stays converted (grads with their parameters), the rest
    stays float32; then ``.double()``/``.float()`` twice each."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        give_grads(root)
        calls: list[Any] = []

        def fn(t: torch.Tensor) -> torch.Tensor:
            calls.append(ix.label(t))
            if len(calls) == at:
                raise exc(f"tensor {at}")
            return t.to(torch.float64)

        first = outcome(lambda: ix.label(root._apply(fn)))
        state = snapshot(root, ix)
        conversions = []
        for name in ("double", "double", "float", "float"):
            conversions.append(outcome(lambda name=name: ix.label(getattr(root, name)())))
            conversions.append(snapshot(root, ix))
        return first, calls, state, conversions

    assert_same(sc)


def test_apply_fn_counts_cover_the_tree() -> None:
    """Sanity check of the scenario above: the N reached cover every tensor."""
    log: Log = []
    root = build(nn.Module, log)
    assert len(modules_in_order(root)) == N_MODULES
    give_grads(root)
    assert 20 <= tensor_count(root) <= 31


class Fragile(torch.Tensor):
    """A tensor subclass whose methods named in ``Fragile.refuse`` raise."""

    refuse: frozenset[str] = frozenset()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in cls.refuse:
            raise Boom(f"cannot {name}")
        return super().__torch_function__(func, types, args, kwargs or {})


@contextlib.contextmanager
def refusing(*names: str) -> Iterator[None]:
    Fragile.refuse = frozenset(names)
    try:
        yield
    finally:
        Fragile.refuse = frozenset()


@pytest.mark.parametrize("at", AT)
@pytest.mark.parametrize(
    "call", ["to(torch.float64)", "double()", "half()", "to(dtype=torch.float16)"]
)
def test_conversion_meeting_a_tensor_that_refuses(at: int, call: str) -> None:
    """A buffer of the ``at``-th module refuses to convert: the modules converted
    before it stay converted; then the same conversion twice, and back."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        target = modules_in_order(root)[at]
        target.register_buffer("fragile", torch.ones(2).as_subclass(Fragile))
        ix.extend(root)
        warm(root)
        with refusing("to", "double", "half", "float"):
            first = outcome(lambda: ix.label(eval(f"root.{call}")))
        state = snapshot(root, ix)
        again = []
        for c in (call, call, "float()", "float()"):
            again.append(outcome(lambda c=c: ix.label(eval(f"root.{c}"))))
            again.append(snapshot(root, ix))
        return first, state, again

    assert_same(sc)


def test_conversion_meeting_a_grad_that_refuses() -> None:
    """A parameter's grad refuses to convert (its parameter is converted first)."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        root.seq.y.w.grad = torch.ones(2).as_subclass(Fragile)
        with refusing("to", "double"):
            first = outcome(lambda: ix.label(root.double()))
        return (
            first,
            snapshot(root, ix),
            [outcome(lambda: ix.label(root.double())) for _ in range(2)],
        )

    assert_same(sc)


@pytest.mark.parametrize("at", AT[1:])
@pytest.mark.parametrize("set_to_none", [False, True])
@pytest.mark.parametrize("refuse", ["zero_", "requires_grad_"])
def test_zero_grad_meeting_a_grad_that_refuses(at: int, set_to_none: bool, refuse: str) -> None:
    """The ``at``-th module's parameter has a grad whose ``zero_`` or
    ``requires_grad_`` raises (set_to_none=False calls both): grads before it are
    zeroed, the rest kept; then zero_grad twice again."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        give_grads(root)
        target = modules_in_order(root)[at]
        p = next(iter(target._parameters.values()), None)
        if p is not None:
            p.grad = p.grad.detach().as_subclass(Fragile) if p.grad is not None else None
        with refusing(refuse):
            first = outcome(lambda: root.zero_grad(set_to_none))
        state = snapshot(root, ix)
        give_grads(root)
        return first, state, [outcome(lambda: root.zero_grad(set_to_none)) for _ in range(2)]

    assert_same(sc)


@pytest.mark.parametrize("at", AT[1:])
@pytest.mark.parametrize("flag", [False, True])
def test_requires_grad_meeting_a_parameter_that_refuses(at: int, flag: bool) -> None:
    """``requires_grad_(flag)`` reaches a parameter (a Fragile one) whose
    ``requires_grad_`` raises: parameters before it are switched, the rest not."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        root.requires_grad_(not flag)
        target = modules_in_order(root)[at]
        target.fragile = nn.Parameter(torch.ones(2).as_subclass(Fragile), requires_grad=not flag)
        ix.extend(root)
        with refusing("requires_grad_"):
            first = outcome(lambda: ix.label(root.requires_grad_(flag)))
        state = snapshot(root, ix)
        return (
            first,
            state,
            [outcome(lambda: ix.label(root.requires_grad_(flag))) for _ in range(2)],
        )

    assert_same(sc)


# --------------------------------------------------------------------------- apply(fn)


@pytest.mark.parametrize("at", range(1, N_MODULES + 2))
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_apply_raising_at_the_nth_module(at: int, exc: type) -> None:
    """``apply(fn)`` (children first) whose ``fn`` marks each module and raises at the
    ``at``-th: the marked ones stay marked; then ``apply`` twice again."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        order: list[Any] = []

        def fn(m: nn.Module) -> None:
            order.append(ix.label(m))
            m.__dict__["seen"] = m.__dict__.get("seen", 0) + 1
            if len(order) == at:
                raise exc(f"module {at}")

        first = outcome(lambda: ix.label(root.apply(fn)))
        again = [
            outcome(lambda: ix.label(root.apply(lambda m: order.append(ix.label(m)))))
            for _ in range(2)
        ]
        return first, order, again

    assert_same(sc)


# --------------------------------------------------------------------------- KeyboardInterrupt


@pytest.mark.parametrize("meth", ITERATORS)
@pytest.mark.parametrize("at", [0, 1, 3, 6])
def test_keyboard_interrupt_in_a_walk_consumer(meth: str, at: int) -> None:
    """A loop over a (replayed) walk is interrupted after ``at`` items; the walk is
    abandoned or closed, the tree changed, and the next walks see the change."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        got: list[Any] = []

        def loop() -> None:
            for item in getattr(root, meth)():
                if len(got) == at:
                    raise KeyboardInterrupt
                got.append(ix.item(item))

        first = outcome(loop)
        root.seq.late = type(root.a)()
        del root.c
        return first, got, [outcome(lambda: ix.items(getattr(root, meth)())) for _ in range(2)]

    assert_same(sc)


@pytest.mark.parametrize("at", [0, 2, 4])
def test_keyboard_interrupt_inside_a_hook_mid_train_walk(at: int) -> None:
    """``train()``/``eval()`` over a tree whose ``at``-th module's class reads a property
    raising KeyboardInterrupt when ``training`` is set: flags set before stay set."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        target = modules_in_order(root)[at]
        target.__dict__["stop"] = True
        cls = type(target)
        orig = cls.__setattr__

        def setattr_(self: nn.Module, name: str, value: Any) -> None:
            if name == "training" and self.__dict__.get("stop"):
                log.append(("interrupt", self.tag))
                raise KeyboardInterrupt
            orig(self, name, value)

        cls.__setattr__ = setattr_  # type: ignore[method-assign, assignment]
        try:
            first = [outcome(lambda: ix.label(root.train(False))), snapshot(root, ix)]
        finally:
            cls.__setattr__ = orig  # type: ignore[method-assign]
        return first, [outcome(lambda: ix.label(root.train(False))) for _ in range(2)]

    assert_same(sc)


def test_keyboard_interrupt_from_a_finalizer_is_unraisable() -> None:
    """A finalizer raising KeyboardInterrupt while ``.double()`` frees the buffer it
    watches is reported as unraisable (not propagated), at the same point of the walk,
    and the conversion completes."""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        # A buffer only the tree holds (the index keeps the others alive).
        root.seq.x.register_buffer("watched", torch.ones(2))

        def fire() -> None:
            # Where the walk is when the old buffer is freed: what is converted yet.
            dtypes = [str(t.dtype) for m in ix.modules for t in m._buffers.values()]
            log.append(("finalizer", dtypes))
            raise KeyboardInterrupt

        fin = weakref.finalize(root.seq.x.watched, fire)
        reported: list[Any] = []
        old = sys.unraisablehook
        sys.unraisablehook = lambda u: reported.append(u.exc_type.__name__)
        try:
            first = outcome(lambda: ix.label(root.double()))
            fin.detach()
        finally:
            sys.unraisablehook = old
        return first, reported

    assert_same(sc)


@pytest.mark.parametrize("watched", ["b", "nb"])
def test_finalizer_changing_the_buffers_mid_conversion(watched: str) -> None:
    """``.double()`` replaces a buffer whose finalizer registers another buffer on the
    same module: torch's loop holds the old buffer in a local until it takes the next
    item, so the finalizer runs then (the next buffer converted, then "dictionary
    changed size during iteration"; for the last buffer, after the loop: no error).
    (found/06_apply_frees_old_buffer_early.py)"""

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        leaf = root.seq.x
        # Fresh buffers only the tree holds (the index keeps the original ones alive).
        leaf.register_buffer("b", torch.ones(2))
        leaf.register_buffer("nb", torch.ones(2), persistent=False)

        def fire() -> None:
            log.append(("finalizer", [str(t.dtype) for t in leaf._buffers.values()]))
            leaf.register_buffer("late", torch.zeros(2))

        fin = weakref.finalize(leaf._buffers[watched], fire)
        first = outcome(lambda: ix.label(root.double()))
        fin.detach()
        return first, [outcome(lambda: ix.label(root.double())) for _ in range(2)]

    assert_same(sc)


def test_keyboard_interrupt_sent_by_another_thread_during_a_hook() -> None:
    """``_thread.interrupt_main()`` from a second thread while the main thread runs a
    state_dict pre-hook on a child (sequenced with events): the interrupt is delivered
    at the same point as in torch's code, leaving the same partial result."""
    import _thread

    def sc(root: nn.Module, ix: Index, log: Log) -> Any:
        warm(root)
        go, done = threading.Event(), threading.Event()

        def other() -> None:
            go.wait()
            _thread.interrupt_main()
            done.set()

        t = threading.Thread(target=other)
        t.start()

        def hook(m: nn.Module, prefix: str, keep_vars: bool) -> None:
            log.append(("hook", m.tag))
            go.set()
            done.wait()

        handle = root.seq.x.register_state_dict_pre_hook(hook)
        try:
            first = outcome(lambda: described(ix, root.state_dict()))
        finally:
            handle.remove()
            t.join()
        return first

    assert_same(sc)
