"""``state_dict``: destination, prefix, keep_vars, metadata, hooks and overrides.

Every scenario builds the same tree (same seed) once on stock ``torch.nn.Module`` and
once on ``fastmodule.Module``, calls ``state_dict`` and describes the result by name
paths (never by ``id()`` across trees): keys and their order, values (``torch.equal``),
whether a value is the registered tensor itself or a detached alias of it, the
returned object's type and identity, and ``_metadata``.
"""

from __future__ import annotations

import functools
import io
import warnings
from collections import OrderedDict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import BASES, outcome

Base = type[nn.Module]


# --------------------------------------------------------------------------- helpers


class Index:
    """Name paths of modules, parameters and buffers, read straight from the registries
    (first path wins), plus the storage pointers of registered tensors."""

    def __init__(self, root: nn.Module) -> None:
        self.paths: dict[int, tuple[Any, ...]] = {}
        self.ptrs: dict[int, tuple[Any, ...]] = {}
        self.keep: list[Any] = []  # keeps labelled objects alive (ids stay unique)
        stack: list[tuple[nn.Module, tuple[str, ...]]] = [(root, ())]
        while stack:
            m, p = stack.pop()
            if id(m) in self.paths:
                continue
            self.paths[id(m)] = ("module", p)
            self.keep.append(m)
            d = m.__dict__
            for kind, registry in (("param", "_parameters"), ("buffer", "_buffers")):
                for k, v in d[registry].items():
                    if v is not None and id(v) not in self.paths:
                        self.paths[id(v)] = (kind, (*p, k))
                        self.keep.append(v)
                        if v.data_ptr():
                            self.ptrs.setdefault(v.data_ptr(), (kind, (*p, k)))
            children = [(c, (*p, k)) for k, c in d["_modules"].items() if c is not None]
            stack.extend(reversed(children))

    def name(self, obj: Any, label: str) -> None:
        """Give a non-registry object (a destination, a replacement dict) a label."""
        self.paths[id(obj)] = ("named", label)
        self.keep.append(obj)

    def label(self, obj: Any) -> Any:
        return self.paths.get(id(obj), ("other", type(obj).__name__))


class Same:
    """A tensor value that compares with ``torch.equal`` (dtype and shape included)."""

    def __init__(self, t: torch.Tensor) -> None:
        t = t.detach()
        self.t = t.dequantize() if t.is_quantized else t

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Same)
            and self.t.dtype == other.t.dtype
            and self.t.shape == other.t.shape
            and torch.equal(self.t, other.t)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Same({self.t!r})"


def describe(v: Any, ix: Index) -> Any:
    """A value by labels: a registered object by its path, a new tensor by what it is."""
    if id(v) in ix.paths:
        return ("is", ix.paths[id(v)])
    if isinstance(v, torch.Tensor):
        return (
            "tensor",
            type(v).__name__,
            v.requires_grad,
            None if v._base is None else ix.label(v._base),
            ix.ptrs.get(v.data_ptr()) if v.data_ptr() else None,
            Same(v),
        )
    if isinstance(v, tuple | list):
        return (type(v).__name__, [describe(x, ix) for x in v])
    if isinstance(v, dict):
        return (type(v).__name__, [(k, describe(x, ix)) for k, x in v.items()])
    if isinstance(v, nn.Module):
        return ("module", type(v).__name__)
    return ("value", type(v).__name__, repr(v))


def summary(sd: Any, ix: Index) -> dict[str, Any]:
    """A returned state dict: type, identity, items in order and ``_metadata``."""
    meta = getattr(sd, "_metadata", "absent")
    return {
        "type": type(sd).__name__,
        "identity": ix.label(sd),
        "items": [(k, describe(v, ix)) for k, v in sd.items()],
        "metadata": meta if meta == "absent" else list(meta.items()),
    }


def both(scenario: Callable[[Base], Any]) -> tuple[Any, Any]:
    """``outcome(scenario(base))`` for stock and for fast, each from seed 0."""
    results = []
    for b in BASES:
        torch.manual_seed(0)
        results.append(outcome(lambda b=b: scenario(b)))
    return results[0], results[1]


def assert_same(scenario: Callable[[Base], Any]) -> Any:
    stock, fast = both(scenario)
    assert fast == stock
    return stock


# --------------------------------------------------------------------------- classes


class StockAddsKey(nn.Module):
    """A stock-torch child overriding ``state_dict`` (inside a fast tree too)."""

    def __init__(self) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.randn(2))
        self.calls: list[Any] = []

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        sd = super().state_dict(*args, **kwargs)
        sd[kwargs.get("prefix", "") + "stock_added"] = torch.tensor(7.0)
        return sd


@functools.cache
def classes(base: Base) -> SimpleNamespace:
    """Custom module classes on ``base`` (one set per base)."""

    class Node(base):  # type: ignore[misc, valid-type]
        def __init__(self, n: int = 2, persistent_tmp: bool = False) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(n))
            self.register_buffer("b", torch.randn(n))
            self.register_buffer("tmp", torch.randn(n), persistent=persistent_tmp)
            self.register_parameter("none_p", None)
            self.register_buffer("none_b", None)

    class Versioned(Node):
        _version = 3

    class Extra(Node):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.count = 5

        def get_extra_state(self) -> Any:
            return {"count": self.count, "scale": self.w.detach() * 2}

        def set_extra_state(self, state: Any) -> None:
            self.count = state["count"]

    class AddsKey(Node):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Any] = []

        def state_dict(self, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((args, kwargs))
            sd = super().state_dict(*args, **kwargs)
            sd[kwargs.get("prefix", "") + "added"] = torch.tensor(1.0)
            return sd

    class QuantLike(Node):
        """Overrides ``_save_to_state_dict`` the way quantized modules do."""

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[Any] = []

        def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: Any) -> None:
            self.calls.append((destination, prefix, keep_vars))
            super()._save_to_state_dict(destination, prefix, keep_vars)
            destination[prefix + "packed"] = (self.w.detach() * 3, "packed-tag")

    class ReplacesSave(Node):
        """Overrides ``_save_to_state_dict`` without calling torch's."""

        def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: Any) -> None:
            destination[prefix + "only"] = self.w if keep_vars else self.w.detach()

    return SimpleNamespace(
        Node=Node,
        Versioned=Versioned,
        Extra=Extra,
        AddsKey=AddsKey,
        QuantLike=QuantLike,
        ReplacesSave=ReplacesSave,
    )


def build(b: Base) -> nn.Module:
    """A tree with stock children, nesting, a shared module, a tied parameter, ``None``
    entries, non-persistent buffers, BatchNorm, a custom ``_version`` and extra state."""
    C = classes(b)
    root = C.Node()
    root.lin = nn.Linear(2, 2)
    root.bn = nn.BatchNorm1d(2)
    root.sub = C.Node(persistent_tmp=True)
    root.sub.deep = C.Versioned()
    root.sub.seq = nn.Sequential(nn.Linear(2, 2), C.Extra(), nn.BatchNorm1d(2))
    root.register_module("empty", None)
    root.shared = root.sub.deep
    root.lin2 = nn.Linear(2, 2)
    root.lin2.weight = root.lin.weight
    root.extra = C.Extra()
    return root


EXPECTED_KEYS = [
    "w",
    "b",
    "lin.weight",
    "lin.bias",
    "bn.weight",
    "bn.bias",
    "bn.running_mean",
    "bn.running_var",
    "bn.num_batches_tracked",
    "sub.w",
    "sub.b",
    "sub.tmp",
    "sub.deep.w",
    "sub.deep.b",
    "sub.seq.0.weight",
    "sub.seq.0.bias",
    "sub.seq.1.w",
    "sub.seq.1.b",
    "sub.seq.1._extra_state",
    "sub.seq.2.weight",
    "sub.seq.2.bias",
    "sub.seq.2.running_mean",
    "sub.seq.2.running_var",
    "sub.seq.2.num_batches_tracked",
    "shared.w",
    "shared.b",
    "lin2.weight",
    "lin2.bias",
    "extra.w",
    "extra.b",
    "extra._extra_state",
]


# --------------------------------------------------------------------------- basics


def test_tree_keys_and_metadata_on_each_base(base: Base) -> None:
    torch.manual_seed(0)
    root = build(base)
    sd = root.state_dict()
    assert type(sd) is OrderedDict
    assert list(sd) == EXPECTED_KEYS
    meta = sd._metadata
    assert list(meta) == [
        "",
        "lin",
        "bn",
        "sub",
        "sub.deep",
        "sub.seq",
        "sub.seq.0",
        "sub.seq.1",
        "sub.seq.2",
        "shared",
        "lin2",
        "extra",
    ]
    assert meta["sub.deep"] == {"version": 3}
    assert meta["shared"] == {"version": 3}
    assert meta["bn"] == {"version": 2}
    assert meta[""] == {"version": 1}
    assert sd["bn.num_batches_tracked"].dtype == torch.long


@pytest.mark.parametrize("keep_vars", [False, True])
@pytest.mark.parametrize("prefix", ["", "p.", "p", "a.b."])
def test_tree_state_dict(prefix: str, keep_vars: bool) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        root.bn(torch.randn(4, 2))  # running stats and num_batches_tracked move
        ix = Index(root)
        sd = root.state_dict(prefix=prefix, keep_vars=keep_vars)
        return summary(sd, ix)

    stock = assert_same(sc)
    assert stock[0] == "ok"
    items = stock[1]["items"]
    assert [k for k, _ in items] == [prefix + k for k in EXPECTED_KEYS]
    # The tied weight and the shared module repeat, by reference, under both names.
    d = dict(items)
    assert d[prefix + "lin2.weight"] == d[prefix + "lin.weight"]
    assert d[prefix + "shared.w"] == d[prefix + "sub.deep.w"]


@pytest.mark.parametrize("keep_vars", [False, True])
def test_values_registered_or_detached(base: Base, keep_vars: bool) -> None:
    torch.manual_seed(0)
    root = build(base)
    registered = {**dict(root.named_parameters(remove_duplicate=False))}
    registered.update(root.named_buffers(remove_duplicate=False))
    sd = root.state_dict(keep_vars=keep_vars)
    for k, v in sd.items():
        if k.endswith("_extra_state"):
            continue
        reg = registered[k]
        if keep_vars:
            assert v is reg, k
        else:
            assert v is not reg, k
            assert not v.requires_grad, k
            assert type(v) is torch.Tensor, k
            assert v.data_ptr() == reg.data_ptr(), k
            assert v._base is None or v._base is reg._base, k
            assert torch.equal(v, reg.detach()), k


def test_values_equal_across_bases() -> None:
    sds = []
    for b in BASES:
        torch.manual_seed(0)
        sds.append(build(b).state_dict())
    stock, fast = sds
    assert list(fast) == list(stock)
    for k in stock:
        if isinstance(stock[k], torch.Tensor):
            assert torch.equal(fast[k], stock[k]), k
        else:
            assert fast[k]["count"] == stock[k]["count"]
            assert torch.equal(fast[k]["scale"], stock[k]["scale"])


def test_single_module_and_stock_only_tree() -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        out = []
        for root in (C.Node(), b(), C.Versioned()):
            ix = Index(root)
            out.append(summary(root.state_dict(), ix))
        # A stock container whose state_dict is called on the fast child directly.
        leaf = C.Node()
        seq = nn.Sequential(leaf, nn.Linear(2, 2))
        ix = Index(seq)
        out.append(summary(seq.state_dict(prefix="s."), ix))
        out.append(summary(leaf.state_dict(prefix="0."), ix))
        return out

    stock = assert_same(sc)
    assert stock[0] == "ok"


def test_none_and_non_persistent_entries() -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        root = C.Node()
        root.register_buffer("late", torch.ones(1), persistent=False)
        root.register_buffer("again", torch.zeros(1))
        root._non_persistent_buffers_set.add("again")  # made non-persistent afterwards
        root.register_buffer("tmp", torch.full((2,), 3.0))  # re-registered persistent
        root.register_module("nothing", None)
        root.lin = nn.Linear(2, 2, bias=False)  # registers bias as None
        root.bn = nn.BatchNorm1d(2, affine=False, track_running_stats=False)
        ix = Index(root)
        return summary(root.state_dict(), ix), summary(root.state_dict(keep_vars=True), ix)

    stock = assert_same(sc)
    keys = [k for k, _ in stock[1][0]["items"]]
    assert keys == ["w", "b", "tmp", "lin.weight"]


# --------------------------------------------------------------------------- destination


class RecordingDict(dict):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def __setitem__(self, key: str, value: Any) -> None:
        self.log.append(key)
        super().__setitem__(key, value)


@pytest.mark.parametrize("kind", ["dict", "odict", "odict+meta", "prefilled", "recording"])
@pytest.mark.parametrize("prefix", ["", "p."])
def test_caller_destination(kind: str, prefix: str) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        if kind == "dict":
            dest: Any = {}
        elif kind == "odict":
            dest = OrderedDict()
        elif kind == "odict+meta":
            dest = OrderedDict(before=1)
            dest._metadata = OrderedDict(old={"version": 0})
        elif kind == "prefilled":
            dest = {"w": "stale", "zzz": 1}
        else:
            dest = RecordingDict()
        ix.name(dest, "destination")
        sd = root.state_dict(destination=dest, prefix=prefix)
        return (
            sd is dest,
            summary(sd, ix),
            hasattr(dest, "_metadata"),
            getattr(dest, "log", None),
        )

    stock = assert_same(sc)
    assert stock[0] == "ok"
    returned_dest, s, has_meta, _ = stock[1]
    assert returned_dest
    assert s["identity"] == ("named", "destination")
    assert has_meta == (kind == "odict+meta")


# --------------------------------------------------------------------------- positional


def call_recording_warnings(root: nn.Module, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = outcome(lambda: root.state_dict(*args, **kwargs))  # the warning's line
    return result, [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((None, "x.", True), {}),
        ((None,), {}),
        ((None, "x."), {}),
        (("DEST",), {}),
        (("DEST", "x.", False), {}),
        ((None, "x.", True, "ignored"), {}),
        ((None, "a."), {"prefix": "b."}),
        (("DEST",), {"destination": None}),
        ((None, "", 1), {}),
        ((None, "x.", True), {"keep_vars": False}),
        ((), {"destination": None, "prefix": "k.", "keep_vars": True}),
    ],
)
def test_positional_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        dest: dict[str, Any] = {}
        ix.name(dest, "destination")
        real = tuple(dest if a == "DEST" else a for a in args)
        result, caught = call_recording_warnings(root, *real, **kwargs)
        if result[0] == "ok":
            result = ("ok", summary(result[1], ix))
        return result, caught

    stock, fast = both(sc)
    assert fast == stock
    assert stock[0] == "ok"
    caught = stock[1][1]
    assert len(caught) == (1 if args else 0)
    for message, category, filename, _ in caught:
        assert category is FutureWarning
        assert message.startswith("Positional args are being deprecated")
        assert filename == __file__


# --------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("keep_vars", [False, True, 1])
def test_pre_hooks(keep_vars: Any) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        log: list[Any] = []

        def make(tag: str) -> Callable[..., Any]:
            def hook(module: nn.Module, prefix: str, kv: Any) -> Any:
                log.append((tag, ix.label(module), prefix, kv, type(kv).__name__))
                return "ignored"

            return hook

        root.register_state_dict_pre_hook(make("root1"))
        root.register_state_dict_pre_hook(make("root2"))
        root.lin.register_state_dict_pre_hook(make("lin"))
        root.sub.deep.register_state_dict_pre_hook(make("deep"))  # shared: called twice
        root.sub.seq[1].register_state_dict_pre_hook(make("extra"))
        h = root.bn.register_state_dict_pre_hook(make("removed"))
        h.remove()
        sd = root.state_dict(prefix="r.", keep_vars=keep_vars)
        return log, summary(sd, ix)

    stock = assert_same(sc)
    assert [x[0] for x in stock[1][0]] == ["root1", "root2", "lin", "deep", "extra", "deep"]


def test_pre_hook_mutating_module_state() -> None:
    """A pre-hook may change what is saved (torch calls it before saving)."""

    def sc(b: Base) -> Any:
        root = build(b)

        def hook(module: nn.Module, prefix: str, kv: Any) -> None:
            module.register_buffer("from_hook", torch.tensor([9.0]))
            module.sub.register_module("late", nn.Linear(1, 1))

        root.register_state_dict_pre_hook(hook)
        sd = root.state_dict()
        return summary(sd, Index(root))

    stock = assert_same(sc)
    keys = [k for k, _ in stock[1]["items"]]
    assert "from_hook" in keys and "sub.late.weight" in keys


@pytest.mark.parametrize("where", ["root", "child", "stock_child"])
def test_public_post_hooks(where: str) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        target = {"root": root, "child": root.sub, "stock_child": root.lin}[where]
        log: list[Any] = []

        def hook(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> None:
            log.append((ix.label(module), sd, prefix, dict(local_metadata)))
            sd[prefix + "post"] = torch.tensor([len(sd)])
            local_metadata["seen"] = True  # the very dict stored in _metadata

        def hook2(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> None:
            log.append(("second", prefix, list(sd)[-1]))

        target.register_state_dict_post_hook(hook)
        target.register_state_dict_post_hook(hook2)
        sd = root.state_dict(prefix="p.")
        ix.name(sd, "returned")
        return summary(sd, ix), [
            tuple(ix.label(x) if isinstance(x, dict) else x for x in entry) for entry in log
        ]

    stock = assert_same(sc)
    assert stock[0] == "ok"


@pytest.mark.parametrize("where", ["root", "child", "stock_child"])
def test_public_post_hook_must_return_none(where: str) -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        target = {"root": root, "child": root.sub, "stock_child": root.lin}[where]
        target.register_state_dict_post_hook(lambda *a: {"x": 1})
        dest: dict[str, Any] = {}
        return outcome(lambda: root.state_dict(destination=dest)), list(dest)

    stock = assert_same(sc)
    assert stock[1][0][:3] == ("raised", RuntimeError, "state_dict post-hook must return None")


def test_private_hook_on_root_replaces_result() -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        replacement: Any = OrderedDict(replaced=torch.tensor(1.0))
        ix.name(replacement, "replacement")
        log: list[Any] = []

        def first(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> Any:
            log.append(("first", ix.label(sd), prefix, dict(local_metadata)))
            return replacement

        def second(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> Any:
            log.append(("second", ix.label(sd), prefix))
            return None

        def public(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> None:
            log.append(("public", ix.label(sd), prefix))

        root._register_state_dict_hook(first)
        root._register_state_dict_hook(second)
        root.register_state_dict_post_hook(public)
        dest: dict[str, Any] = {}
        ix.name(dest, "destination")
        out = [summary(root.state_dict(destination=dest, prefix="r."), ix), list(dest), log[:]]
        out.append(summary(root.state_dict(), ix))
        out.append(log)
        return out

    stock = assert_same(sc)
    assert stock[1][0]["identity"] == ("named", "replacement")
    assert stock[1][2][1][1] == ("named", "replacement")


def test_private_hook_on_child_is_not_seen_by_parent() -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        replacement: Any = {"child_only": 1}
        ix.name(replacement, "replacement")
        log: list[Any] = []

        def hook(module: nn.Module, sd: Any, prefix: str, local_metadata: Any) -> Any:
            log.append((ix.label(module), ix.label(sd), prefix))
            sd[prefix + "inplace"] = 1
            return replacement

        root.sub._register_state_dict_hook(hook)
        root.lin._register_state_dict_hook(hook)  # on a stock child
        dest: dict[str, Any] = {}
        ix.name(dest, "destination")
        sd = root.state_dict(destination=dest)
        direct = root.sub.state_dict(prefix="d.")  # called on the child itself
        return summary(sd, ix), ix.label(direct), log

    stock = assert_same(sc)
    s, direct, _ = stock[1]
    assert s["identity"] == ("named", "destination")
    assert "sub.inplace" in [k for k, _ in s["items"]]
    assert direct == ("named", "replacement")


# --------------------------------------------------------------------------- overrides


def describe_calls(calls: list[Any], ix: Index) -> list[Any]:
    return [describe(c, ix) for c in calls]


@pytest.mark.parametrize("keep_vars", [False, True])
def test_child_overriding_state_dict(keep_vars: bool) -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        root = build(b)
        root.adds = C.AddsKey()
        root.sub.stock_adds = StockAddsKey()
        ix = Index(root)
        dest: dict[str, Any] = {}
        ix.name(dest, "destination")
        sd = root.state_dict(destination=dest, prefix="r.", keep_vars=keep_vars)
        direct = root.adds.state_dict()
        return (
            summary(sd, ix),
            describe_calls(root.adds.calls, ix),
            describe_calls(root.sub.stock_adds.calls, ix),
            summary(direct, ix),
        )

    stock = assert_same(sc)
    s, adds_calls, stock_calls, _ = stock[1]
    assert adds_calls[0][1][0] == ("tuple", [])
    assert adds_calls[0][1][1] == (
        "dict",
        [
            ("destination", ("is", ("named", "destination"))),
            ("prefix", ("value", "str", "'r.adds.'")),
            ("keep_vars", ("value", "bool", repr(keep_vars))),
        ],
    )
    keys = [k for k, _ in s["items"]]
    assert "r.adds.added" in keys and "r.sub.stock_adds.stock_added" in keys


@pytest.mark.parametrize("keep_vars", [False, True])
def test_child_overriding_save_to_state_dict(keep_vars: bool) -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        root = C.QuantLike()
        root.q = C.QuantLike()
        root.sub = C.Node()
        root.sub.only = C.ReplacesSave()
        root.sub.q2 = root.q  # shared: saved twice
        ix = Index(root)
        sd = root.state_dict(prefix="x.", keep_vars=keep_vars)
        ix.name(sd, "returned")
        return summary(sd, ix), describe_calls(root.calls, ix), describe_calls(root.q.calls, ix)

    stock = assert_same(sc)
    assert stock[0] == "ok"
    keys = [k for k, _ in stock[1][0]["items"]]
    assert keys == [
        "x.w",
        "x.b",
        "x.packed",
        "x.q.w",
        "x.q.b",
        "x.q.packed",
        "x.sub.w",
        "x.sub.b",
        "x.sub.only.only",
        "x.sub.q2.w",
        "x.sub.q2.b",
        "x.sub.q2.packed",
    ]


def test_quantized_child() -> None:
    def sc(b: Base) -> Any:
        root = classes(b).Node()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            root.q = torch.ao.nn.quantized.Linear(2, 2)
            root.q.set_weight_bias(
                torch.quantize_per_tensor(torch.randn(2, 2), 0.1, 0, torch.qint8),
                torch.randn(2),
            )
            sd = root.state_dict(prefix="m.")
        return summary(sd, Index(root))

    stock = assert_same(sc)
    assert stock[0] == "ok"
    assert "m.q._packed_params._packed_params" in [k for k, _ in stock[1]["items"]]


def test_instance_attribute_overrides() -> None:
    """``child.state_dict = f`` / ``child._save_to_state_dict = f`` shadow the method."""

    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        log: list[Any] = []
        sub, lin = root.sub, root.lin

        def sub_state_dict(*args: Any, **kwargs: Any) -> Any:
            log.append(("sub", args, kwargs))
            return type(sub).state_dict(sub, *args, **kwargs)

        def lin_save(destination: Any, prefix: str, keep_vars: Any) -> None:
            log.append(("lin", destination, prefix, keep_vars))
            destination[prefix + "custom"] = 0

        sub.state_dict = sub_state_dict
        lin._save_to_state_dict = lin_save
        sd = root.state_dict()
        ix.name(sd, "returned")
        return summary(sd, ix), [describe(x, ix) for x in log]

    stock = assert_same(sc)
    assert len(stock[1][1][1]) == 2


def test_extra_state() -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        root = C.Extra()
        root.count = 11
        root.child = C.Extra()
        root.child.count = 12
        root.plain = C.Node()
        ix = Index(root)
        sd = root.state_dict(prefix="e.")
        fresh = C.Extra()
        fresh.child = C.Extra()
        fresh.plain = C.Node()
        result = fresh.load_state_dict({k[2:]: v for k, v in sd.items()})
        return summary(sd, ix), (fresh.count, fresh.child.count), repr(result)

    stock = assert_same(sc)
    assert stock[1][1] == (11, 12)
    keys = [k for k, _ in stock[1][0]["items"]]
    assert keys == ["e.w", "e.b", "e._extra_state", "e.child.w", "e.child.b"] + [
        "e.child._extra_state",
        "e.plain.w",
        "e.plain.b",
    ]


def test_patched_torch_state_dict_is_honoured() -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        root.adds = classes(b).AddsKey()
        ix = Index(root)
        original = nn.Module.state_dict
        log: list[Any] = []

        def recorder(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            log.append((self, args, kwargs))
            return original(self, *args, **kwargs)

        nn.Module.state_dict = recorder  # type: ignore[method-assign]
        try:
            sd = root.state_dict(prefix="p.", keep_vars=True)
            ix.name(sd, "returned")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sd2 = root.state_dict(None, "x.")
            ix.name(sd2, "returned2")
        finally:
            nn.Module.state_dict = original  # type: ignore[method-assign]
        return summary(sd, ix), summary(sd2, ix), [describe(x, ix) for x in log]

    stock = assert_same(sc)
    log = stock[1][2]
    assert log[0][1][0] == ("is", ("module", ()))
    assert log[0][1][1] == ("tuple", [])
    assert nn.Module.state_dict is BASES[0].state_dict


def test_patched_torch_save_to_state_dict_is_honoured() -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        ix = Index(root)
        original = nn.Module._save_to_state_dict
        log: list[Any] = []

        def recorder(self: nn.Module, destination: Any, prefix: str, keep_vars: Any) -> None:
            log.append((ix.label(self), prefix, keep_vars))
            original(self, destination, prefix, keep_vars)
            destination[prefix + "patched"] = 0

        nn.Module._save_to_state_dict = recorder  # type: ignore[method-assign]
        try:
            sd = root.state_dict(keep_vars=True)
        finally:
            nn.Module._save_to_state_dict = original  # type: ignore[method-assign]
        return summary(sd, ix), log

    stock = assert_same(sc)
    assert len(stock[1][1]) == 12


# --------------------------------------------------------------------------- errors


def _raise(exc: BaseException) -> Callable[..., Any]:
    def f(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return f


@pytest.mark.parametrize(
    "case",
    [
        "pre_hook_child",
        "pre_hook_stock_child",
        "post_hook_root",
        "private_hook_child",
        "get_extra_state_raises",
        "get_extra_state_none",
        "save_raises",
        "state_dict_raises",
        "bad_destination",
        "bad_prefix",
    ],
)
def test_errors_propagate(case: str) -> None:
    def sc(b: Base) -> Any:
        C = classes(b)
        root = build(b)
        dest: Any = {}
        prefix: Any = "p."
        if case == "pre_hook_child":
            root.sub.register_state_dict_pre_hook(_raise(ValueError("pre boom")))
        elif case == "pre_hook_stock_child":
            root.lin.register_state_dict_pre_hook(_raise(KeyError("lin pre")))
        elif case == "post_hook_root":
            root.register_state_dict_post_hook(_raise(RuntimeError("post boom")))
        elif case == "private_hook_child":
            root.sub.deep._register_state_dict_hook(_raise(TypeError("private boom")))
        elif case == "get_extra_state_raises":

            class Bad(C.Node):
                def get_extra_state(self) -> Any:
                    raise ZeroDivisionError("extra boom")

            root.sub.bad = Bad()
        elif case == "get_extra_state_none":

            class NoneExtra(C.Node):
                get_extra_state = None

            root.sub.none_extra = NoneExtra()
        elif case == "save_raises":

            class BadSave(C.Node):
                def _save_to_state_dict(self, *args: Any) -> None:
                    raise OSError("save boom")

            root.sub.bad = BadSave()
        elif case == "state_dict_raises":

            class BadSD(C.Node):
                def state_dict(self, *args: Any, **kwargs: Any) -> Any:
                    raise LookupError("sd boom")

            root.sub.bad = BadSD()
        elif case == "bad_destination":
            dest = ()
        elif case == "bad_prefix":
            prefix = 5
        res = outcome(lambda: root.state_dict(destination=dest, prefix=prefix))
        if res[0] == "ok":
            res = ("ok", summary(res[1], Index(root)))
        return res, list(dest)

    stock = assert_same(sc)
    assert stock[0] == "ok"
    assert stock[1][0][0] == "raised"


@pytest.mark.parametrize("mode", ["add_sibling", "del_sibling", "late_param", "replace_sibling"])
def test_registry_mutation_during_walk(mode: str) -> None:
    """A pre-hook that changes the registries mid-walk: torch's dict iteration rules."""

    def sc(b: Base) -> Any:
        C = classes(b)
        root = C.Node()
        root.a = C.Node()
        root.c = C.Node()

        def hook(module: nn.Module, prefix: str, keep_vars: Any) -> None:
            if mode == "add_sibling":
                root.add_module("z", C.Node())
            elif mode == "del_sibling":
                del root.c
            elif mode == "late_param":
                root.a.register_parameter("late", nn.Parameter(torch.ones(1)))
            else:
                root.c = nn.Linear(1, 1)

        (root if mode == "late_param" else root.a).register_state_dict_pre_hook(hook)
        dest: dict[str, Any] = {}
        res = outcome(lambda: root.state_dict(destination=dest))
        return (res[0], *res[2:]) if res[0] == "raised" else res[0], list(dest)

    stock = assert_same(sc)
    assert stock[0] == "ok"


# --------------------------------------------------------------------------- save / load


def test_torch_save_load_round_trip() -> None:
    def sc(b: Base) -> Any:
        root = build(b)
        sd = root.state_dict()
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        ix = Index(root)
        assert list(loaded) == list(sd)
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(loaded[k], v), k
        assert loaded._metadata == sd._metadata
        fresh = build(b)
        fresh.load_state_dict(loaded)
        return summary(loaded, ix), summary(fresh.state_dict(), Index(fresh))

    stock = assert_same(sc)
    assert stock[0] == "ok"


# --------------------------------------------------------------------------- hypothesis

LEAVES = st.sampled_from(["linear", "bn", "none", "shared"])
CUSTOM = st.sampled_from(["Node", "Versioned", "Extra", "AddsKey", "QuantLike"])


def _custom(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.tuples(
        st.just("custom"),
        CUSTOM,
        st.lists(children, max_size=3),
        st.booleans(),  # tie a parameter made earlier
        st.booleans(),  # tmp buffer persistent
    )


def _seq(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.tuples(st.just("seq"), st.lists(children, max_size=3))


def _trees(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return LEAVES
    sub = _trees(depth - 1)
    return st.one_of(LEAVES, _custom(sub), _seq(sub))


TREES = _custom(_trees(2))  # depth <= 3 below the root


def build_spec(b: Base, spec: Any, pool: SimpleNamespace) -> nn.Module | None:
    C = classes(b)
    if spec == "none":
        return None
    if spec == "linear":
        m: nn.Module = nn.Linear(2, 2)
        pool.params.append(m.weight)
    elif spec == "bn":
        m = nn.BatchNorm1d(2)
    elif spec == "shared":
        return pool.modules[-1] if pool.modules else nn.Linear(2, 2)
    elif spec[0] == "seq":
        m = nn.Sequential()
        for i, ch in enumerate(spec[1]):
            m.add_module(str(i), build_spec(b, ch, pool))
    else:
        _, cls, children, tie, persistent = spec
        m = getattr(C, cls)() if cls in ("AddsKey", "QuantLike") else getattr(C, cls)(2, persistent)
        for i, ch in enumerate(children):
            m.add_module(f"c{i}", build_spec(b, ch, pool))
        if tie and pool.params:
            m.tied = pool.params[0]
        pool.params.append(m.w)
    pool.modules.append(m)
    return m


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_random_trees(spec: Any) -> None:
    def sc(b: Base) -> Any:
        root = build_spec(b, spec, SimpleNamespace(params=[], modules=[]))
        assert root is not None
        ix = Index(root)
        out = []
        # Twice: the second round replays what the first recorded.
        for _ in range(2):
            for keep_vars in (False, True):
                for prefix in ("", "root."):
                    out.append(summary(root.state_dict(prefix=prefix, keep_vars=keep_vars), ix))
        return out

    stock = assert_same(sc)
    assert stock[0] == "ok"
