"""What importing fastmodule, ``accelerate`` and ``install`` change: nothing stock can see.

Regressions for the reproducers 20, 21, 24, 25, 26, 27 and the decision on 28
(tracebacks and warnings through the native walks). Each scenario that needs a
fresh interpreter (one that never imported fastmodule, for the stock side) runs
as a script in two subprocesses, ``stock`` and ``fast``, whose outputs must be
equal.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE


def run_both(script: str, args: tuple[str, ...] = ()) -> tuple[str, str]:
    """``script`` run as ``python -c script stock *args`` and ``... fast *args``: the
    two standard outputs (each run must succeed)."""
    outs = []
    for side in ("stock", "fast"):
        proc = subprocess.run(
            [sys.executable, "-X", "dev", "-c", textwrap.dedent(script), side, *args],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(proc.stdout)
    return outs[0], outs[1]


# --------------------------------------------------------------------------- 20


CLASSES_FREED = """
import gc, sys, weakref, torch
from torch import nn
mode = sys.argv[1:]
if mode[0] == "fast":
    import fastmodule
    if mode[1] == "install":
        fastmodule.install()
def accel(m):
    if mode == ["fast", "accelerate"]:
        fastmodule.accelerate(m)
    return m
Dyn = type("Dyn", (nn.Module,), {"forward": lambda self, x: x})
accel(Dyn())(torch.zeros(1))
r = weakref.ref(Dyn)
del Dyn
gc.collect()
print("dynamic class freed:", r() is None)
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(2, 2)
    def forward(self, x): return self.l(x).relu()
refs = []
for _ in range(20):
    gm = accel(torch.fx.symbolic_trace(Net()))
    gm(torch.zeros(1, 2))
    refs.append(weakref.ref(type(gm)))
    del gm
p = accel(nn.Linear(2, 2))
torch.nn.utils.parametrize.register_parametrization(p, "weight", nn.Identity())
refs.append(weakref.ref(type(p)))
accel(p)
del p
gc.collect()
print("GraphModule and parametrized classes freed:", [r() is None for r in refs])
"""


@pytest.mark.parametrize("mode", ["install", "accelerate"])
def test_20_accelerated_classes_are_not_kept_alive(mode: str) -> None:
    """Classes made at run time (``type()``, ``torch.fx`` GraphModules,
    parametrization) die as in stock when accelerated or under ``install()``."""
    stock, fast = run_both(CLASSES_FREED, (mode,))
    assert "False" not in stock
    assert fast == stock


@pytest.mark.requires_native("which classes the core holds accelerated, and torch's prefix flag")
def test_20_a_new_class_at_a_freed_class_address_is_not_accelerated() -> None:
    """The set of accelerated classes never names a dead class: a class allocated
    where an accelerated one was is stock (and stock modules run stock code)."""
    addresses: set[int] = set()
    for _ in range(50):
        cls = type("Dyn", (nn.Module,), {})
        fastmodule.accelerate(cls())
        assert _core.is_accelerated_class(cls)
        addresses.add(id(cls))
        del cls
        gc.collect()
    namespace = sys.modules["torch.nn.modules.module"].__dict__
    assert namespace["_fastmodule_accelerated"] is False  # the flag follows deaths
    reused = 0
    for _ in range(3000):
        cls = type("Other", (nn.Module,), {})
        if id(cls) in addresses:
            reused += 1
            assert not _core.is_accelerated_class(cls)
            assert not fastmodule.is_accelerated(cls())
    if not reused:
        pytest.skip("the allocator reused no address")


def test_20_restore_after_the_class_died_and_weakref_to_live_class() -> None:
    """A live accelerated class stays accelerated (held weakly, not dropped early);
    restoring it afterwards works as before."""
    cls = type("Live", (nn.Module,), {})
    m = fastmodule.accelerate(cls())
    gc.collect()
    assert fastmodule.is_accelerated(m) is NATIVE  # (nothing is where no native path is on)
    r = weakref.ref(cls)
    assert fastmodule.restore(m) is m
    assert not fastmodule.is_accelerated(m)
    del m, cls
    gc.collect()
    assert r() is None


# --------------------------------------------------------------------------- 21, 27


EVENTS = """
import sys, torch
from torch import nn
if sys.argv[1] == "fast":
    import fastmodule
    if sys.argv[2] == "accelerated":
        Other = type("Other", (nn.Module,), {})
        fastmodule.accelerate(Other())  # some class accelerated: the route check runs
torch_file = sys.modules["torch.nn.modules.module"].__file__
class Sub(nn.Module):
    def __init__(self):
        super().__init__(); self.l = nn.Linear(2, 2); self.register_buffer("b", torch.zeros(1))
m = nn.Sequential(Sub(), nn.Sequential(nn.ReLU(), Sub()))
def work():
    m.train(); m.eval(); m.requires_grad_(True); m.zero_grad()
    list(m.named_parameters()); list(m.parameters()); list(m.buffers()); list(m.named_buffers())
    list(m.children()); list(m.named_children()); list(m.modules()); list(m.named_modules())
    sd = m.state_dict(); m.load_state_dict(sd); m.float(); m.apply(lambda x: None)
    m.get_submodule("1.1"); m.get_parameter("0.l.weight"); m.get_buffer("0.b")
    m.set_submodule("1.0", nn.ReLU())
    s = Sub(); s.register_buffer("c", None); s.register_parameter("p", None)
    s.add_module("x", nn.ReLU()); s.register_module("y", nn.ReLU())
    bads = (lambda: m.train(1), lambda: m.get_submodule("zz"), lambda: m.state_dict(1, 2, 3, 4))
    for bad in bads:
        try: bad()
        except Exception as e: pass
    g = m.named_parameters(); next(g)
    try: g.throw(KeyError("x"))
    except KeyError: pass
    g = m.modules(); next(g); g.close()
def torch_only(frame):
    return frame.f_code.co_filename == torch_file
events = []
def tracer(frame, event, arg):
    if torch_only(frame):
        events.append((frame.f_code.co_name, event, frame.f_lineno))
    return tracer
sys.settrace(tracer); work(); sys.settrace(None)
print("settrace", len(events))
for e in events: print(e)
if hasattr(sys, "monitoring") and sys.argv[2] != "accelerated":
    mon = sys.monitoring; E = mon.events; T = 4
    mon.use_tool_id(T, "probe")
    got = []
    def rec(name):
        def cb(code, *a):
            if name in ("C_RETURN", "C_RAISE") and code is work.__code__:
                got.append((name, getattr(a[1], "__qualname__", type(a[1]).__name__)))
            elif code.co_filename == torch_file:
                got.append((name, code.co_name, a[0] if name == "LINE" else None))
        return cb
    names = ["LINE", "PY_START", "PY_RETURN", "PY_YIELD", "PY_RESUME", "PY_THROW", "PY_UNWIND",
             "RAISE", "RERAISE", "EXCEPTION_HANDLED", "C_RETURN", "C_RAISE", "STOP_ITERATION"]
    mon.register_callback(T, E.CALL, rec("CALL")); mask = E.CALL  # C_* need it
    for n in names:
        mon.register_callback(T, getattr(E, n), rec(n)); mask |= getattr(E, n)
    mon.set_events(T, mask); work(); mon.set_events(T, 0)
    print("monitoring", len(got))
    for g in got: print(g)
"""


@pytest.mark.parametrize("fast_mode", ["import", "accelerated"])
def test_21_tracers_see_torchs_line_events(fast_mode: str) -> None:
    """After ``import fastmodule`` (and while some other class is accelerated),
    ``sys.settrace`` sees exactly stock's events in torch's routed functions
    called on stock modules: no line event at a ``def`` (pdb's first ``step``
    stops where stock's does), generators thrown into included; on 3.12+ the
    same holds for ``sys.monitoring``'s line, start/return/yield/raise events."""
    stock, fast = run_both(EVENTS, (fast_mode,))
    assert stock.count("\n") > 1000
    assert fast == stock


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring needs CPython 3.12+")
def test_27_no_c_events_for_torchs_methods_on_stock_modules() -> None:
    """3.12+: calls of torch's routed and registration methods from Python code on
    stock modules are Python calls, as in stock: no C_RETURN/C_RAISE events (the
    ``EVENTS`` scenario records them for the caller's code)."""
    stock, fast = run_both(EVENTS, ("import",))
    assert "('C_RETURN', 'list')" in stock
    for out in (stock, fast):
        assert "('C_RETURN', 'Module." not in out
        assert "('C_RAISE', 'Module." not in out
    assert fast == stock


# --------------------------------------------------------------------------- 24, 25


COMPILE = """
import sys, torch
from torch import nn
from torch._dynamo.utils import counters
if sys.argv[1] == "fast":
    import fastmodule
    Base = fastmodule.Module
else:
    Base = nn.Module
def gb(*a):
    torch._dynamo.graph_break()
class One(Base):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(4, 4)
    def forward(self, x):
        sd = self.state_dict()
        return self.lin(x) + sd["lin.weight"].sum()
class Many(Base):
    def __init__(self):
        super().__init__(); self.lin = nn.Linear(4, 4)
    def forward(self, x):
        self.load_state_dict(self.state_dict())
        self.apply(gb)
        self.to(torch.float32); self.float(); self.cpu()
        for p in self.parameters(): gb()
        for p in self.named_parameters(): gb()
        for p in self.buffers(): gb()
        for p in self.named_modules(): gb()
        for p in self.children(): gb()
        self.train(); self.eval(); self.requires_grad_(True); self.zero_grad()
        self.get_submodule("lin"); self.get_parameter("lin.weight")
        return self.lin(x)
for cls in (One, Many):
    torch._dynamo.reset(); counters.clear()
    torch.manual_seed(0)
    f = torch.compile(cls(), backend="eager")
    x = torch.randn(2, 4)
    with __import__("warnings").catch_warnings(record=True) as w:
        __import__("warnings").simplefilter("always")
        for _ in range(3):
            y = f(x)
    print(cls.__name__, round(y.sum().item(), 4), dict(counters["frames"]),
          sum(counters["graph_break"].values()), dict(counters["recompiles"]),
          sorted({str(x.message)[:60] for x in w if "recompile" in str(x.message)}))
"""


def test_24_25_compile_counts_equal_stock() -> None:
    """``torch.compile`` (graph breaks allowed) of a ``fastmodule.Module`` whose
    forward breaks inside whole-tree methods: the same frames, graph breaks and
    recompiles as stock (fastmodule's methods have no frame of their own for
    Dynamo, and none shares a code object with another)."""
    stock, fast = run_both(COMPILE)
    assert fast == stock


def test_24_25_method_frames_are_torchs() -> None:
    """Each of ``fastmodule.Module``'s methods, and each native body, has its own code
    object attributed to torch's method (file, ``def`` line, name)."""
    from fastmodule._methods import dispatch as _dispatch

    torch_file = sys.modules["torch.nn.modules.module"].__file__
    codes = []
    for name, body in _dispatch.BODIES.items():
        method = fastmodule.Module.__dict__[name]
        torch_code = _dispatch.original_code(name)
        for code in (method.__code__, body.__code__):
            assert code.co_filename == torch_file
            assert code.co_name == name
            assert code.co_qualname == torch_code.co_qualname
            assert {p[0] for p in code.co_positions()} == {torch_code.co_firstlineno}
            codes.append(code)
    assert len(set(map(id, codes))) == len(codes)


# --------------------------------------------------------------------------- 26


DEEP = """
import sys, torch
from torch import nn
if sys.argv[1] == "fast":
    import fastmodule  # only the import
root = cur = nn.Sequential()
for _ in range(800):
    nxt = nn.Sequential(); cur.add_module("a", nxt); cur = nxt
cur.add_module("lin", nn.Linear(1, 1))
calls = [("state_dict", lambda: len(root.state_dict())), ("train", lambda: root.train() is root),
         ("float", lambda: root.float() is root),
         ("apply", lambda: root.apply(lambda m: None) is root),
         ("named_modules", lambda: len(list(root.named_modules()))),
         ("load_state_dict", lambda: str(root.load_state_dict(root.state_dict())))]
for name, call in calls:
    try:
        print(name, "->", call())
    except RecursionError as e:
        print(name, "-> RecursionError:", e)
"""


def test_26_deep_stock_tree_after_import() -> None:
    """After only ``import fastmodule``, a stock tree 800 levels deep (inside the
    default recursion limit) walks as in stock: torch's functions are not called
    through C (on 3.12+ that took a C stack level per call)."""
    stock, fast = run_both(DEEP)
    assert "RecursionError" not in stock
    assert fast == stock


# RecursionError texts for a module that contains itself: from 3.12 on torch's
# functions are no longer called through C, so stock's text is the bare one.
SELF_CALLS: dict[str, Callable[[nn.Module], Any]] = {
    "state_dict": lambda m: m.state_dict(),
    "train": lambda m: m.train(),
    "apply": lambda m: m.apply(lambda x: None),
    "float": lambda m: m.float(),
    "load_state_dict": lambda m: m.load_state_dict({}),
}


@pytest.mark.parametrize("call", list(SELF_CALLS))
def test_26_module_containing_itself_raises_stocks_recursion_error(call: str) -> None:
    """A module that contains itself: the same RecursionError (type and text) from
    torch's method on a stock module and from fastmodule's native walk."""

    def outcome(base: type[nn.Module]) -> tuple[Any, ...]:
        m = type("Loop", (base,), {})()
        m.add_module("me", m)
        try:
            SELF_CALLS[call](m)
        except RecursionError as e:
            return type(e), str(e)
        return ("no error",)

    assert outcome(fastmodule.Module) == outcome(nn.Module)


# --------------------------------------------------------------------------- 28


class _Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)


class _FastLeaf(fastmodule.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)


class _WalkRaises(nn.Module):
    armed = False

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if _WalkRaises.armed:
            raise ValueError("boom")
        return super().named_modules(*args, **kwargs)


class _LoadRaises(nn.Module):
    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError("boom")


def _between(tb: Any) -> list[tuple[str, Any, str]]:
    """(file, module, function) of the frames of a traceback that are not this
    file's (the caller, the lambdas and the callbacks are)."""
    return [
        (frame.f_code.co_filename, frame.f_globals.get("__name__"), frame.f_code.co_name)
        for frame, _ in traceback.walk_tb(tb)
        if frame.f_code.co_filename != __file__
    ]


def _observe(model: nn.Module, call: Callable[[nn.Module], Any]) -> tuple[Any, ...]:
    """The frames a traceback shows between the caller and a callback that raises,
    and where a ``stacklevel=2`` warning from a callback points (file, module)."""
    _WalkRaises.armed = True
    try:
        call(model)
    except ValueError as e:
        frames = _between(e.__traceback__)
    else:  # pragma: no cover - the scenario raises
        raise AssertionError("no error")
    finally:
        _WalkRaises.armed = False

    def warn_up(m: nn.Module) -> None:
        warnings.warn("from fn", stacklevel=2)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.filterwarnings("always", module=r"torch\.nn\.modules\.module")
        model.apply(warn_up)
    return frames, {(w.filename, str(w.message)) for w in caught}, len(caught)


def _boom(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        raise ValueError("boom")


def _convert_boom(t: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom")


CALLS: dict[str, Callable[[nn.Module], Any]] = {
    "apply": lambda m: m.apply(_boom),
    "_apply": lambda m: m._apply(_convert_boom),
    "modules": lambda m: list(m.modules()),
    "load_state_dict": lambda m: m.load_state_dict(m.state_dict()),
}


@pytest.mark.parametrize("kind", ["accelerated", "fastmodule.Module"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_28_frames_and_warnings_read_torchs_module(kind: str, call: str) -> None:
    """Tracebacks through ``apply``/``_apply``/walks/``load_state_dict`` and
    ``stacklevel=2`` warnings from their callbacks show torch's ``module.py``
    frames (file, module globals, function names among stock's), and a warning
    filter keyed on torch's module matches them as in stock. What differs (see the
    README's Known differences): the native walk has one frame where torch has one
    per level, at the method's ``def`` line."""
    torch_file = sys.modules["torch.nn.modules.module"].__file__

    def tree(fast: bool) -> nn.Module:
        leaf = (_FastLeaf if kind == "fastmodule.Module" and fast else _Leaf)()
        if call == "modules":
            leaf.add_module("r", _WalkRaises())
        if call == "load_state_dict":
            leaf.add_module("r", _LoadRaises())
        # A fastmodule.Module at the root: its own method runs the native walk.
        return leaf if kind == "fastmodule.Module" else nn.Sequential(nn.Sequential(leaf))

    stock_frames, stock_warned, stock_n = _observe(tree(False), CALLS[call])
    model = tree(True)
    with fastmodule.accelerated(model) if kind == "accelerated" else _nothing():
        fast_frames, fast_warned, fast_n = _observe(model, CALLS[call])
    expected_modules = {"torch.nn.modules.module"}
    for frames in (stock_frames, fast_frames):
        assert {f for f, _, _ in frames} <= {torch_file}, frames
        assert {m for _, m, _ in frames} <= expected_modules, frames
    assert fast_frames
    assert {n for _, _, n in fast_frames} <= {n for _, _, n in stock_frames}
    assert fast_warned == stock_warned == {(torch_file, "from fn")}
    assert fast_n == stock_n


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _deep_chain_outcomes(base: type[nn.Module], depth: int) -> list[Any]:
    class Chain(base):  # type: ignore[misc, valid-type]
        pass

    root = cur = Chain()
    for _ in range(depth):
        nxt = Chain()
        cur.add_module("a", nxt)
        cur = nxt
    cur.add_module("lin", nn.Linear(1, 1))
    out: list[Any] = []
    for call in (
        lambda: root.train() is root,
        lambda: len(root.state_dict()),
        lambda: root.apply(lambda m: None) is root,
        lambda: root.float() is root,
        lambda: len(list(root.named_parameters())),
    ):
        try:
            out.append(call())
        except RecursionError as e:
            out.append(("RecursionError", str(e)))
    return out


def test_deep_tree_under_a_raised_recursion_limit_walks_as_stock() -> None:
    """A 3000-level tree under a recursion limit of 10000: stock's Python recursion
    takes no native stack (nor, from 3.12 on, CPython's C recursion limit of 1500),
    and fastmodule's native walks get as deep (26's deep-tree half, by design)."""
    from tests.isolation import at_fixed_depth

    stock = at_fixed_depth(lambda: _deep_chain_outcomes(nn.Module, 3000), limit=10000)
    assert stock == [True, 2, True, True, 2]
    fast = at_fixed_depth(lambda: _deep_chain_outcomes(fastmodule.Module, 3000), limit=10000)
    assert fast == stock
