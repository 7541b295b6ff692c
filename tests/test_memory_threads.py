"""Threads, memory and robustness: fastmodule under load, compared with stock.

``tests/test_threads.py`` and ``tests/test_refcounts.py`` cover the basics (one
fastmodule model called from eight threads on one input, walks beside one
calling thread, flat refcounts over plain calls and attribute traffic, a
child-to-parent cycle). This file extends them to stock models under
``fastmodule.accelerate``, per-thread inputs, hooks and kwargs, state-dict round
trips racing with forwards, acceleration toggled while other threads call,
error paths, conversions and state-dict cycles under ``tracemalloc``, more kinds
of reference cycle, and a hypothesis fuzz over module trees with hooks.
Every test that accelerates restores in ``finally``.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import BASES, NATIVE, outcome
from tests.isolation import stock_module_classes

STOCK = torch.nn.Module
FAST = fastmodule.Module
KINDS = ["fast", "accelerated"]
THREADS = 8


def left_accelerated() -> list[type]:
    """Stock module classes (fastmodule's excluded) accelerated in place right now."""
    return [cls for cls in stock_module_classes() if _core.is_accelerated_class(cls)]


@pytest.fixture(autouse=True)
def _nothing_left_accelerated() -> Iterator[None]:
    """Fail (after cleaning up) a test that leaves a class accelerated."""
    yield
    left = left_accelerated()
    for cls in left:
        _core.restore_class(cls)
    assert left == [], f"test left classes accelerated: {left}"


# --------------------------------------------------------------------------- models


def make_net(base: type[nn.Module]) -> nn.Module:
    """A seeded tree with hooks that change values, kwargs and a shared child."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.norm = nn.LayerNorm(6)
            self.register_buffer("scale", torch.tensor(0.5))

        def forward(self, x: torch.Tensor, *, gain: float = 1.0) -> torch.Tensor:
            return self.norm(torch.tanh(self.lin(x))) * self.scale * gain

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.shared = self.blocks[0]
            self.head = nn.Sequential(nn.Linear(6, 3), nn.ReLU())

        def forward(self, x: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
            for b in self.blocks:
                x = b(x, gain=gain) + x
            return self.head(self.shared(x))

    torch.manual_seed(0)
    net = Net()
    net.blocks[1].register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    net.blocks[2].register_forward_hook(
        lambda m, a, kw, o: o + kw.get("gain", 0.0), with_kwargs=True
    )
    net.head.register_forward_hook(lambda m, a, o: None)
    return net


@contextlib.contextmanager
def model_of(kind: str) -> Iterator[nn.Module]:
    """A fastmodule tree, or a stock tree accelerated for the block (restored on exit)."""
    if kind == "fast":
        yield make_net(FAST)
        return
    model = make_net(STOCK)
    with fastmodule.accelerated(model):
        # (Where no native path is on, nothing is accelerated: the tree runs stock.)
        assert all(fastmodule.is_accelerated(m) for m in model.modules()) is NATIVE
        yield model
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())


def inputs(n: int) -> list[torch.Tensor]:
    """``n`` different input batches, one per thread."""
    g = torch.Generator().manual_seed(99)
    return [torch.randn(4, 6, generator=g) for _ in range(n)]


def run_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(i)`` on ``n`` threads started together; the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


# --------------------------------------------------------------------------- threads


@pytest.fixture
def one_intra_op_thread() -> Iterator[None]:
    """Eight Python threads on two cores: keep torch's own pool out of the way."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("kind", KINDS)
def test_threads_per_thread_inputs_match_stock(kind: str, one_intra_op_thread: None) -> None:
    xs = inputs(THREADS)
    stock = make_net(STOCK)
    with torch.inference_mode():
        expected = [(stock(x), stock(x, gain=0.5)) for x in xs]
    mismatches = [0] * THREADS
    with model_of(kind) as model:
        with torch.inference_mode():
            single = [(model(x), model(x, gain=0.5)) for x in xs]

        def work(i: int) -> None:
            with torch.inference_mode():
                for _ in range(100):
                    a, b = model(xs[i]), model(xs[i], gain=0.5)
                    if not (torch.equal(a, expected[i][0]) and torch.equal(b, expected[i][1])):
                        mismatches[i] += 1

        errors = run_threads(THREADS, work)
    assert not errors, errors
    assert mismatches == [0] * THREADS
    for (a, b), (c, d) in zip(single, expected, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_round_trips_while_others_forward(kind: str, one_intra_op_thread: None) -> None:
    xs = inputs(THREADS - 1)
    with model_of(kind) as model:
        with torch.inference_mode():
            expected = [model(x) for x in xs]
        ref = {k: v.clone() for k, v in model.state_dict().items()}
        done = threading.Event()
        walker: dict[str, Any] = {"sds": 0, "bad": []}
        mismatches = [0] * THREADS

        def work(i: int) -> None:
            if i == THREADS - 1:  # the state-dict thread
                try:
                    for _ in range(60):
                        sd = model.state_dict()
                        if list(sd) != list(ref) or not all(
                            torch.equal(v, ref[k]) for k, v in sd.items()
                        ):
                            walker["bad"].append(list(sd))
                        r = model.load_state_dict(sd)  # the same values: outputs stay put
                        if r.missing_keys or r.unexpected_keys:
                            walker["bad"].append(r)
                        [n for n, _ in model.named_parameters()]
                        walker["sds"] += 1
                finally:
                    done.set()
                return
            with torch.inference_mode():
                while not done.is_set():
                    if not torch.equal(model(xs[i]), expected[i]):
                        mismatches[i] += 1

        errors = run_threads(THREADS, work)
    assert not errors, errors
    assert walker["sds"] == 60 and walker["bad"] == []
    assert mismatches == [0] * THREADS


@pytest.mark.parametrize("base", BASES, ids=["stock", "fast"])
def test_hooks_registered_and_removed_while_others_call(
    base: type[nn.Module], one_intra_op_thread: None
) -> None:
    """Hook dicts mutate under the callers: identity hooks never change a result."""
    xs = inputs(THREADS - 1)
    model = make_net(base)
    with torch.inference_mode():
        expected = [model(x) for x in xs]
    done = threading.Event()
    mismatches = [0] * THREADS
    fired = [0]

    def count(*args: Any) -> None:
        fired[0] += 1

    def work(i: int) -> None:
        if i == THREADS - 1:
            try:
                for _ in range(300):
                    handles = [
                        model.register_forward_hook(count),
                        model.blocks[0].register_forward_pre_hook(count),
                        model.head[0].register_forward_hook(count, always_call=True),
                        nn.modules.module.register_module_forward_hook(count),
                    ]
                    for h in handles:
                        h.remove()
            finally:
                done.set()
            return
        with torch.inference_mode():
            while not done.is_set():
                if not torch.equal(model(xs[i]), expected[i]):
                    mismatches[i] += 1

    errors = run_threads(THREADS, work)
    assert not errors, errors
    assert mismatches == [0] * THREADS
    assert len(model._forward_hooks) == 0 and len(model.blocks[0]._forward_pre_hooks) == 0


def test_accelerate_toggled_while_others_call(one_intra_op_thread: None) -> None:
    """Per-class slots are swapped under running callers: results never change."""
    model = make_net(STOCK)
    xs = inputs(THREADS - 1)
    with torch.inference_mode():
        expected = [model(x) for x in xs]
    done = threading.Event()
    mismatches = [0] * THREADS
    toggles = [0]

    def work(i: int) -> None:
        if i == THREADS - 1:
            try:
                for _ in range(300):
                    fastmodule.accelerate(model)
                    fastmodule.restore(model)
                    toggles[0] += 1
            finally:
                done.set()
            return
        with torch.inference_mode():
            while not done.is_set():
                if not torch.equal(model(xs[i]), expected[i]):
                    mismatches[i] += 1
                model.blocks[0].lin.weight  # attribute reads through the swapped slot

    try:
        errors = run_threads(THREADS, work)
    finally:
        fastmodule.restore(model)
    assert not errors, errors
    assert toggles[0] == 300 and mismatches == [0] * THREADS
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())


@pytest.mark.parametrize("kind", KINDS)
def test_threads_train_their_own_models(kind: str, one_intra_op_thread: None) -> None:
    """Autograd and SGD steps in parallel threads, one model instance each."""

    def train(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for _ in range(3):  # plain SGD by hand: torch.optim's first use costs seconds
            model.zero_grad()
            model(x).square().sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(p.grad, alpha=0.05)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    n = 4
    xs = inputs(n)
    expected = [train(make_net(STOCK), x) for x in xs]
    results: list[Any] = [None] * n
    models = [make_net(FAST if kind == "fast" else STOCK) for _ in range(n)]
    with contextlib.ExitStack() as stack:
        if kind == "accelerated":
            stack.enter_context(fastmodule.accelerated(nn.ModuleList(models)))

        def work(i: int) -> None:
            results[i] = train(models[i], xs[i])

        errors = run_threads(n, work)
    assert not errors, errors
    for got, want in zip(results, expected, strict=True):
        assert list(got) == list(want)
        assert all(torch.equal(got[k], want[k]) for k in want)


# --------------------------------------------------------------------------- memory


def refcounts(objs: list[Any]) -> list[int]:
    """``sys.getrefcount`` of each object, after a collection."""
    gc.collect()
    return [sys.getrefcount(o) for o in objs]


def traced_growth(fn: Callable[[], None], warmup: Callable[[], None] | None = None) -> int:
    """Bytes of traced memory that ``fn`` leaves behind, after a warm-up (default: ``fn``)."""
    (warmup or fn)()
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def _tiny_class(base: type[nn.Module]) -> type[nn.Module]:
    """A module whose forward costs nothing, so many calls fit in the time budget."""

    class Tiny(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.w = nn.Parameter(torch.zeros(2))
            self.register_buffer("b", torch.zeros(2))

        def forward(self, x: Any, *rest: Any, k: Any = None) -> Any:
            if k == "raise":
                raise ValueError("forward failed")
            return x

    return Tiny


Tiny = _tiny_class(fastmodule.Module)
#: Tiny's stock twin, accelerated in place by the tests that use it.
StockTiny = _tiny_class(nn.Module)


@contextlib.contextmanager
def tiny(kind: str) -> Iterator[nn.Module]:
    """A Tiny of ``kind``: fastmodule, or the stock twin accelerated for the block."""
    if kind == "fast":
        yield Tiny()
    else:
        m = StockTiny()
        with fastmodule.accelerated(m):
            yield m


def call_mix(m: nn.Module, x: Any, kw: Any, n: int) -> None:
    """``n`` rounds of four calls (positional, keyword, ``forward``), then ``n // 20``
    failing ones."""
    for _ in range(n):
        m(x)
        m(x, x)
        m(x, k=kw)
        m.forward(x)
    for _ in range(n // 20):
        try:
            m(x, k="raise")
        except ValueError:
            pass


@pytest.mark.parametrize("kind", KINDS)
def test_refcounts_flat_over_calls_with_hooks_and_errors(kind: str) -> None:
    with tiny(kind) as m:
        x, kw = torch.zeros(1), object()
        m.register_forward_pre_hook(lambda mod, a, k: None, with_kwargs=True)
        m.register_forward_hook(lambda mod, a, o: o)  # a hook result replaces the output
        m.register_forward_hook(lambda mod, a, o: None, always_call=True)
        tracked = [m, x, kw, m.w, m.lin, m.b, type(m)]
        call_mix(m, x, kw, 100)
        before = refcounts(tracked)
        call_mix(m, x, kw, 5000)  # 20k calls through three hooks, 250 failing
        assert refcounts(tracked) == before


@pytest.mark.parametrize("kind", KINDS)
def test_no_traced_growth_over_1e5_calls(kind: str) -> None:
    with tiny(kind) as m:
        x, kw = torch.zeros(1), object()
        tracked = [m, x, kw, m.w]
        before = refcounts(tracked)

        def warm() -> None:
            call_mix(m, x, kw, 500)

        growth = traced_growth(lambda: call_mix(m, x, kw, 25000), warm)  # 100k, 1250 failing
        m.register_forward_pre_hook(lambda mod, a: None)
        m.register_forward_hook(lambda mod, a, o: None)
        growth += traced_growth(lambda: call_mix(m, x, kw, 2500), warm)  # 10k through hooks
        assert refcounts(tracked) == before
    assert growth < 64 * 1024, growth


def make_tree(base: type[nn.Module]) -> nn.Module:
    """A tree for the traversal tests: nested blocks, a shared child and None slots."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("running", torch.zeros(3))
            self.register_buffer("tmp", torch.zeros(1), persistent=False)
            self.register_parameter("absent", None)

    class Root(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(4))
            self.shared = self.blocks[0]
            self.norm = nn.BatchNorm1d(3)

    torch.manual_seed(0)
    return Root()


@contextlib.contextmanager
def tree(kind: str) -> Iterator[nn.Module]:
    """A traversal tree of ``kind``; the stock one accelerated for the block."""
    if kind == "fast":
        yield make_tree(FAST)
    else:
        m = make_tree(STOCK)
        with fastmodule.accelerated(m):
            yield m


def traversals(m: nn.Module, n: int) -> None:
    """``n`` rounds of whole-tree walks and conversions (more kinds every tenth round)."""
    for i in range(n):
        list(m.named_parameters())
        m.train()
        m.float()
        if i % 10 == 0:
            list(m.named_buffers())
            list(m.named_modules(remove_duplicate=False))
            m.eval()
            m.requires_grad_(False)
            m.requires_grad_(True)


def sd_cycles(m: nn.Module, n: int) -> None:
    """``n`` state-dict round trips; every tenth also non-strict, keep_vars and failing."""
    bad = {"nope": torch.zeros(1)}
    for i in range(n):
        m.load_state_dict(m.state_dict())
        if i % 10 == 0:
            m.load_state_dict(m.state_dict(prefix="p.", keep_vars=True), strict=False)
            try:
                m.load_state_dict(bad)
            except RuntimeError:
                pass


@pytest.mark.parametrize("kind", KINDS)
def test_refcounts_flat_over_traversals_and_state_dicts(kind: str) -> None:
    with tree(kind) as m:
        tracked = [m, m.blocks, m.blocks[0], m.blocks[1].lin.weight, m.blocks[2].running]
        tracked += [m.norm.running_mean, m.norm.num_batches_tracked, type(m.blocks[0])]
        traversals(m, 10)
        sd_cycles(m, 10)
        before = refcounts(tracked)
        traversals(m, 1000)
        sd_cycles(m, 200)
        assert refcounts(tracked) == before


@pytest.mark.parametrize("kind", KINDS)
def test_no_traced_growth_over_traversals_and_state_dicts(kind: str) -> None:
    with tree(kind) as m:
        growth = traced_growth(
            lambda: (traversals(m, 1000), sd_cycles(m, 200)) and None,
            lambda: (traversals(m, 20), sd_cycles(m, 20)) and None,
        )
    assert growth < 64 * 1024, growth


def test_accelerate_restore_cycles_keep_refcounts_flat() -> None:
    m = make_tree(STOCK)
    classes = list(dict.fromkeys(type(s) for s in m.modules()))
    tracked: list[Any] = [m, *classes]
    try:
        fastmodule.accelerate(m)
        fastmodule.restore(m)
        before = refcounts(tracked)
        growth = traced_growth(
            lambda: [(fastmodule.accelerate(m), fastmodule.restore(m)) for _ in range(200)] and None
        )
        assert refcounts(tracked) == before
    finally:
        fastmodule.restore(m)
    assert growth < 64 * 1024, growth


# --------------------------------------------------------------------------- cycles


def self_cycles() -> dict[str, Callable[[nn.Module], None]]:
    """Ways for a module to reach itself again."""

    def plain_attr(m: nn.Module) -> None:
        m.__dict__["me"] = m  # a plain attribute, bypassing registration

    def config_dict(m: nn.Module) -> None:
        m.cfg = {"owner": m}

    def own_submodule(m: nn.Module) -> None:
        m.add_module("me", m)

    def hook_closure(m: nn.Module) -> None:
        m.register_forward_hook(lambda mod, a, o: m and None)

    def bound_method(m: nn.Module) -> None:
        m.fn = m.forward

    def via_parameter(m: nn.Module) -> None:
        m.w.owner = m

    def parent_in_list(m: nn.Module) -> None:
        m.child = type(m)()
        m.child.parents = [m]

    def open_walk(m: nn.Module) -> None:
        it = m.named_parameters()
        next(it)
        m.walk = it  # a suspended walk that holds the module

    return {
        f.__name__: f
        for f in (
            plain_attr,
            config_dict,
            own_submodule,
            hook_closure,
            bound_method,
            via_parameter,
            parent_in_list,
            open_walk,
        )
    }


@pytest.mark.parametrize("how", list(self_cycles()))
@pytest.mark.parametrize("kind", KINDS)
def test_cycles_are_collected(kind: str, how: str) -> None:
    def make() -> nn.Module:
        base = FAST if kind == "fast" else STOCK

        class Cyc(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.w = nn.Parameter(torch.zeros(1))

            def forward(self, x: Any) -> Any:
                return x

        return Cyc()

    m = make()
    self_cycles()[how](m)
    with contextlib.ExitStack() as stack:
        if kind == "accelerated":
            stack.enter_context(fastmodule.accelerated(m))
        for _ in range(3):
            m(torch.zeros(1))
            list(m.named_parameters())
            outcome(m.state_dict)  # a module that contains itself recurses without end
        ref, wref = weakref.ref(m), weakref.ref(m.w)
        cls_ref = weakref.ref(type(m))
    del m
    gc.collect()
    assert ref() is None and wref() is None
    if kind == "fast":  # restored classes: test_restored_class_is_released
        gc.collect()
        assert cls_ref() is None


def test_restored_class_is_released() -> None:
    """After ``accelerate`` and ``restore``, nothing of fastmodule's keeps a class alive."""

    def make() -> nn.Module:
        class Temp(nn.Module):
            def forward(self, x: Any) -> Any:
                return x

        return Temp()

    m = make()
    with fastmodule.accelerated(m):
        m(1)
    cls_ref = weakref.ref(type(m))
    del m
    gc.collect()
    assert cls_ref() is None


def test_self_containing_tree_errors_match_stock() -> None:
    """A module registered as its own child: the same outcome of every tree walk."""

    def observe(base: type[nn.Module]) -> list[Any]:
        class Loop(base):  # type: ignore[misc, valid-type]
            def forward(self, x: Any) -> Any:
                return x

        m = Loop()
        m.add_module("me", m)
        return [
            outcome(lambda: [n for n, _ in m.named_modules()]),
            outcome(lambda: [n for n, _ in m.named_parameters()]),
            outcome(lambda: m(1)),
            outcome(lambda: list(m.state_dict())),
            outcome(lambda: m.load_state_dict({})),
            outcome(lambda: m.train() and None),
            outcome(lambda: m.float() and None),
            outcome(lambda: m.zero_grad()),
        ]

    assert observe(FAST) == observe(STOCK)


# ----------------------------------------------------------------------------- fuzz

NAMES = [
    "w",
    "b",
    "c",
    "g",
    "lin",
    "training",
    "forward",
    "children",
    "state_dict",
    "_parameters",
    "_buffers",
    "_modules",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_non_persistent_buffers_set",
    "_state_dict_hooks",
    "__dict__",
    "__class__",
    "__call__",
    "__getattr__",
    "__setattr__",
    "__init__",
    "__doc__",
    "__weakref__",
    "dump_patches",
    "",
    "a.b",
    "0",
    " ",
]
OPS = [  # calls and hooks weighted up, so hooks meet calls often
    "call",
    "call",
    "call",
    "hook",
    "hook",
    "set",
    "del",
    "get",
    "register_parameter",
    "register_buffer",
    "add_module",
    "hook",
    "unhook",
    "call",
    "named_parameters",
    "state_dict",
    "load_state_dict",
    "train",
]
HOOK_KINDS = ["forward", "pre", "forward_kwargs", "pre_kwargs", "always", "prepend_pre"]
N_VALUES = 15

names = st.integers(min_value=0, max_value=3).flatmap(
    lambda i: st.text(max_size=5) if i == 0 else st.sampled_from(NAMES)
)
steps = st.lists(
    st.tuples(
        st.sampled_from(OPS),
        st.integers(min_value=0, max_value=2),  # which module of the tree
        names,
        st.integers(min_value=0, max_value=N_VALUES - 1),
    ),
    max_size=25,
)


def make_values() -> list[Any]:
    """Fresh, identically seeded values for one run (runs never share objects)."""
    torch.manual_seed(0)
    return [
        None,
        0,
        7,
        "text",
        torch.zeros(1),
        torch.ones(2),
        nn.Parameter(torch.ones(1)),
        nn.Parameter(torch.zeros(1), requires_grad=False),
        nn.Identity(),
        nn.Linear(1, 1),
        [nn.Identity()],
        [torch.zeros(1)],
        nn.Sequential(nn.Identity()),
        {},  # as ``_parameters``/``__dict__`` it replaces a registry or the whole dict
        nn.Buffer(torch.ones(1), persistent=False),
    ]


def describe(v: Any, values: list[Any], depth: int = 0) -> Any:
    """A run-independent description: position among the run's values, else by content."""
    for i, known in enumerate(values):
        if v is known:
            return ("value", i)
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, v.dtype, tuple(v.shape), v.detach().tolist(), v.requires_grad)
    if isinstance(v, nn.Module):
        return ("module", type(v).__name__)
    if isinstance(v, list | tuple) and depth < 3:
        return (type(v).__name__, [describe(e, values, depth + 1) for e in v])
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return ("other", type(v).__name__)


def snapshot(m: nn.Module, values: list[Any]) -> Any:
    """Registries and plain attributes of one module, described run-independently."""
    d = m.__dict__

    def reg(key: str) -> Any:
        r = d.get(key)
        if not isinstance(r, dict):
            return describe(r, values)
        return [(k, describe(v, values)) for k, v in r.items()]

    return {
        "params": reg("_parameters"),
        "buffers": reg("_buffers"),
        "modules": reg("_modules"),
        "non_persistent": sorted(map(str, d.get("_non_persistent_buffers_set") or ())),
        "hooks": [
            len(d[k]) if isinstance(d.get(k), dict) else describe(d.get(k), values)
            for k in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_always_called")
        ],
        "plain": sorted((k, describe(v, values)) for k, v in d.items() if not k.startswith("_")),
    }


def make_hook(kind: str, tag: int, log: list[Any]) -> tuple[str, Callable[..., Any]]:
    """A hook of ``kind`` that logs its firing and, by ``tag``, returns, edits or raises."""

    def act(module: nn.Module, value: Any) -> Any:
        log.append((kind, tag, type(module).__name__))
        if tag % 4 == 1 and isinstance(value, torch.Tensor):
            return value + tag
        if tag % 4 == 3:
            raise ValueError(f"hook {tag} refuses")
        return None

    if kind in ("forward", "always"):
        return kind, lambda m, args, out: act(m, out)
    if kind == "forward_kwargs":
        return kind, lambda m, args, kwargs, out: act(m, out)
    if kind == "pre_kwargs":

        def pre_kwargs(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            r = act(m, args[0] if args else None)
            return None if r is None else ((r,), kwargs)

        return kind, pre_kwargs

    def pre(m: nn.Module, args: tuple[Any, ...]) -> Any:
        r = act(m, args[0] if args else None)
        return None if r is None else (r,)

    return kind, pre


def register(m: nn.Module, kind: str, hook: Callable[..., Any]) -> Any:
    """Register ``hook`` on ``m`` the way ``kind`` says."""
    if kind == "forward":
        return m.register_forward_hook(hook)
    if kind == "always":
        return m.register_forward_hook(hook, always_call=True, prepend=True)
    if kind == "forward_kwargs":
        return m.register_forward_hook(hook, with_kwargs=True)
    if kind == "pre_kwargs":
        return m.register_forward_pre_hook(hook, with_kwargs=True)
    if kind == "prepend_pre":
        return m.register_forward_pre_hook(hook, prepend=True)
    return m.register_forward_pre_hook(hook)


def make_fuzz_classes(base: type[nn.Module]) -> type[nn.Module]:
    """A node class that calls its children in order."""

    class Node(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        def forward(self, x: Any) -> Any:
            for child in self.children():
                x = child(x)
            return x

    return Node


def run_script(base: type[nn.Module], script: list[Any], accelerate: bool = False) -> list[Any]:
    """Apply ``script`` to a fresh root/child/grandchild tree on ``base``; the log."""
    node = make_fuzz_classes(base)
    values = make_values()
    root = node()
    root.c = node()
    root.c.g = node()
    root.c.register_buffer("buf", torch.zeros(1))
    targets = [root, root.c, root.c.g]
    hooks: list[Any] = []
    hook_log: list[Any] = []
    log: list[Any] = []
    with contextlib.ExitStack() as stack:
        if accelerate:
            modules = [root, *(v for v in values if isinstance(v, nn.Module))]
            stack.enter_context(fastmodule.accelerated(nn.ModuleList(modules)))
        for op, which, name, vi in script:
            m, v = targets[which], values[vi]
            hook_log.clear()
            if op == "set":
                r = outcome(lambda: setattr(m, name, v))
            elif op == "del":
                r = outcome(lambda: delattr(m, name))
            elif op == "get":
                r = outcome(lambda: describe(getattr(m, name), values))
            elif op == "register_buffer":
                r = outcome(lambda: m.register_buffer(name, v, persistent=vi % 2 == 0))
            elif op in ("register_parameter", "add_module"):
                r = outcome(lambda: getattr(m, op)(name, v))
            elif op == "hook":
                kind, fn = make_hook(HOOK_KINDS[vi % len(HOOK_KINDS)], vi, hook_log)
                r = outcome(lambda: hooks.append(register(m, kind, fn)))
            elif op == "unhook":
                r = outcome(lambda: hooks.pop(vi % len(hooks)).remove() if hooks else None)
            elif op == "call":
                r = outcome(lambda: describe(m(torch.full((1,), float(vi))), values))
            elif op == "named_parameters":
                r = outcome(
                    lambda: [
                        [(n, describe(p, values)) for n, p in m.named_parameters()],
                        [(n, describe(b, values)) for n, b in m.named_buffers()],
                        [n for n, _ in m.named_modules()],
                    ]
                )
            elif op == "state_dict":
                r = outcome(lambda: [(k, describe(t, values)) for k, t in m.state_dict().items()])
            elif op == "load_state_dict":
                r = outcome(lambda: tuple(m.load_state_dict(m.state_dict(), strict=vi % 2 == 0)))
            else:
                r = outcome(lambda: describe(m.train(vi % 2 == 0), values))
            try:
                snap = [snapshot(t, values) for t in targets]
            except Exception as e:  # noqa: BLE001 - a broken registry is itself an outcome
                snap = (type(e), str(e))
            log.append((op, which, name, vi, r, list(hook_log), snap))
    return log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_fuzz_trees_with_hooks_match_stock(script: list[Any]) -> None:
    stock = run_script(STOCK, script)
    assert run_script(FAST, script) == stock
    assert run_script(STOCK, script, accelerate=True) == stock
