"""``_apply`` and what is built on it: ``.to()``, ``.float()``, ``.double()``, ``.half()``,
``.bfloat16()``, ``.cpu()``, ``.type()``, ``.to_empty()``.

Every scenario builds the same tree (same seed) once on stock ``torch.nn.Module`` and
once on ``fastmodule.Module``, runs the same conversion and describes the result by name
paths (never by ``id()`` across trees): every registry entry's type, dtype, device,
layout, shape, strides and values; which pre-conversion object it is (the one registered
there before, another one, or a new one); whether its storage moved; the same for its
``.grad``; and the exceptions, warnings and ``fn`` calls seen on the way.
"""

from __future__ import annotations

import functools
import os
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parametrize, prune

from tests.conftest import BASES, LogFunctions, LogOps, outcome
from tests.isolation import at_fixed_depth

Base = type[nn.Module]
Path = tuple[str, ...]

# torch warns once per process that quantized tensor creation is deprecated and that a
# complex-to-real cast discards the imaginary part: trigger both here, so that the stock
# run and the fast run of a scenario see the same warnings.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.quantize_per_tensor(torch.zeros(1), 0.1, 0, torch.qint8)
    torch.zeros(1, dtype=torch.complex64).to(torch.float32)


# --------------------------------------------------------------------------- helpers


def entries(root: nn.Module) -> list[tuple[str, Path, Any]]:
    """Every registry entry, duplicates and None entries included, read straight from
    ``_modules``/``_parameters``/``_buffers`` (depth first, registry order)."""
    out: list[tuple[str, Path, Any]] = []
    stack: list[tuple[nn.Module, Path]] = [(root, ())]
    while stack:
        m, p = stack.pop()
        out.append(("module", p, m))
        d = m.__dict__
        for kind, registry in (("param", "_parameters"), ("buffer", "_buffers")):
            for k, v in d[registry].items():
                out.append((kind, (*p, k), v))
        children = [(c, (*p, k)) for k, c in d["_modules"].items() if c is not None]
        stack.extend(reversed(children))
    return out


def ptr(t: torch.Tensor) -> Any:
    try:
        return t.data_ptr() if t.layout == torch.strided else None
    except Exception:  # noqa: BLE001 - some tensors have no storage to point at
        return None


class Index:
    """Labels (first registry path) of modules, parameters, buffers and grads, with each
    tensor's storage pointer. Holds the labelled objects and their storages alive, so
    ids stay unique and a pointer is never reused by another tensor."""

    def __init__(self, root: nn.Module) -> None:
        self.paths: dict[int, tuple[Any, ...]] = {}
        self.ptrs: dict[int, Any] = {}
        self.keep: list[Any] = []
        for kind, path, v in entries(root):
            if v is None:
                continue
            self.add(v, (kind, path))
            if kind == "param" and v.grad is not None:
                self.add(v.grad, ("grad", path))

    def add(self, obj: Any, label: tuple[Any, ...]) -> None:
        if id(obj) in self.paths:
            return
        self.paths[id(obj)] = label
        self.keep.append(obj)
        if isinstance(obj, torch.Tensor):
            self.ptrs[id(obj)] = ptr(obj)
            self.keep.append(obj.detach())

    def label(self, obj: Any) -> Any:
        if obj is None:
            return None
        return self.paths.get(id(obj), ("new", type(obj).__name__))

    def same_ptr(self, t: torch.Tensor) -> Any:
        """For a labelled tensor: does it still point at the same storage?"""
        if id(t) not in self.ptrs:
            return None
        return ptr(t) == self.ptrs[id(t)]


class Same:
    """A tensor value that compares with ``torch.equal`` (dtype and shape included; NaNs
    at the same places are equal; sparse tensors by their dense value)."""

    def __init__(self, t: torch.Tensor) -> None:
        t = t.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        self.t = t.dequantize() if t.is_quantized else t

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Same):
            return False
        a, b = self.t, other.t
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            nan = a.isnan()
            return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
        return torch.equal(a, b)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Same({self.t!r})"


def tinfo(t: Any, values: bool = True) -> Any:
    """What a tensor is: type, dtype, device, layout, shape, strides, flags, values."""
    if not isinstance(t, torch.Tensor):
        return ("value", type(t).__name__, repr(t))
    info: list[Any] = [
        type(t).__name__,
        t.dtype,
        t.device.type,
        t.layout,
        tuple(t.shape),
        t.requires_grad,
        t.is_leaf,
    ]
    if t.layout == torch.strided:
        info.append(t.stride())
        info.append(t.is_contiguous())
        if t.dim() == 4:
            info.append(t.is_contiguous(memory_format=torch.channels_last))
        if t.dim() == 5:
            info.append(t.is_contiguous(memory_format=torch.channels_last_3d))
    if values and t.device.type != "meta":
        info.append(Same(t))
    return tuple(info)


def entry(v: Any, before: Index, now: Index, values: bool) -> Any:
    return {
        "was": before.label(v),
        "now": now.label(v),
        "same_ptr": before.same_ptr(v),
        "t": tinfo(v, values),
    }


def describe(root: nn.Module, before: Index, values: bool = True) -> list[Any]:
    """Every registry entry of ``root`` by path: which pre-conversion object it is
    (``before``), its first path now (ties), its storage and its tensor, and the same
    for a parameter's grad."""
    now = Index(root)
    out: list[Any] = []
    for kind, path, v in entries(root):
        if kind == "module":
            out.append((kind, path, type(v).__name__))
        elif v is None:
            out.append((kind, path, None))
        elif not isinstance(v, torch.Tensor):
            out.append((kind, path, tinfo(v)))
        else:
            item = entry(v, before, now, values)
            if kind == "param":
                g = v.grad
                item["grad"] = None if g is None else entry(g, before, now, values)
            out.append((kind, path, item))
    return out


def sd_summary(root: nn.Module, values: bool = True) -> Any:
    return outcome(lambda: [(k, tinfo(v, values)) for k, v in root.state_dict().items()])


def caught(fn: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """``outcome(fn)`` and the warnings it emitted (category, text, file, line)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r = outcome(fn)
    return r, [(x.category, str(x.message), os.path.basename(x.filename), x.lineno) for x in w]


def both(scenario: Callable[[Base], Any]) -> tuple[Any, Any]:
    """``outcome(scenario(base))`` for stock and for fast, each from seed 0."""
    results = []
    for b in BASES:
        torch.manual_seed(0)
        results.append(outcome(lambda b=b: scenario(b)))
    return results[0], results[1]


def assert_same(scenario: Callable[[Base], Any]) -> Any:
    stock, fast = both(scenario)
    assert stock[0] == "ok", stock
    assert fast == stock
    return stock[1]


# --------------------------------------------------------------------------- classes


class StockChild(nn.Module):
    """A stock-torch user class (in the fast tree too)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))
        self.register_buffer("steps", torch.tensor(4))


class MyT(torch.Tensor):
    """A plain tensor subclass (no ``__torch_function__`` of its own)."""


@functools.cache
def classes(base: Base) -> SimpleNamespace:
    """Custom module classes on ``base`` (one set per base)."""

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self, n: int = 3, f64: bool = True) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(n))
            self.v = nn.Parameter(torch.randn(2, n))
            self.register_parameter("none_p", None)
            self.register_buffer("f32", torch.randn(n))
            if f64:
                self.register_buffer("f64", torch.randn(n, dtype=torch.float64))
            self.register_buffer("i64", torch.arange(n))
            self.register_buffer("flag", torch.tensor([True, False]))
            self.register_buffer("tmp", torch.randn(n), persistent=False)
            self.register_buffer("none_b", None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w + self.f32

    class Node(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    class Logged(Leaf):
        """Overrides ``_apply`` with side effects around ``super()._apply``."""

        def __init__(self, log: list[Any], name: str, f64: bool = True) -> None:
            super().__init__(2, f64)
            self.log = log
            self.name = name

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            self.log.append(("enter", self.name, recurse, self.w.dtype))
            r = super()._apply(fn, recurse)
            self.log.append(("exit", self.name, self.w.dtype, r is self))
            return r

    class Scale(base):  # type: ignore[misc, valid-type]
        """A parametrization on the base class, with a buffer of its own."""

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("s", torch.tensor(2.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.s

    class HidesChild(Node):
        """``children()`` overridden: torch's ``_apply`` walks what it yields."""

        def children(self) -> Iterator[nn.Module]:
            return (c for k, c in self._modules.items() if k != "hidden")

    return SimpleNamespace(Leaf=Leaf, Node=Node, Logged=Logged, Scale=Scale, HidesChild=HidesChild)


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


# --------------------------------------------------------------------------- trees


def big_tree(base: Base, log: list[Any] | None = None, vol: bool = False) -> nn.Module:
    """Base-class and stock user classes, torch leaves (Linear, LayerNorm, BatchNorm1d,
    Embedding, Conv2d, GRU, LSTM), float16/32/64, int, bool and complex tensors, None
    entries, non-persistent buffers, tied parameters (within and across classes), a
    shared buffer, a submodule registered twice and an ``_apply`` override."""
    c = classes(base)
    root = c.Node()
    root.leaf = c.Leaf()
    root.lin = nn.Linear(3, 4)
    root.ln = nn.LayerNorm(4)
    root.bn = nn.BatchNorm1d(4)
    root.emb = nn.Embedding(5, 3)
    root.head = nn.Linear(3, 5, bias=False)
    root.head.weight = root.emb.weight  # tied across stock modules
    root.conv = nn.Conv2d(2, 3, 2)
    root.gru = nn.GRU(3, 4, batch_first=True)
    root.lstm = nn.LSTM(3, 4, num_layers=2)
    root.stock = StockChild()
    root.stock.fast = c.Leaf(2)  # a base-class module under a stock one
    root.seq = nn.Sequential(c.Leaf(2, f64=False), root.leaf)  # root.leaf twice
    root.inner = c.Node()
    root.inner.register_parameter("tied", root.lin.weight)
    root.inner.register_buffer("shared", root.leaf.f32)
    root.inner.register_parameter("none_p", None)
    root.inner.logged = c.Logged(log if log is not None else [], "inner.logged")
    root.inner.logged.kid = c.Leaf(2)
    root.register_module("gone", None)
    root.q = nn.Parameter(torch.randn(2, dtype=torch.float64))
    root.h = nn.Parameter(torch.randn(2).half())
    root.ip = nn.Parameter(torch.arange(3), requires_grad=False)
    root.register_buffer("c64", torch.randn(2, dtype=torch.complex64))
    root.register_buffer("img", torch.randn(2, 3, 4, 5))
    if vol:  # 5-D: channels_last_3d applies, channels_last raises
        root.register_buffer("vol", torch.randn(1, 2, 3, 2, 2))
    return root


def with_vol(base: Base) -> nn.Module:
    return big_tree(base, vol=True)


def pure_tree(base: Base) -> nn.Module:
    """Only float32, int64 and bool tensors: a float32/CPU conversion changes nothing."""
    c = classes(base)
    root = c.Node()
    root.leaf = c.Leaf(f64=False)
    root.lin = nn.Linear(3, 4)
    root.bn = nn.BatchNorm1d(4)
    root.emb = nn.Embedding(5, 3)
    root.gru = nn.GRU(3, 4)
    root.stock = StockChild()
    root.stock.fast = c.Leaf(2, f64=False)
    root.seq = nn.Sequential(c.Leaf(2, f64=False), root.leaf)
    root.inner = c.Node()
    root.inner.register_parameter("tied", root.lin.weight)
    root.inner.register_buffer("shared", root.leaf.f32)
    root.inner.logged = c.Logged([], "logged", f64=False)
    root.register_buffer("img", torch.randn(1, 2, 2, 2))
    root.ip = nn.Parameter(torch.arange(3), requires_grad=False)
    return root


def unique_params(root: nn.Module) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for kind, _, v in entries(root):
        if kind == "param" and v is not None and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def add_grads(root: nn.Module) -> None:
    """A grad on every other floating parameter (first appearance order); the rest None."""
    floating = [p for p in unique_params(root) if p.requires_grad]
    for i, p in enumerate(floating):
        if i % 2 == 0:
            p.grad = torch.randn_like(p)


def forwards(root: nn.Module) -> dict[str, Any]:
    """Forward passes through the converted torch leaves (GRU/LSTM flat weights)."""
    dt = root.lin.weight.dtype
    x = torch.randn(2, 5, 3).to(dt)
    return {
        "gru": outcome(lambda: Same(root.gru(x)[0])),
        "lstm": outcome(lambda: Same(root.lstm(x.transpose(0, 1))[0])),
        "lin": outcome(lambda: Same(root.lin(x))),
        "bn": outcome(lambda: Same(root.bn(root.lin(x[:, 0])))),
        "leaf": outcome(lambda: Same(root.leaf(x))),
        "head": outcome(lambda: Same(root.head(root.emb(torch.tensor([[1, 4]]))))),
    }


def convert_and_describe(
    base: Base,
    op: Callable[[nn.Module], Any],
    *,
    tree: Callable[..., nn.Module] = big_tree,
    values: bool = True,
    grads: bool = True,
) -> dict[str, Any]:
    log: list[Any] = []
    root = tree(base, log) if tree is big_tree else tree(base)
    if grads:
        add_grads(root)
    before = Index(root)
    opt = outcome(lambda: torch.optim.SGD(root.parameters(), lr=0.5))
    r, warns = caught(lambda: before.label(op(root)))
    now = Index(root)
    return {
        "result": r,
        "warnings": warns,
        "tree": describe(root, before, values),
        "state_dict": sd_summary(root, values),
        "log": log,
        "optimizer": opt
        if opt[0] == "raised"
        else [(before.label(p), now.label(p)) for p in opt[1].param_groups[0]["params"]],
    }


# --------------------------------------------------------------------------- 1. casts

CASTS: dict[str, Callable[[nn.Module], Any]] = {
    "float": lambda m: m.float(),
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "bfloat16": lambda m: m.bfloat16(),
    "double().float()": lambda m: m.double().float(),
    "half().double()": lambda m: m.half().double(),
}


@pytest.mark.parametrize("cast", list(CASTS))
def test_casts_on_mixed_tree(cast: str) -> None:
    """Dtypes, values, identities of parameters/grads/buffers, ties, the ``_apply``
    override's calls, the optimizer's view, forward passes, and an optimizer step."""

    def sc(b: Base) -> Any:
        torch.manual_seed(0)
        log: list[Any] = []
        root = big_tree(b, log)
        add_grads(root)
        before = Index(root)
        opt = torch.optim.SGD(root.parameters(), lr=0.5)
        r, warns = caught(lambda: before.label(CASTS[cast](root)))
        now = Index(root)
        out = {
            "result": r,
            "warnings": warns,
            "tree": describe(root, before),
            "state_dict": sd_summary(root),
            "log": log,
            "optimizer": [(before.label(p), now.label(p)) for p in opt.param_groups[0]["params"]],
            "forward": forwards(root),
        }
        out["step"] = outcome(lambda: opt.step())
        out["after step"] = describe(root, before)
        return out

    out = assert_same(sc)
    assert out["result"] == ("ok", ("module", ()))
    assert out["log"], "the _apply override ran"


def test_casts_keep_parameter_and_grad_objects() -> None:
    """Sanity check of the scenario itself: on stock, ``.double()`` keeps every
    Parameter and grad object (``.data`` assignment) and converts ints not at all."""
    torch.manual_seed(0)
    root = big_tree(BASES[0])
    add_grads(root)
    before = Index(root)
    root.double()
    for kind, path, item in describe(root, before):
        if kind == "param" and item is not None:
            assert item["was"] == item["now"], path
            assert item["grad"] is None or item["grad"]["was"][0] == "grad", path
    assert root.bn.num_batches_tracked.dtype == torch.int64
    assert root.ip.dtype == torch.int64 and root.c64.dtype == torch.complex64


def test_cast_twice_repeats_conversion_on_shared_modules() -> None:
    """A module registered under two parents is converted twice (with a non-idempotent
    fn the effect shows), tied parameters too."""

    def sc(b: Base) -> Any:
        root = big_tree(b)
        before = Index(root)
        calls: list[Any] = []

        def fn(t: torch.Tensor) -> torch.Tensor:
            calls.append(before.label(t))
            return t * 2

        r = outcome(lambda: before.label(root._apply(fn)))
        return r, calls, describe(root, before)

    r, calls, _ = assert_same(sc)
    assert len(calls) > len(set(map(repr, calls)))


# --------------------------------------------------------------------------- 2. no-ops

NOOPS: dict[str, Callable[[nn.Module], Any]] = {
    "float()": lambda m: m.float(),
    "to('cpu')": lambda m: m.to("cpu"),
    "to(device('cpu'))": lambda m: m.to(torch.device("cpu")),
    "to(device='cpu')": lambda m: m.to(device="cpu"),
    "to(float32)": lambda m: m.to(torch.float32),
    "to(dtype=float32)": lambda m: m.to(dtype=torch.float32),
    "to('cpu', float32)": lambda m: m.to("cpu", torch.float32),
    "to(float32 tensor)": lambda m: m.to(torch.zeros(1)),
    "to(float32, non_blocking=True)": lambda m: m.to(torch.float32, non_blocking=True),
    "to()": lambda m: m.to(),
    "cpu()": lambda m: m.cpu(),
    "cpu().float().to('cpu')": lambda m: m.cpu().float().to("cpu"),
}


@pytest.mark.parametrize("op", list(NOOPS))
def test_noop_conversions_keep_everything(op: str) -> None:
    def sc(b: Base) -> Any:
        return convert_and_describe(b, NOOPS[op], tree=pure_tree)

    out = assert_same(sc)
    assert out["result"] == ("ok", ("module", ()))
    for kind, path, item in out["tree"]:
        if kind != "module" and item is not None:
            assert item["was"] == item["now"] and item["same_ptr"], (path, item)
            g = item.get("grad")
            assert g is None or (g["was"][0] == "grad" and g["same_ptr"]), (path, g)


@pytest.mark.parametrize(
    "op",
    ["double", "to(float64)", "half", "bfloat16"],
)
def test_second_conversion_is_a_noop(op: str) -> None:
    """Converting an already converted tree again (the first conversion untracked)."""
    ops = {
        "double": lambda m: m.double(),
        "to(float64)": lambda m: m.to(torch.float64),
        "half": lambda m: m.half(),
        "bfloat16": lambda m: m.bfloat16(),
    }

    def sc(b: Base) -> Any:
        root = big_tree(b)
        add_grads(root)
        ops[op](root)
        before = Index(root)
        r = outcome(lambda: before.label(ops[op](root)))
        return r, describe(root, before), sd_summary(root)

    assert_same(sc)


def test_noop_values_untouched_and_grad_of_other_dtype() -> None:
    """A grad left behind in another dtype (``param.data`` reassigned by hand): the
    parameter needs nothing, its grad does."""

    def sc(b: Base) -> Any:
        c = classes(b)
        root = c.Node()
        root.leaf = c.Leaf()
        root.leaf.w.grad = torch.randn(3)
        root.leaf.w.data = root.leaf.w.data.double()
        root.leaf.v.data = root.leaf.v.data.double()
        root.leaf.v.grad = torch.randn(2, 3, dtype=torch.float64)
        before = Index(root)
        r = outcome(lambda: before.label(root.double()))
        return r, describe(root, before)

    assert_same(sc)


# --------------------------------------------------------------------------- 3. to(...)

TO_CALLS: dict[str, Callable[[nn.Module], Any]] = {
    "to(float64)": lambda m: m.to(torch.float64),
    "to(dtype=float64)": lambda m: m.to(dtype=torch.float64),
    "to(float16)": lambda m: m.to(torch.float16),
    "to(bfloat16)": lambda m: m.to(torch.bfloat16),
    "to('cpu', float64)": lambda m: m.to("cpu", torch.float64),
    "to(device='cpu', dtype=float64)": lambda m: m.to(device="cpu", dtype=torch.float64),
    "to('cpu', dtype=float16)": lambda m: m.to("cpu", dtype=torch.float16),
    "to(float64 tensor)": lambda m: m.to(torch.zeros(1, dtype=torch.float64)),
    "to(int64 tensor)": lambda m: m.to(torch.zeros(1, dtype=torch.int64)),
    "to(float64, non_blocking=True)": lambda m: m.to(torch.float64, non_blocking=True),
    "to(float64, True)": lambda m: m.to(torch.float64, True),
    "to(memory_format=channels_last)": lambda m: m.to(memory_format=torch.channels_last),
    "to(float64, memory_format=channels_last)": lambda m: m.to(
        torch.float64, memory_format=torch.channels_last
    ),
    "to('cpu', memory_format=channels_last)": lambda m: m.to(
        "cpu", memory_format=torch.channels_last
    ),
    "to(memory_format=contiguous_format)": lambda m: m.to(memory_format=torch.contiguous_format),
    "to(complex64)": lambda m: m.to(torch.complex64),
    "to(complex128)": lambda m: m.to(torch.complex128),
    "to('cpu:0')": lambda m: m.to("cpu:0"),
    "to(device('cpu', 0))": lambda m: m.to(torch.device("cpu", 0)),
    "to('cpu:0', float32)": lambda m: m.to("cpu:0", torch.float32),
    "to('meta')": lambda m: m.to("meta"),
    "to('meta', float16)": lambda m: m.to("meta", torch.float16),
    "to('meta').to('cpu')": lambda m: m.to("meta").to("cpu"),
    "to(int64)": lambda m: m.to(torch.int64),
    "to(bool)": lambda m: m.to(torch.bool),
    "to('nonsense')": lambda m: m.to("nonsense"),
    "to(1, 2, 3, 4)": lambda m: m.to(1, 2, 3, 4),
    "to(copy=True)": lambda m: m.to(torch.float64, copy=True),
    "to(dtype='float64')": lambda m: m.to(dtype="float64"),
    "to('cuda:x')": lambda m: m.to("cuda:x"),
}


@pytest.mark.parametrize("call", list(TO_CALLS))
def test_to_signatures(call: str) -> None:
    def sc(b: Base) -> Any:
        return convert_and_describe(b, TO_CALLS[call])

    out = assert_same(sc)
    if call == "to(complex64)":
        assert any(w[0] is UserWarning for w in out["warnings"])
    if call in ("to(int64)", "to('nonsense')", "to(1, 2, 3, 4)", "to('meta').to('cpu')"):
        assert out["result"][0] == "raised"


def test_channels_last_layout_sanity() -> None:
    """Sanity check of the scenario itself: the 4-D tensors do change layout on stock."""
    root = big_tree(BASES[0])
    add_grads(root)
    root.to(memory_format=torch.channels_last)
    assert root.img.is_contiguous(memory_format=torch.channels_last)
    assert root.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert root.leaf.v.is_contiguous()


MEMORY_FORMATS: dict[str, Callable[[nn.Module], Any]] = {
    "channels_last": lambda m: m.to(memory_format=torch.channels_last),
    "float64, channels_last": lambda m: m.to(torch.float64, memory_format=torch.channels_last),
    "channels_last_3d": lambda m: m.to(memory_format=torch.channels_last_3d),
    "float16, channels_last_3d": lambda m: m.to(
        torch.float16, memory_format=torch.channels_last_3d
    ),
    "preserve_format": lambda m: m.to(memory_format=torch.preserve_format),
}


@pytest.mark.parametrize("call", list(MEMORY_FORMATS))
def test_memory_formats_with_5d_buffer(call: str) -> None:
    """A 5-D buffer next to the 4-D tensors: channels_last_3d converts it, channels_last
    raises on it (after converting what came before: the same partial state)."""

    def sc(b: Base) -> Any:
        return convert_and_describe(b, MEMORY_FORMATS[call], tree=with_vol)

    out = assert_same(sc)
    if call == "preserve_format":
        assert out["result"] == ("ok", ("module", ()))


# --------------------------------------------------------------------------- 4. type/to_empty

OTHER_CALLS: dict[str, Callable[[nn.Module], Any]] = {
    "type(float64)": lambda m: m.type(torch.float64),
    "type(float32)": lambda m: m.type(torch.float32),
    "type(DoubleTensor)": lambda m: m.type(torch.DoubleTensor),
    "type('torch.DoubleTensor')": lambda m: m.type("torch.DoubleTensor"),
    "type(HalfTensor)": lambda m: m.type(torch.HalfTensor),
    "type(int32)": lambda m: m.type(torch.int32),
    "type('nonsense')": lambda m: m.type("nonsense"),
    "to_empty(device='cpu')": lambda m: m.to_empty(device="cpu"),
    "to_empty(device=None)": lambda m: m.to_empty(device=None),
    "to_empty(device='meta')": lambda m: m.to_empty(device="meta"),
    "to_empty(device='cpu', recurse=False)": lambda m: m.to_empty(device="cpu", recurse=False),
    "to_empty(device='meta', recurse=False)": lambda m: m.to_empty(device="meta", recurse=False),
    "to('meta').to_empty(device='cpu')": lambda m: m.to("meta").to_empty(device="cpu"),
    "to_empty()": lambda m: m.to_empty(),
    "to_empty('cpu')": lambda m: m.to_empty("cpu"),
}

EMPTY = {k for k in OTHER_CALLS if "to_empty" in k}


@pytest.mark.parametrize("call", list(OTHER_CALLS))
def test_type_and_to_empty(call: str) -> None:
    def sc(b: Base) -> Any:
        return convert_and_describe(b, OTHER_CALLS[call], values=call not in EMPTY)

    out = assert_same(sc)
    if call in ("type(float64)", "type(DoubleTensor)", "to_empty(device='cpu')"):
        assert out["result"] == ("ok", ("module", ()))


# --------------------------------------------------------------------------- 5. custom fn


class Counter:
    """A call counter shared by the fns below (``n`` calls so far)."""

    def __init__(self) -> None:
        self.n = 0


def nth(k: int, then: Callable[[torch.Tensor], Any]) -> Callable[..., Any]:
    """An fn that returns ``then(t)`` at its k-th call and ``t.double()`` otherwise."""

    def make(ix: Index, root: nn.Module) -> Callable[[torch.Tensor], Any]:
        c = Counter()

        def fn(t: torch.Tensor) -> Any:
            c.n += 1
            if c.n == k:
                return then(t)
            return t.double() if t.is_floating_point() else t

        return fn

    return make


def raise_at(k: int) -> Callable[..., Any]:
    def make(ix: Index, root: nn.Module) -> Callable[[torch.Tensor], Any]:
        c = Counter()

        def fn(t: torch.Tensor) -> Any:
            c.n += 1
            if c.n == k:
                raise ValueError(f"stop at {c.n}: {ix.label(t)}")
            return t * 2

        return fn

    return make


def plain(f: Callable[[torch.Tensor], Any]) -> Callable[..., Any]:
    return lambda ix, root: f


def sparse_for_v(t: torch.Tensor) -> Any:
    if t.shape == (2, 3):
        return t.to_sparse()
    return t.double() if t.is_floating_point() else t


def sets_grad(ix: Index, root: nn.Module) -> Callable[[torch.Tensor], Any]:
    def fn(t: torch.Tensor) -> Any:
        if isinstance(t, nn.Parameter) and t.requires_grad and t.grad is None:
            t.grad = torch.ones_like(t)
        return t * 3

    return fn


def clears_grad(ix: Index, root: nn.Module) -> Callable[[torch.Tensor], Any]:
    def fn(t: torch.Tensor) -> Any:
        if isinstance(t, nn.Parameter):
            t.grad = None
        return t * 3

    return fn


def at_label(label: Any, action: Callable[[nn.Module], Any]) -> Callable[..., Any]:
    """An fn that runs ``action(root)`` when it is first called on the tensor labelled
    ``label`` (before the conversion) and returns ``t * 2``."""

    def make(ix: Index, root: nn.Module) -> Callable[[torch.Tensor], Any]:
        done: list[bool] = []

        def fn(t: torch.Tensor) -> Any:
            if not done and ix.label(t) == label:
                done.append(True)
                action(root)
            return t * 2

        return fn

    return make


def _replace_param(root: nn.Module) -> None:
    root.leaf._parameters["v"] = nn.Parameter(torch.full((2, 3), 5.0))


def _replace_buffer(root: nn.Module) -> None:
    root.leaf._buffers["i64"] = torch.full((3,), 7)


def _add_buffer(root: nn.Module) -> None:
    root.leaf.register_buffer("late", torch.ones(1))


def _add_param(root: nn.Module) -> None:
    root.leaf.late = nn.Parameter(torch.ones(1))


def _delete_child(root: nn.Module) -> None:
    del root.stock


def _add_child(root: nn.Module) -> None:
    root.late = nn.Linear(1, 1)


def _replace_child(root: nn.Module) -> None:
    root._modules["stock"] = nn.Linear(1, 1)


def _delete_buffer_dict(root: nn.Module) -> None:
    root.leaf.__dict__["_buffers"] = {"only": torch.zeros(1)}


FNS: dict[str, Callable[..., Any]] = {
    "times2": plain(lambda t: t * 2),
    "identity": plain(lambda t: t),
    "clone": plain(lambda t: t.clone()),
    "detach": plain(lambda t: t.detach()),
    "as MyT": plain(lambda t: t.as_subclass(MyT)),
    "MyT at call 1": nth(1, lambda t: t.as_subclass(MyT)),
    "MyT at call 2": nth(2, lambda t: t.as_subclass(MyT)),
    "MyT at call 5": nth(5, lambda t: t.as_subclass(MyT)),
    "MyT at call 12": nth(12, lambda t: t.double().as_subclass(MyT)),
    "sparse for (2, 3)": plain(sparse_for_v),
    "sparse at call 2": nth(2, lambda t: t.to_sparse()),
    "None": plain(lambda t: None),
    "None at call 3": nth(3, lambda t: None),
    "None for buffers": plain(lambda t: t if isinstance(t, nn.Parameter) else None),
    "int": plain(lambda t: 3),
    "ndarray": plain(lambda t: t.detach().numpy()),
    "Parameter": plain(lambda t: nn.Parameter(t.detach().double(), requires_grad=False)),
    "Parameter at call 4": nth(4, lambda t: nn.Parameter(t.detach() + 1)),
    "requires_grad": plain(lambda t: t.double().requires_grad_()),
    "reshape": plain(lambda t: t.reshape(-1)[:1].clone()),
    "meta": plain(lambda t: t.to("meta")),
    "meta at call 3": nth(3, lambda t: t.to("meta")),
    "quantized at call 1": nth(
        1, lambda t: torch.quantize_per_tensor(t.float(), 0.1, 0, torch.qint8)
    ),
    "grad-tracking result": plain(lambda t: t.double() * torch.ones(1, requires_grad=True)),
    "sets grad": sets_grad,
    "clears grad": clears_grad,
    "replaces param": at_label(("param", ("leaf", "w")), _replace_param),
    "replaces buffer": at_label(("param", ("leaf", "w")), _replace_buffer),
    "adds buffer": at_label(("buffer", ("leaf", "f32")), _add_buffer),
    "adds buffer early": at_label(("param", ("leaf", "w")), _add_buffer),
    "adds param": at_label(("param", ("leaf", "w")), _add_param),
    "replaces buffer dict": at_label(("param", ("leaf", "v")), _delete_buffer_dict),
    "deletes child": at_label(("param", ("leaf", "w")), _delete_child),
    "adds child": at_label(("param", ("leaf", "w")), _add_child),
    "replaces child": at_label(("param", ("leaf", "w")), _replace_child),
    **{f"raises at call {k}": raise_at(k) for k in (1, 2, 3, 6, 11, 25, 50, 75)},
}

APPLY_CALLS: dict[str, Callable[[nn.Module, Any], Any]] = {
    "_apply(fn)": lambda m, fn: m._apply(fn),
    "_apply(fn, False)": lambda m, fn: m._apply(fn, False),
    "_apply(fn=fn, recurse=0)": lambda m, fn: m._apply(fn=fn, recurse=0),
}


@pytest.mark.parametrize("call", list(APPLY_CALLS))
@pytest.mark.parametrize("name", list(FNS))
def test_custom_fn(name: str, call: str) -> None:
    """Every call of ``fn`` (tensor, type, dtype, shape, grad mode), the exception, and
    the tree it leaves behind (also when it stops halfway)."""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        root = big_tree(b, log)
        add_grads(root)
        before = Index(root)
        inner = FNS[name](before, root)
        calls: list[Any] = []

        def fn(t: Any) -> Any:
            calls.append(
                (
                    before.label(t),
                    type(t).__name__,
                    t.dtype,
                    tuple(t.shape),
                    torch.is_grad_enabled(),
                )
            )
            return inner(t)

        r, warns = caught(lambda: before.label(APPLY_CALLS[call](root, fn)))
        return {
            "result": r,
            "warnings": warns,
            "calls": calls,
            "log": log,
            "tree": describe(root, before),
            "grad mode": torch.is_grad_enabled(),
        }

    out = assert_same(sc)
    assert out["calls"]
    assert out["grad mode"]


def test_custom_fn_scenarios_cover_the_hand_over() -> None:
    """Sanity check of the scenarios: on stock, the sparse fn replaces a Parameter by a
    new one, the subclass fn keeps the Parameter, the raising fn stops halfway."""
    torch.manual_seed(0)
    root = big_tree(BASES[0])
    add_grads(root)
    before = Index(root)
    root._apply(sparse_for_v)
    assert before.label(root.leaf.v) == ("new", "Parameter")
    assert root.leaf.v.layout == torch.sparse_coo
    root = big_tree(BASES[0])
    before = Index(root)
    root._apply(lambda t: t.as_subclass(MyT))
    assert before.label(root.leaf.w) == ("param", ("leaf", "w"))
    assert type(root.leaf.f32) is MyT
    root = big_tree(BASES[0])
    calls = Counter()

    def count(t: torch.Tensor) -> torch.Tensor:
        calls.n += 1
        return t

    root._apply(count)
    assert calls.n > 70


def test_apply_argument_errors() -> None:
    def sc(b: Base) -> Any:
        root = big_tree(b)
        before = Index(root)
        return {
            "no fn": outcome(lambda: root._apply()),
            "too many": outcome(lambda: root._apply(lambda t: t, True, 3)),
            "bad keyword": outcome(lambda: root._apply(lambda t: t, recurse_=True)),
            "fn not callable": outcome(lambda: root._apply(3)),
            "tree": describe(root, before),
        }

    assert_same(sc)


def test_apply_returns_self_and_ignores_child_results() -> None:
    def sc(b: Base) -> Any:
        c = classes(b)

        class ReturnsOther(c.Leaf):
            def _apply(self, fn: Any, recurse: bool = True) -> Any:
                super()._apply(fn, recurse)
                return "something else"

        root = c.Node()
        root.kid = ReturnsOther()
        root.kid.deeper = ReturnsOther()
        before = Index(root)
        return (
            before.label(root.double()),
            before.label(root.kid.double()),
            describe(root, before),
        )

    assert_same(sc)


# --------------------------------------------------------------------------- 6. future flags

FLAGS = {
    "overwrite": (True, False),
    "swap": (False, True),
    "both": (True, True),
}

FLAG_OPS: dict[str, Callable[[nn.Module], Any]] = {
    "double": lambda m: m.double(),
    "float": lambda m: m.float(),
    "half": lambda m: m.half(),
    "to('cpu')": lambda m: m.to("cpu"),
    "times2": lambda m: m._apply(lambda t: t * 2),
    "as MyT": lambda m: m._apply(lambda t: t.as_subclass(MyT)),
    "to_empty": lambda m: m.to_empty(device="cpu"),
}


@pytest.fixture
def restore_future_flags() -> Iterator[None]:
    old = (
        torch.__future__.get_overwrite_module_params_on_conversion(),
        torch.__future__.get_swap_module_params_on_conversion(),
    )
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(old[0])
        torch.__future__.set_swap_module_params_on_conversion(old[1])


@pytest.mark.usefixtures("restore_future_flags")
@pytest.mark.parametrize("op", list(FLAG_OPS))
@pytest.mark.parametrize("flags", list(FLAGS))
def test_future_flags(flags: str, op: str) -> None:
    overwrite, swap = FLAGS[flags]

    def sc(b: Base) -> Any:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        torch.__future__.set_swap_module_params_on_conversion(swap)
        try:
            return convert_and_describe(b, FLAG_OPS[op], values=op != "to_empty")
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
            torch.__future__.set_swap_module_params_on_conversion(False)

    assert_same(sc)


@pytest.mark.usefixtures("restore_future_flags")
def test_future_flag_set_by_fn_midway() -> None:
    """``fn`` flips the overwrite flag during the walk: later tensors see the new value
    (stock reads it for each tensor, after ``fn``)."""

    def sc(b: Base) -> Any:
        root = big_tree(b)
        add_grads(root)
        before = Index(root)

        def fn(t: torch.Tensor) -> Any:
            if before.label(t) == ("param", ("leaf", "v")):
                torch.__future__.set_overwrite_module_params_on_conversion(True)
            return t * 2

        try:
            r = outcome(lambda: before.label(root._apply(fn)))
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
        return r, describe(root, before)

    assert_same(sc)


@pytest.mark.parametrize("op", ["double", "float", "times2"])
def test_patched_future_getters_are_called_like_stock(op: str) -> None:
    """torch's ``_apply`` calls ``torch.__future__.get_swap_module_params_on_conversion``
    once per module and ``get_overwrite_module_params_on_conversion`` once per tensor
    whose result has a compatible type: replaced getters see the same calls."""
    ops: dict[str, Callable[[nn.Module], Any]] = {
        "double": lambda m: m.double(),
        "float": lambda m: m.float(),
        "times2": lambda m: m._apply(lambda t: t * 2),
    }
    fut = torch.__future__

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        add_grads(root)
        before = Index(root)
        log: list[str] = []
        saved = (
            fut.get_overwrite_module_params_on_conversion,
            fut.get_swap_module_params_on_conversion,
        )
        fut.get_overwrite_module_params_on_conversion = lambda: log.append("overwrite") or False
        fut.get_swap_module_params_on_conversion = lambda: log.append("swap") or False
        try:
            r = outcome(lambda: before.label(ops[op](root)))
        finally:
            (
                fut.get_overwrite_module_params_on_conversion,
                fut.get_swap_module_params_on_conversion,
            ) = saved
        return r, log, describe(root, before)

    out = assert_same(sc)
    assert "swap" in out[1]


# Where `fn` changes a flag: the tensor whose conversion changes it, and the change.
FLIPS: dict[str, tuple[tuple[Any, ...], str, bool]] = {
    # The first parameter of a module (it has a grad): its own result, its grad's and
    # every later tensor of the module read the overwrite flag set.
    "overwrite at a first param": (("param", ("leaf", "w")), "overwrite", True),
    # A parameter's grad: set into it before, replaced after.
    "overwrite at a grad": (("grad", ("leaf", "w")), "overwrite", True),
    "overwrite at a last param": (("param", ("lin", "bias")), "overwrite", True),
    "overwrite at a buffer": (("buffer", ("leaf", "f32")), "overwrite", True),
    "overwrite off again": (("param", ("leaf", "v")), "overwrite", False),
    # Read once per module, before its parameters: from the next module on.
    "swap at a param": (("param", ("leaf", "w")), "swap", True),
    "swap off again": (("param", ("lin", "weight")), "swap", False),
}


@pytest.mark.usefixtures("restore_future_flags")
@pytest.mark.parametrize("op", ["times2", "double_fn"])
@pytest.mark.parametrize("flip", list(FLIPS))
def test_future_flag_changed_inside_fn(flip: str, op: str) -> None:
    """``fn`` changes a flag while converting one tensor (as another thread can while
    ``fn`` releases the GIL): torch reads the overwrite flag for each tensor after
    ``fn``, the swap flag once per module; the native walk reads them there too."""
    where, flag, value = FLIPS[flip]
    setter = getattr(torch.__future__, f"set_{flag}_module_params_on_conversion")
    convert = {"times2": lambda t: t * 2, "double_fn": lambda t: t.double()}[op]

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        add_grads(root)
        before = Index(root)
        seen: list[Any] = []
        setter(not value)

        def fn(t: torch.Tensor) -> Any:
            seen.append(before.label(t))
            if seen[-1] == where:
                setter(value)
            return convert(t) if t.is_floating_point() else t

        try:
            r = outcome(lambda: before.label(root._apply(fn)))
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
            torch.__future__.set_swap_module_params_on_conversion(False)
        return r, seen, describe(root, before)

    out = assert_same(sc)
    assert where in out[1]


@pytest.mark.usefixtures("restore_future_flags")
def test_overwrite_flag_set_between_modules_of_a_recognised_conversion() -> None:
    """``.double()`` (a closure the native walk recognises): a module's ``_apply``
    override sets the flag after its own conversion; every later module reads it set."""

    def sc(b: Base) -> Any:
        c = classes(b)

        class Flips(c.Leaf):  # type: ignore[misc, name-defined]
            def _apply(self, fn: Any, recurse: bool = True) -> Any:
                r = super()._apply(fn, recurse)
                torch.__future__.set_overwrite_module_params_on_conversion(True)
                return r

        root = c.Node()
        root.first = c.Leaf()
        root.flips = Flips()
        root.later = c.Leaf()
        root.lin = nn.Linear(2, 3)
        add_grads(root)
        before = Index(root)
        try:
            r = outcome(lambda: before.label(root.double()))
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
        return r, describe(root, before)

    assert_same(sc)


@pytest.mark.usefixtures("restore_future_flags")
def test_overwrite_flag_set_by_a_finalizer_inside_a_recognised_conversion() -> None:
    """``.double()``: code that runs between two of a module's tensors (a finalizer of
    the storage ``param.data = ...`` frees, here; another thread in general) sets the
    overwrite flag; the tensors converted after it are replaced by new parameters, as
    on stock. (Nothing may keep the old storages alive: no ``Index`` here.)"""

    def sc(b: Base) -> Any:
        c = classes(b)
        root = c.Node()
        root.m = c.Node()
        for i in range(6):
            root.m.register_parameter(f"p{i}", nn.Parameter(torch.randn(2)))
        root.lin = nn.Linear(2, 2)
        before = {k: list(m._parameters.items()) for k, m in root.named_modules()}
        fired: list[int] = []

        def flip() -> None:
            fired.append(1)
            torch.__future__.set_overwrite_module_params_on_conversion(True)

        storage = root.m.p2.untyped_storage()
        weakref.finalize(storage, flip)
        del storage
        try:
            r = outcome(lambda: root.double() is root)
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(False)
        after = {
            k: [(n, v is dict(before[k])[n], v.dtype) for n, v in m._parameters.items()]
            for k, m in root.named_modules()
        }
        return r, len(fired), after

    out = assert_same(sc)
    assert out[1] == 1
    assert [same for _, same, _ in out[2]["m"]] == [True] * 3 + [False] * 3


@pytest.mark.usefixtures("restore_future_flags")
def test_overwrite_getter_patched_inside_fn_is_called_like_stock() -> None:
    """``fn`` replaces ``get_overwrite_module_params_on_conversion`` in the middle of a
    module: torch calls the new getter for each later compatible tensor (and, from the
    next module on, the swap getter is torch's again)."""
    fut = torch.__future__

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        add_grads(root)
        before = Index(root)
        log: list[Any] = []
        saved = fut.get_overwrite_module_params_on_conversion

        def getter() -> bool:
            log.append("overwrite")
            return len(log) % 3 == 0

        def fn(t: torch.Tensor) -> Any:
            log.append(before.label(t))
            if log[-1] == ("param", ("leaf", "v")):
                fut.get_overwrite_module_params_on_conversion = getter
            return t * 2

        try:
            r = outcome(lambda: before.label(root._apply(fn)))
        finally:
            fut.get_overwrite_module_params_on_conversion = saved
        return r, log, describe(root, before)

    out = assert_same(sc)
    assert "overwrite" in out[1]


@pytest.mark.parametrize("change", ["grad cleared", "grad replaced", "grad given"])
def test_grad_changed_inside_fn(change: str) -> None:
    """torch reads ``param.grad`` after ``fn(param)`` and ``out_param.grad`` after
    ``fn(param_grad)``: changes ``fn`` makes there are seen (an AssertionError for a
    grad cleared under its conversion)."""

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        add_grads(root)
        before = Index(root)
        w = root.leaf.w
        other = torch.zeros_like(w)

        def fn(t: torch.Tensor) -> Any:
            label = before.label(t)
            if change == "grad cleared" and label == ("grad", ("leaf", "w")):
                w.grad = None
            if change == "grad replaced" and label == ("grad", ("leaf", "w")):
                w.grad = other
            if change == "grad given" and label == ("param", ("leaf", "v")):
                root.leaf.v.grad = torch.ones_like(root.leaf.v)
            return t * 2

        r = outcome(lambda: before.label(root._apply(fn)))
        return r, describe(root, before), Same(other), w.grad is other

    assert_same(sc)


# --------------------------------------------------------------------------- 7. overrides


def test_apply_override_call_order() -> None:
    """``_apply`` overrides (calling ``super()._apply``) nested in both directions, the
    RNNs' own ``_apply``, and the order of everything ``fn`` sees."""

    def sc(b: Base) -> Any:
        c = classes(b)
        log: list[Any] = []
        root = c.Node()
        root.a = c.Logged(log, "a")
        root.a.b = c.Logged(log, "a.b")
        root.a.b.leaf = c.Leaf()
        root.a.stock = StockChild()
        root.a.stock.c = c.Logged(log, "a.stock.c")
        root.gru = nn.GRU(2, 2)
        root.again = root.a.b
        root.z = c.Logged(log, "z")
        before = Index(root)

        def fn(t: torch.Tensor) -> Any:
            log.append(("fn", before.label(t)))
            return t.double() if t.is_floating_point() else t

        r = outcome(lambda: before.label(root._apply(fn)))
        log.append("--- double")
        r2 = outcome(lambda: before.label(root.half()))
        return r, r2, log, describe(root, before)

    out = assert_same(sc)
    assert ("enter", "a.b", True, torch.float32) in out[2]


def test_dispatch_of_children_and_instance_apply() -> None:
    """An overridden ``children()`` hides a child from torch's walk; an instance
    attribute ``_apply`` shadows the method; a stock parent's children are its own."""

    def sc(b: Base) -> Any:
        c = classes(b)
        log: list[Any] = []
        root = c.Node()
        root.hider = c.HidesChild()
        root.hider.hidden = c.Leaf()
        root.hider.shown = c.Leaf()
        root.inst = c.Leaf()
        root.inst.kid = c.Leaf()
        root.inst._apply = lambda fn, recurse=True: log.append(("instance", recurse))
        before = Index(root)
        r = outcome(lambda: before.label(root.double()))
        return r, log, describe(root, before)

    assert_same(sc)


@pytest.mark.parametrize("op", ["double", "float", "to(float64)", "times2"])
def test_patched_torch_apply_runs(op: str) -> None:
    """A patched ``torch.nn.Module._apply`` runs, for the same modules, with the same
    arguments."""
    ops: dict[str, Callable[[nn.Module], Any]] = {
        "double": lambda m: m.double(),
        "float": lambda m: m.float(),
        "to(float64)": lambda m: m.to(torch.float64),
        "times2": lambda m: m._apply(lambda t: t * 2, True),
    }

    def sc(b: Base) -> Any:
        root = big_tree(b)
        add_grads(root)
        before = Index(root)
        log: list[Any] = []
        original = nn.Module.__dict__["_apply"]

        def patched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            log.append((before.label(self), len(args), sorted(kwargs)))
            return original(self, *args, **kwargs)

        nn.Module._apply = patched  # type: ignore[method-assign]
        try:
            r = outcome(lambda: before.label(ops[op](root)))
        finally:
            nn.Module._apply = original  # type: ignore[method-assign]
        return r, log, describe(root, before)

    out = assert_same(sc)
    assert out[1]
    assert nn.Module.__dict__["_apply"].__name__ == "_apply"


MODE_OPS: dict[str, Callable[[nn.Module], Any]] = {
    "float (no-op)": lambda m: m.float(),
    "to('cpu') (no-op)": lambda m: m.to("cpu"),
    "double": lambda m: m.double(),
    "times2": lambda m: m._apply(lambda t: t * 2),
}


@pytest.mark.parametrize("mode", ["function", "dispatch"])
@pytest.mark.parametrize("op", list(MODE_OPS))
def test_modes_see_the_same_calls(op: str, mode: str) -> None:
    """Under a torch-function or dispatch mode, every tensor operation of torch's
    ``_apply`` (and of torch's closures) is seen, in the same order."""

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        add_grads(root)
        before = Index(root)
        log: list[Any] = []
        with LogFunctions(log) if mode == "function" else LogOps(log):
            r = outcome(lambda: before.label(MODE_OPS[op](root)))
        return r, log, describe(root, before)

    assert_same(sc)


@pytest.mark.parametrize("meth", ["float", "to", "cpu", "double"])
def test_patched_tensor_method_is_called(meth: str) -> None:
    """torch's closures call ``Tensor.<meth>`` through Python: a patched method sees
    every call, also when the conversion changes nothing."""
    ops: dict[str, Callable[[nn.Module], Any]] = {
        "float": lambda m: m.float(),
        "to": lambda m: m.to(torch.float32),
        "cpu": lambda m: m.cpu(),
        "double": lambda m: m.double().double(),
    }

    def sc(b: Base) -> Any:
        root = pure_tree(b)
        before = Index(root)
        log: list[Any] = []
        original = getattr(torch.Tensor, meth)
        own = meth in torch.Tensor.__dict__

        def patched(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            log.append(before.label(self))
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, meth, patched)
        try:
            r = outcome(lambda: before.label(ops[meth](root)))
        finally:
            if own:
                setattr(torch.Tensor, meth, original)
            else:
                delattr(torch.Tensor, meth)
        return r, log, describe(root, before)

    out = assert_same(sc)
    assert out[1]


def test_parametrization_converted() -> None:
    def sc(b: Base) -> Any:
        c = classes(b)
        root = c.Node()
        root.sq = nn.Linear(3, 3)
        parametrize.register_parametrization(root.sq, "weight", Symmetric())
        root.leaf = c.Leaf()
        parametrize.register_parametrization(root.leaf, "v", c.Scale())
        parametrize.register_parametrization(root.leaf, "v", c.Scale())
        root.leaf.v.sum().backward()
        before = Index(root)
        r = outcome(lambda: before.label(root.double()))
        x = torch.randn(2, 3, dtype=torch.float64)
        return {
            "result": r,
            "tree": describe(root, before),
            "state_dict": sd_summary(root),
            "weight": Same(root.sq.weight),
            "v": Same(root.leaf.v),
            "forward": (outcome(lambda: Same(root.sq(x))), outcome(lambda: Same(root.leaf(x)))),
            "classes": [type(m).__name__ for m in root.modules()],
        }

    out = assert_same(sc)
    assert ("ok", ("module", ())) == out["result"]


def test_pruned_modules_converted() -> None:
    def sc(b: Base) -> Any:
        c = classes(b)
        root = c.Node()
        root.lin = nn.Linear(3, 4)
        prune.l1_unstructured(root.lin, "weight", amount=0.5)
        root.leaf = c.Leaf()
        prune.random_unstructured(root.leaf, "v", amount=0.3)
        before = Index(root)
        r = outcome(lambda: before.label(root.double()))
        x = torch.randn(2, 3, dtype=torch.float64)
        plain_attrs = (tinfo(root.lin.weight), tinfo(root.leaf.v))
        fwd = (outcome(lambda: Same(root.lin(x))), outcome(lambda: Same(root.leaf(x))))
        return {
            "result": r,
            "tree": describe(root, before),
            "state_dict": sd_summary(root),
            "plain attributes": plain_attrs,
            "forward": fwd,
            "after forward": (tinfo(root.lin.weight), tinfo(root.leaf.v)),
        }

    out = assert_same(sc)
    assert out["result"] == ("ok", ("module", ()))


def test_deep_tree_behaves_like_stock() -> None:
    """A chain deeper than the recursion limit: the same error, nothing converted. (Run
    at a fixed depth under a limit of 1000: torch.compile's inductor raises the process's
    limit to 2000, under which the 1500-deep chain converts.)"""

    def sc(b: Base) -> Any:
        c = classes(b)
        root = cur = c.Leaf(1)
        for _ in range(1500):
            cur.c = c.Leaf(1)
            cur = cur.c
        r = at_fixed_depth(lambda: outcome(lambda: root.double()), limit=1000)
        converted = sum(
            v.dtype == torch.float64
            for kind, _, v in entries(root)
            if kind == "param" and v is not None
        )
        # A returned module is described, not compared (its repr recurses 1500 deep).
        return (r[:2] if r[0] == "raised" else ("ok", r[1] is root)), converted

    assert assert_same(sc) == (("raised", RecursionError), 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "call",
    ["cuda()", "cuda(0)", "to('cuda')", "to('cuda:0')", "to('cuda', float16)", "cuda-cpu"],
)
def test_cuda_conversions(call: str) -> None:  # pragma: no cover - needs a GPU
    ops: dict[str, Callable[[nn.Module], Any]] = {
        "cuda()": lambda m: m.cuda(),
        "cuda(0)": lambda m: m.cuda(0),
        "to('cuda')": lambda m: m.to("cuda"),
        "to('cuda:0')": lambda m: m.to("cuda:0").to("cuda:0"),
        "to('cuda', float16)": lambda m: m.to("cuda", torch.float16),
        "cuda-cpu": lambda m: m.cuda().cpu(),
    }

    def sc(b: Base) -> Any:
        return convert_and_describe(b, ops[call])

    assert_same(sc)


# --------------------------------------------------------------------------- odd tensors


class MyParam(nn.Parameter):
    """A Parameter subclass."""


def odd_tree(base: Base, keys: bool = False) -> nn.Module:
    """Tensors off the common path, one per module, so each hand-over to torch starts
    at a different place: a Parameter subclass, a grad subclass, a grad that requires
    grad, a sparse Parameter, a plain tensor in ``_parameters``, a Parameter registered
    twice in one module, a quantized, a Parameter, a requires-grad and a subclass
    buffer, an OrderedDict registry, and (``keys``) non-string registry keys."""
    c = classes(base)
    root = c.Node()
    for name in ("sub", "gsub", "ggrad", "sparse", "raw", "twice", "bufs", "odict"):
        root.add_module(name, c.Leaf(f64=False))
    root.sub.register_parameter("mp", MyParam(torch.randn(3)))
    root.sub.mp.grad = torch.randn(3)
    root.gsub.w.grad = torch.randn(3).as_subclass(MyT)
    root.ggrad.w.grad = torch.randn(3, requires_grad=True)
    root.sparse.register_parameter("sp", nn.Parameter(torch.randn(2, 2).to_sparse()))
    root.raw._parameters["t"] = torch.randn(2)
    root.twice.register_parameter("w2", root.twice.w)
    root.twice.w.grad = torch.randn(3)
    root.bufs.register_buffer("q", torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.qint8))
    root.bufs.register_buffer("p", nn.Parameter(torch.randn(2)))
    root.bufs.register_buffer("rg", torch.randn(2, requires_grad=True))
    root.bufs.register_buffer("my", torch.randn(2).as_subclass(MyT))
    root.odict.__dict__["_parameters"] = OrderedDict(root.odict._parameters)
    root.odict.__dict__["_buffers"] = OrderedDict(root.odict._buffers)
    root.tail = c.Leaf(f64=False)
    if keys:
        root.key = c.Leaf(f64=False)
        root.key._buffers[3] = torch.randn(2)  # type: ignore[index]
        root.key._parameters[4] = nn.Parameter(torch.randn(2))  # type: ignore[index]
    return root


def odd_tree_with_keys(base: Base) -> nn.Module:
    return odd_tree(base, keys=True)


ODD_OPS: dict[str, Callable[[nn.Module], Any]] = {
    "float": lambda m: m.float(),
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "cpu": lambda m: m.cpu(),
    "to(float64)": lambda m: m.to(torch.float64),
    "to('cpu')": lambda m: m.to("cpu"),
    "to()": lambda m: m.to(),
    "times2": lambda m: m._apply(lambda t: t if t.is_quantized else t * 2),
    "clone": lambda m: m._apply(lambda t: t.clone()),
    "to_empty": lambda m: m.to_empty(device="cpu"),
}


@pytest.mark.parametrize("keys", [False, True], ids=["str_keys", "int_keys"])
@pytest.mark.parametrize("op", list(ODD_OPS))
def test_odd_tensors(op: str, keys: bool) -> None:
    def sc(b: Base) -> Any:
        tree = odd_tree_with_keys if keys else odd_tree
        return convert_and_describe(b, ODD_OPS[op], tree=tree, values=op != "to_empty")

    out = assert_same(sc)
    if not keys:
        assert out["result"] == ("ok", ("module", ()))
        assert out["state_dict"][0] == "ok" and out["optimizer"][0] != "raised"


# --------------------------------------------------------------------------- 8. random trees

WHATS = [
    "param",
    "param",
    "tie",
    "param_none",
    "buffer",
    "buffer_np",
    "share_buffer",
    "buffer_none",
    "module",
    "module",
    "module_none",
]
DTYPES = [torch.float32, torch.float64, torch.int64, torch.float16]


@st.composite
def node_recipe(draw: Any, depth: int = 0) -> tuple[Any, ...]:
    kinds = ["custom", "custom", "linear", "share", "seq", "stock"] if depth < 3 else ["linear"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("linear", "share"):
        return (kind, draw(st.integers(0, 50)), draw(st.booleans()))
    if kind == "seq":
        return (kind, tuple(draw(st.lists(node_recipe(depth + 1), max_size=3))))
    raw = draw(
        st.lists(
            st.tuples(
                st.sampled_from(WHATS),
                st.integers(0, 50),
                st.integers(0, len(DTYPES) - 1),
                st.booleans(),
            ),
            max_size=6,
        )
    )
    built = []
    for i, (what, k, dt, flag) in enumerate(raw):
        sub = draw(node_recipe(depth + 1)) if what == "module" else None
        built.append((what, f"{what}{i}", k, dt, flag, sub))
    return (kind, tuple(built))


class Builder:
    """Builds a recipe into a tree; finished modules can be shared (post-order, so a
    module never ends up inside itself)."""

    def __init__(self, base: Base) -> None:
        self.node_class = classes(base).Node
        self.done: list[nn.Module] = []
        self.params: list[nn.Parameter] = []
        self.buffers: list[torch.Tensor] = []

    def node(self, r: tuple[Any, ...]) -> nn.Module:
        kind = r[0]
        if kind == "share" and self.done:
            return self.done[r[1] % len(self.done)]
        if kind in ("linear", "share"):
            m: nn.Module = nn.Linear(2, 2)
            if r[2]:
                m.weight.grad = torch.randn(2, 2)
            self.params += [m.weight, m.bias]
        elif kind == "seq":
            m = nn.Sequential(*[self.node(c) for c in r[1]])
        else:
            m = self.node_class() if kind == "custom" else nn.Module()
            for what, name, k, dt, flag, sub in r[1]:
                self.entry(m, what, name, k, DTYPES[dt], flag, sub)
        self.done.append(m)
        return m

    def entry(
        self, m: nn.Module, what: str, name: str, k: int, dt: Any, flag: bool, sub: Any
    ) -> None:
        floating = dt.is_floating_point
        if what == "param" or (what == "tie" and not self.params):
            t = torch.randn(2).to(dt) if floating else torch.arange(2)
            p = nn.Parameter(t, requires_grad=floating)
            if floating and flag:
                p.grad = torch.randn(2).to(dt)
            self.params.append(p)
            m.register_parameter(name, p)
        elif what == "tie":
            m.register_parameter(name, self.params[k % len(self.params)])
        elif what == "param_none":
            m.register_parameter(name, None)
        elif what in ("buffer", "buffer_np") or (what == "share_buffer" and not self.buffers):
            t = torch.randn(2).to(dt) if floating else torch.arange(2)
            self.buffers.append(t)
            m.register_buffer(name, t, persistent=what != "buffer_np")
        elif what == "share_buffer":
            m.register_buffer(name, self.buffers[k % len(self.buffers)], persistent=flag)
        elif what == "buffer_none":
            m.register_buffer(name, None)
        elif what == "module":
            m.add_module(name, self.node(sub))
        else:
            m.add_module(name, None)


RANDOM_CONVERSIONS: dict[str, Callable[[nn.Module], Any]] = {
    "float": lambda m: m.float(),
    "double": lambda m: m.double(),
    "half": lambda m: m.half(),
    "to(float64)": lambda m: m.to(torch.float64),
    "cpu": lambda m: m.cpu(),
    "_apply(clone)": lambda m: m._apply(lambda t: t.clone()),
    "_apply(times2)": lambda m: m._apply(lambda t: t * 2),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_recipe(), st.sampled_from(list(RANDOM_CONVERSIONS)))
def test_random_trees_match(recipe: tuple[Any, ...], conversion: str) -> None:
    def sc(b: Base) -> Any:
        torch.manual_seed(1234)
        root = Builder(b).node(recipe)
        before = Index(root)
        r = outcome(lambda: before.label(RANDOM_CONVERSIONS[conversion](root)))
        return r, describe(root, before), sd_summary(root)

    stock, fast = both(sc)
    assert stock[0] == "ok"
    assert stock[1][0] == ("ok", ("module", ()))
    assert fast == stock
