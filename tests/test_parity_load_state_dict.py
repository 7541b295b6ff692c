"""``load_state_dict``: keys, errors, values, identities, metadata, hooks and overrides.

Every scenario builds the same tree (same seed) once on stock ``torch.nn.Module`` and
once on ``fastmodule.Module``, runs the same load and compares: the outcome (the
returned ``_IncompatibleKeys`` or the exact exception type and text), what hooks and
overrides saw, warnings, and the final state of the tree described by name paths
(values, dtypes, ``requires_grad``, and whether each registered tensor is the object it
was before, a tensor of the state dict, or a new one), plus the caller's ``_metadata``.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
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


class Ctx:
    """What one run records: hook logs, and labels for tensors (before the load, and
    those of the state dicts handed in)."""

    def __init__(self, m: nn.Module) -> None:
        self.log: list[Any] = []
        self.labels: dict[int, Any] = {}
        self.keep: list[Any] = [m]
        self.sds: list[Any] = []
        for path, kind, v in walk(m):
            if v is not None and id(v) not in self.labels:
                self.labels[id(v)] = ("before", kind, path)
                self.keep.append(v)

    def track(self, sd: Any) -> Any:
        """Label the values of a state dict about to be loaded; returns ``sd``."""
        n = len(self.sds)
        self.sds.append(sd)
        for k, v in list(sd.items()):
            if isinstance(v, torch.Tensor) and id(v) not in self.labels:
                self.labels[id(v)] = ("sd", n, repr(k))
                self.keep.append(v)
        return sd


def walk(m: nn.Module) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every registry entry by path, straight from the registries (shared modules are
    walked at each of their paths, as ``state_dict`` does)."""
    stack: list[tuple[nn.Module, tuple[Any, ...], int]] = [(m, (), 0)]
    while stack:
        mod, path, depth = stack.pop()
        d = mod.__dict__
        for kind in ("_parameters", "_buffers"):
            for k, v in d[kind].items():
                yield (*path, k), kind, v
        children = []
        for k, c in d["_modules"].items():
            yield (*path, k), "_modules", None if c is None else type(c).__name__
            if c is not None and depth < 8:
                children.append((c, (*path, k), depth + 1))
        stack.extend(reversed(children))


def value(v: torch.Tensor) -> Any:
    if v.is_meta:
        return "meta"
    return v.detach().tolist()


def snapshot(m: nn.Module, ctx: Ctx) -> list[Any]:
    """The tree after the load, by path; tensor identities as labels (never ``id()``)."""
    out: list[Any] = []
    first: dict[int, Any] = {}
    for path, kind, v in walk(m):
        if kind == "_modules" or v is None:
            out.append((path, kind, v))
            continue
        ident = ctx.labels.get(id(v))
        if ident is None:
            ident = first.get(id(v), "new")
        first.setdefault(id(v), ("first seen at", path))
        out.append(
            (path, kind, type(v).__name__, str(v.dtype), tuple(v.shape), v.requires_grad,
             value(v), ident)
        )  # fmt: skip
    for mod_path, mod in named_all(m):
        for attr in ("count", "extra_seen"):
            if attr in mod.__dict__:
                out.append((mod_path, attr, repr(mod.__dict__[attr])))
    meta = [copy.deepcopy(getattr(sd, "_metadata", "absent")) for sd in ctx.sds]
    out.append(("metadata", meta))
    out.append(("sd keys", [list(map(repr, sd)) for sd in ctx.sds]))
    return out


def named_all(m: nn.Module) -> Iterator[tuple[tuple[Any, ...], nn.Module]]:
    stack: list[tuple[nn.Module, tuple[Any, ...], int]] = [(m, (), 0)]
    while stack:
        mod, path, depth = stack.pop()
        yield path, mod
        children = [
            (c, (*path, k), depth + 1)
            for k, c in mod.__dict__["_modules"].items()
            if c is not None and depth < 8
        ]
        stack.extend(reversed(children))


def describe(res: tuple[Any, ...]) -> tuple[Any, ...]:
    if res[0] == "ok":
        r = res[1]
        if type(r).__name__ == "_IncompatibleKeys":
            return ("ok", "_IncompatibleKeys", list(r.missing_keys), list(r.unexpected_keys))
        return ("ok", repr(r))
    return res


def run(
    base: Base, build: Callable[[Base], nn.Module], act: Callable[[nn.Module, Ctx], Any]
) -> tuple[Any, ...]:
    torch.manual_seed(0)
    m = build(base)
    ctx = Ctx(m)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = outcome(lambda: act(m, ctx))
    warned = [(w.category.__name__, str(w.message)) for w in caught]
    return describe(res), ctx.log, warned, snapshot(m, ctx)


def check(build: Callable[[Base], nn.Module], act: Callable[[nn.Module, Ctx], Any]) -> Any:
    """Same build and load on stock and fast; everything observable must be equal."""
    stock, fast = (run(b, build, act) for b in BASES)
    assert fast[0] == stock[0], "outcome"
    assert fast[1] == stock[1], "hook / override log"
    assert fast[2] == stock[2], "warnings"
    assert fast[3] == stock[3], "final state"
    return stock


def fresh(m: nn.Module, ctx: Ctx | None = None, shift: float = 0.5) -> OrderedDict:
    """``m.state_dict()`` with new (shifted) tensors and a private copy of ``_metadata``."""
    sd = m.state_dict()
    out: OrderedDict = OrderedDict()
    for k, v in sd.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out[k] = v.detach().clone() + shift
        elif isinstance(v, torch.Tensor):
            out[k] = v.detach().clone() + 1
        else:
            out[k] = v
    out._metadata = copy.deepcopy(sd._metadata)  # type: ignore[attr-defined]
    return ctx.track(out) if ctx is not None else out


# --------------------------------------------------------------------------- classes


@functools.cache
def classes(base: Base) -> SimpleNamespace:
    """Custom module classes on ``base`` (one set per base, same names)."""

    class Inner(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))
            self.register_buffer("np", torch.randn(2), persistent=False)
            self.register_parameter("none_p", None)
            self.register_buffer("none_b", None)

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 3)
            self.bn = nn.BatchNorm1d(3)
            self.inner = Inner()
            self.seq = nn.Sequential(nn.Linear(3, 2), Inner())
            self.register_module("empty", None)

    class Extra(Inner):
        def __init__(self) -> None:
            super().__init__()
            self.count = 5

        def get_extra_state(self) -> Any:
            return {"count": self.count}

        def set_extra_state(self, state: Any) -> None:
            self.count = state["count"]

    class ExtraNet(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Extra()
            self.b = Inner()

    class Logged(Inner):
        """Overrides ``_load_from_state_dict``: logs its arguments, then torch's."""

        log: list[Any] | None = None

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):  # type: ignore[no-untyped-def]
            if self.log is not None:
                self.log.append(
                    ("Logged", type(state_dict).__name__, prefix, list(state_dict),
                     dict(local_metadata), args[0], list(args[1]), list(args[2]), list(args[3]))
                )  # fmt: skip
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    class Mutating(base):  # type: ignore[misc, valid-type]
        """A parent whose override edits its dict before its children load."""

        def __init__(self) -> None:
            super().__init__()
            self.x = nn.Linear(2, 2)
            self.y = Logged()
            self.z = nn.Linear(2, 2)

        def _load_from_state_dict(self, state_dict, prefix, *args):  # type: ignore[no-untyped-def]
            state_dict[prefix + "y.p"] = torch.full((2,), 9.0)
            del state_dict[prefix + "x.bias"]
            state_dict[prefix + "z.extra"] = torch.ones(1)
            state_dict.pop(prefix + "y.b", None)
            super()._load_from_state_dict(state_dict, prefix, *args)

    class Renaming(Inner):
        """Renames legacy keys, like a versioned module would."""

        _version = 2

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):  # type: ignore[no-untyped-def]
            if local_metadata.get("version", None) is None or local_metadata["version"] < 2:
                if prefix + "old_p" in state_dict:
                    state_dict[prefix + "p"] = state_dict.pop(prefix + "old_p")
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)

    class Holder(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Inner()
            self.r = Renaming()
            self.c = nn.Linear(2, 2)

    class Shared(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            lin = nn.Linear(2, 2)
            self.a = lin
            self.b = nn.Sequential(lin, Inner())
            self.c = nn.Linear(2, 2)
            self.c.weight = lin.weight  # tied
            self.d = lin

    class Scalar(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.s = nn.Parameter(torch.tensor(1.5))
            self.register_buffer("t", torch.tensor(2.0))

    class Leaf(base):  # type: ignore[misc, valid-type]
        pass

    return SimpleNamespace(**{k: v for k, v in locals().items() if isinstance(v, type)})


def net(base: Base) -> nn.Module:
    return classes(base).Net()


# --------------------------------------------------------------------------- basics


def test_round_trip_on_each_base(base: Base) -> None:
    torch.manual_seed(0)
    m = classes(base).Net()
    sd = fresh(m)
    res = m.load_state_dict(sd)
    assert type(res).__name__ == "_IncompatibleKeys"
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert torch.equal(m.lin.weight, sd["lin.weight"])
    assert m.lin.weight is not sd["lin.weight"]


def test_missing_and_unexpected_literal_on_each_base(base: Base) -> None:
    torch.manual_seed(0)
    m = classes(base).Net()
    sd = fresh(m)
    del sd["lin.weight"], sd["seq.1.b"]
    sd["zzz"] = torch.ones(1)
    sd["inner.q"] = torch.ones(1)
    res = m.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["lin.weight", "seq.1.b"]
    assert res.unexpected_keys == ["zzz", "inner.q"]
    with pytest.raises(RuntimeError) as ei:
        m.load_state_dict(sd)
    assert str(ei.value) == (
        "Error(s) in loading state_dict for Net:\n\t"
        'Missing key(s) in state_dict: "lin.weight", "seq.1.b". \n\t'
        'Unexpected key(s) in state_dict: "zzz", "inner.q". '
    )


EDITS: dict[str, Callable[[OrderedDict], Any]] = {
    "none": lambda sd: None,
    "missing": lambda sd: [sd.pop("lin.weight"), sd.pop("seq.1.b"), sd.pop("bn.running_mean")],
    "unexpected": lambda sd: sd.update(
        {
            "zzz": torch.ones(1),
            "inner.q": torch.ones(2),
            "seq.5.w": torch.ones(1),
            "lin.weight.x": torch.ones(1),
            "inner.np": torch.ones(2),
            "inner.none_p": torch.ones(2),
        }
    ),  # fmt: skip
    "size": lambda sd: sd.update({"lin.bias": torch.ones(4), "seq.1.p": torch.ones(2, 1)}),
    "all": lambda sd: [
        sd.pop("inner.p"),
        sd.update({"bn.weight": torch.ones(5), "extra.key": torch.ones(1)}),
    ],
    "non_tensor": lambda sd: sd.update({"lin.bias": 1.5, "inner.b": [1.0, 2.0]}),
    "none_value": lambda sd: sd.update({"lin.bias": None}),
    "empty_child_keys": lambda sd: sd.update({"empty.weight": torch.ones(1)}),
    "reordered": lambda sd: [sd.move_to_end(k, last=False) for k in list(sd)[::2]],
    "only_children": lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("bn.")],
    "cleared": lambda sd: sd.clear(),
    "float64": lambda sd: sd.update(
        {k: v.double() for k, v in sd.items() if v.is_floating_point()}
    ),
    "int_values": lambda sd: sd.update({"lin.bias": torch.tensor([1, 2, 3])}),
    "param_values": lambda sd: sd.update(
        {"lin.weight": nn.Parameter(torch.ones(3, 2)), "inner.p": nn.Parameter(torch.ones(2))}
    ),
}


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("edit", list(EDITS))
def test_edits(edit: str, strict: bool, assign: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        EDITS[edit](sd)
        ctx.track(sd)
        return m.load_state_dict(sd, strict=strict, assign=assign)

    check(net, act)


def test_requires_grad_kept_with_assign() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.lin.weight.requires_grad_(False)
        sd = fresh(m, ctx)
        sd["inner.p"] = ctx.track({"x": nn.Parameter(torch.ones(2), requires_grad=False)})["x"]
        sd["lin.bias"] = ctx.track({"y": nn.Parameter(torch.ones(3))})["y"]
        r = m.load_state_dict(sd, assign=True)
        ctx.log.append([m.lin.weight.requires_grad, m.inner.p.requires_grad,
                        m.lin.bias.requires_grad, type(m.bn.running_mean).__name__])  # fmt: skip
        return r

    res = check(net, act)
    assert res[1] == [[False, True, True, "Tensor"]]


@pytest.mark.parametrize("assign", [False, True])
def test_float64_into_float32(assign: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        for k, v in sd.items():
            if v.is_floating_point():
                sd[k] = v.double() / 3
        ctx.track(sd)
        r = m.load_state_dict(sd, assign=assign)
        ctx.log.append(str(m.lin.weight.dtype))
        return r

    res = check(net, act)
    assert res[1] == ["torch.float64" if assign else "torch.float32"]


@pytest.mark.parametrize(
    "arg",
    [[("lin.weight", torch.ones(3, 2))], None, 5, "lin.weight", ("a",), {"a"}],
    ids=["list", "None", "int", "str", "tuple", "set"],
)
def test_non_mapping(arg: Any) -> None:
    res = check(net, lambda m, ctx: m.load_state_dict(arg))
    assert res[0][:2] == ("raised", TypeError)


class ReadOnly(Mapping):
    """A Mapping that is not a dict, with ``_metadata``."""

    def __init__(self, d: Mapping[str, Any], meta: Any) -> None:
        self._d = dict(d)
        self._metadata = meta

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


@pytest.mark.parametrize("strict", [True, False])
def test_custom_mapping(strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        del sd["bn.num_batches_tracked"]
        meta = sd._metadata  # type: ignore[attr-defined]
        meta["bn"] = {"version": 1}
        return m.load_state_dict(ReadOnly(sd, meta), strict=strict)

    check(net, act)


def test_plain_dict_without_metadata() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = dict(fresh(m))
        del sd["bn.num_batches_tracked"]  # version None: BatchNorm adds it back
        ctx.track(sd)
        return m.load_state_dict(sd)

    check(net, act)


@pytest.mark.parametrize("version", [None, 1, 2, "absent"])
@pytest.mark.parametrize("has_key", [True, False])
@pytest.mark.parametrize("strict", [True, False])
def test_batchnorm_version_migration(version: Any, has_key: bool, strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        if not has_key:
            del sd["bn.num_batches_tracked"]
        if version == "absent":
            del sd._metadata["bn"]  # type: ignore[attr-defined]
        else:
            sd._metadata["bn"] = {"version": version}  # type: ignore[attr-defined]
        m.bn.register_load_state_dict_pre_hook(
            lambda mod, d, prefix, meta, *a: ctx.log.append(("pre", prefix, list(d), dict(meta)))
        )
        r = m.load_state_dict(sd, strict=strict)
        ctx.log.append(int(m.bn.num_batches_tracked))
        return r

    check(net, act)


@pytest.mark.parametrize("assign", [False, True])
def test_metadata_passed_and_mutated(assign: bool) -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        m = classes(base).Holder()
        m.a.__class__ = classes(base).Logged
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.a.log = ctx.log
        sd = fresh(m, ctx)
        sd._metadata["a"] = {"version": 7, "note": "x"}  # type: ignore[attr-defined]
        sd._metadata["r"] = {"version": 1}  # type: ignore[attr-defined]
        sd["r.old_p"] = sd.pop("r.p")
        del sd._metadata["c"]  # type: ignore[attr-defined]
        return m.load_state_dict(sd, assign=assign)

    check(build, act)


# --------------------------------------------------------------------------- hooks


def test_pre_hooks_both_apis_edit_local_dict() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        def with_module(mod, d, prefix, meta, strict, missing, unexpected, errors):  # type: ignore[no-untyped-def]
            ctx.log.append(("with", type(mod).__name__, prefix, list(d), dict(meta), strict,
                            list(missing), list(unexpected), list(errors)))  # fmt: skip
            if prefix + "old_weight" in d:
                d[prefix + "weight"] = d.pop(prefix + "old_weight")
            d.pop(prefix + "junk", None)

        def without(d, prefix, meta, strict, missing, unexpected, errors):  # type: ignore[no-untyped-def]
            ctx.log.append(("without", prefix, list(d)))
            if prefix == "":
                # The root adds keys for a child and removes some of another child.
                d["inner.p"] = torch.full((2,), 3.0)
                d.pop("seq.1.b")
                d["seq.0.weight"] = torch.zeros(2, 3)
            if prefix == "seq.1.":
                d[prefix + "b"] = torch.full((2,), 4.0)
                d[prefix + "new"] = torch.ones(1)

        m.lin.register_load_state_dict_pre_hook(with_module)
        m.register_load_state_dict_pre_hook(with_module)
        m._register_load_state_dict_pre_hook(without)
        m.seq[1]._register_load_state_dict_pre_hook(without, with_module=False)
        m.seq[1]._register_load_state_dict_pre_hook(
            lambda mod, d, prefix, *a: ctx.log.append(("with2", prefix, list(d))),
            with_module=True,
        )
        sd = fresh(m, ctx)
        sd["lin.old_weight"] = sd.pop("lin.weight")
        sd["lin.junk"] = torch.ones(1)
        sd["junk"] = torch.ones(1)
        del sd["inner.p"]
        return m.load_state_dict(sd)

    check(net, act)


@pytest.mark.parametrize("strict", [True, False])
def test_post_hooks_edit_keys_in_place(strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        def logger(tag: str) -> Callable[..., None]:
            def hook(mod: nn.Module, inc: Any) -> None:
                ctx.log.append((tag, type(mod).__name__, type(inc).__name__,
                                list(inc.missing_keys), list(inc.unexpected_keys)))  # fmt: skip

            return hook

        def clear_missing(mod: nn.Module, inc: Any) -> None:
            inc.missing_keys.clear()

        def add_unexpected(mod: nn.Module, inc: Any) -> None:
            inc.unexpected_keys.append("from.hook")

        m.lin.register_load_state_dict_post_hook(logger("lin"))
        m.inner.register_load_state_dict_post_hook(clear_missing)
        m.inner.register_load_state_dict_post_hook(logger("inner"))
        m.seq.register_load_state_dict_post_hook(add_unexpected)
        m.register_load_state_dict_post_hook(logger("root"))
        h = m.bn.register_load_state_dict_post_hook(add_unexpected)
        h.remove()
        sd = fresh(m, ctx)
        del sd["lin.weight"], sd["inner.b"], sd["seq.0.bias"]
        sd["lin.zz"] = torch.ones(1)
        return m.load_state_dict(sd, strict=strict)

    check(net, act)


def test_post_hook_clearing_everything_allows_strict() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        def clear(mod: nn.Module, inc: Any) -> None:
            inc.missing_keys.clear()
            inc.unexpected_keys.clear()

        m.register_load_state_dict_post_hook(clear)
        sd = fresh(m, ctx)
        del sd["lin.weight"]
        sd["x.y"] = torch.ones(1)
        return m.load_state_dict(sd)

    res = check(net, act)
    assert res[0] == ("ok", "_IncompatibleKeys", [], [])


@pytest.mark.parametrize("where", ["root", "child"])
def test_post_hook_returning_value(where: str) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        target = m if where == "root" else m.inner
        target.register_load_state_dict_post_hook(lambda mod, inc: inc)
        m.seq.register_load_state_dict_post_hook(lambda mod, inc: ctx.log.append("seq"))
        return m.load_state_dict(fresh(m, ctx))

    res = check(net, act)
    assert res[0][:2] == ("raised", AssertionError)


def test_pre_hook_raising() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        def boom(*a: Any) -> None:
            raise ValueError("boom")

        m.seq[1].register_load_state_dict_pre_hook(boom)
        return m.load_state_dict(fresh(m, ctx))

    check(net, act)


def test_pre_hook_adds_error_message() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        def add_error(mod, d, prefix, meta, strict, missing, unexpected, errors):  # type: ignore[no-untyped-def]
            errors.append("custom error " + prefix)

        m.inner.register_load_state_dict_pre_hook(add_error)
        sd = fresh(m, ctx)
        del sd["lin.bias"]
        return m.load_state_dict(sd, strict=False)

    check(net, act)


# --------------------------------------------------------------------------- extra state


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("edit", ["none", "drop_extra", "extra_on_plain", "change"])
def test_extra_state(edit: str, strict: bool) -> None:
    def build(base: Base) -> nn.Module:
        return classes(base).ExtraNet()

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        ctx.log.append(list(sd))
        if edit == "drop_extra":
            del sd["a._extra_state"]
        elif edit == "extra_on_plain":
            sd["b._extra_state"] = {"count": 1}
        elif edit == "change":
            sd["a._extra_state"] = {"count": 42}
        return m.load_state_dict(sd, strict=strict)

    check(build, act)


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("strict", [True, False])
def test_parent_override_mutates_before_children(strict: bool) -> None:
    def build(base: Base) -> nn.Module:
        return classes(base).Mutating()

    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.y.log = ctx.log
        m.z.register_load_state_dict_pre_hook(
            lambda mod, d, prefix, *a: ctx.log.append(("z", prefix, list(d)))
        )
        return m.load_state_dict(fresh(m, ctx), strict=strict)

    check(build, act)


def _stashing(base: Base) -> nn.Module:
    torch.manual_seed(0)
    c = classes(base)
    m = c.Leaf()
    m.a = nn.Linear(2, 2)
    m.b = c.Inner()
    m.c = nn.Linear(2, 2)
    m.d = c.Inner()
    return m


def _stash_root(m: nn.Module, ctx: Ctx) -> dict[str, Any]:
    stash: dict[str, Any] = {}

    def keep(mod: nn.Module, d: Any, prefix: str, *a: Any) -> None:
        stash["root"] = d

    m.register_load_state_dict_pre_hook(keep)

    def log(mod: nn.Module, d: Any, prefix: str, *a: Any) -> None:
        ctx.log.append((prefix, list(d), [value(v) for v in d.values() if hasattr(v, "shape")]))

    for name in ("a", "b", "c", "d"):
        getattr(m, name).register_load_state_dict_pre_hook(log)
    return stash


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "add_for_later_sibling": lambda r: r.update(
        {"c.weight": torch.full((2, 2), 5.0), "c.new": torch.ones(1)}
    ),
    "remove_for_later_sibling": lambda r: [r.pop("c.bias"), r.pop("d.p")],
    "replace_value": lambda r: r.__setitem__("d.b", torch.full((2,), 8.0)),
    "add_for_earlier_sibling": lambda r: r.update({"a.weight": torch.zeros(2, 2)}),
    "clear": lambda r: r.clear(),
    "reorder": lambda r: [r.move_to_end("d.zz"), r.move_to_end("d.b", last=False)],
}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_child_stashes_and_mutates_parent_dict(mutation: str, strict: bool) -> None:
    """A child's hook edits the root's dict (stashed by the root's pre-hook) while the
    children load; torch builds each later child's dict from the edited one."""

    def act(m: nn.Module, ctx: Ctx) -> Any:
        stash = _stash_root(m, ctx)
        m.b.register_load_state_dict_pre_hook(lambda *a: MUTATIONS[mutation](stash["root"]))
        sd = fresh(m, ctx)
        sd["d.zz"] = torch.ones(1)
        sd["d.aa"] = torch.ones(1)
        return m.load_state_dict(sd, strict=strict)

    check(_stashing, act)


def test_override_on_child_class() -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        m = c.Leaf()
        m.x = c.Logged()
        m.y = nn.Sequential(c.Logged(), nn.Linear(2, 2))
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.x.log = ctx.log
        m.y[0].log = ctx.log
        sd = fresh(m, ctx)
        del sd["x.b"]
        sd["y.0.q"] = torch.ones(1)
        return m.load_state_dict(sd, strict=False)

    check(build, act)


# --------------------------------------------------------------------------- structure


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("edit", ["same", "different", "drop_one_alias"])
def test_shared_and_tied(edit: str, assign: bool) -> None:
    def build(base: Base) -> nn.Module:
        return classes(base).Shared()

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        ctx.log.append(list(sd))
        if edit == "different":
            sd["a.weight"] = torch.full((2, 2), 1.0)
            sd["b.0.weight"] = torch.full((2, 2), 2.0)
            sd["c.weight"] = torch.full((2, 2), 3.0)
            sd["d.weight"] = torch.full((2, 2), 4.0)
        elif edit == "drop_one_alias":
            del sd["d.weight"], sd["b.0.bias"]
        ctx.track(sd)
        r = m.load_state_dict(sd, strict=False, assign=assign)
        ctx.log.append([m.a is m.d, m.a.weight is m.c.weight, m.b[0].weight is m.a.weight])
        return r

    check(build, act)


@pytest.mark.parametrize("strict", [True, False])
def test_none_children_and_params(strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.seq._modules["2"] = None
        sd = fresh(m, ctx)
        sd["empty.weight"] = torch.ones(1)
        sd["inner.none_p"] = torch.ones(1)
        sd["inner.none_b"] = torch.ones(1)
        sd["seq.2.x"] = torch.ones(1)
        return m.load_state_dict(sd, strict=strict)

    check(net, act)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("key", [1, ("lin", "weight"), None, 2.5], ids=repr)
@pytest.mark.parametrize("where", ["first", "last"])
def test_non_string_keys(key: Any, where: str, strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        sd[key] = torch.ones(1)
        if where == "first":
            sd.move_to_end(key, last=False)
        ctx.track(sd)
        return m.load_state_dict(sd, strict=strict)

    check(net, act)


@pytest.mark.parametrize("strict", [True, False])
def test_non_string_key_added_for_child_by_hook(strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        m.seq.register_load_state_dict_pre_hook(lambda mod, d, *a: d.__setitem__(7, torch.ones(1)))
        return m.load_state_dict(fresh(m, ctx), strict=strict)

    check(net, act)


class Key(str):
    """A ``str`` subclass key (torch's scan uses its ``startswith``)."""


class Odd(str):
    def startswith(self, *a: Any) -> bool:  # type: ignore[override]
        return True


@pytest.mark.parametrize("cls", [Key, Odd])
@pytest.mark.parametrize("strict", [True, False])
def test_str_subclass_keys(cls: type, strict: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        sd[cls("inner.p")] = sd.pop("inner.p") + 1
        sd[cls("seq.zz")] = torch.ones(1)
        ctx.track(sd)
        return m.load_state_dict(sd, strict=strict)

    check(net, act)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("edit", ["none", "drop", "extra"])
def test_dotted_child_name(edit: str, strict: bool) -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        m = c.Leaf()
        m.a = c.Inner()
        m._modules["a.b"] = nn.Linear(2, 2)
        m._modules["a.b.c"] = c.Inner()
        m._modules[""] = nn.Linear(2, 2)
        m.z = nn.Linear(2, 2)
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m)
        ctx.log.append(list(sd))
        if edit == "drop":
            del sd["a.b.weight"], sd["a.b.c.p"]
        elif edit == "extra":
            sd["a.b.zz"] = torch.ones(1)
            sd["a.x"] = torch.ones(1)
        ctx.track(sd)
        return m.load_state_dict(sd, strict=strict)

    check(build, act)


@pytest.mark.parametrize("change", ["replace", "to_none", "swap_in_dotted", "swap_in_plain"])
def test_children_changed_while_loading(change: str) -> None:
    """A child's hook edits its parent's ``_modules`` (same size: iteration goes on)."""

    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        m = c.Leaf()
        m.x = nn.Linear(2, 2)
        m.y = nn.Linear(2, 2)
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        new = nn.Linear(2, 2)

        def hook(*a: Any) -> None:
            if change == "replace":
                m._modules["y"] = new
            elif change == "to_none":
                m._modules["y"] = None
            else:
                del m._modules["y"]
                m._modules["a.b" if change == "swap_in_dotted" else "w"] = new

        m.x.register_load_state_dict_pre_hook(hook)
        sd = fresh(m)
        sd["a.b.weight"] = torch.zeros(2, 2)
        sd["a.b.bias"] = torch.zeros(2)
        sd["w.weight"] = torch.zeros(2, 2)
        ctx.track(sd)
        return m.load_state_dict(sd, strict=False)

    check(build, act)


@pytest.mark.parametrize("assign", [False, True])
def test_scalar_backward_compat_and_meta(assign: bool) -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        m = c.Scalar()
        m.meta = nn.Linear(2, 2, device="meta")
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = ctx.track(
            {"s": torch.tensor([4.0]), "t": torch.tensor([5.0, 6.0]),
             "meta.weight": torch.ones(2, 2), "meta.bias": torch.ones(2)}
        )  # fmt: skip
        return m.load_state_dict(sd, strict=False, assign=assign)

    check(build, act)


@pytest.mark.parametrize("assign", [False, True])
def test_swap_tensors_future(assign: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        old = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            sd = fresh(m, ctx)
            sd["lin.bias"] = sd["lin.bias"].double()
            return m.load_state_dict(sd, assign=assign)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(old)

    check(net, act)


def test_mixed_stock_root_with_custom_children() -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        return nn.Sequential(c.Net(), nn.ModuleList([c.Inner(), nn.Linear(2, 2)]))

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        del sd["1.0.p"]
        sd["0.lin.x"] = torch.ones(1)
        return m.load_state_dict(sd, strict=False)

    check(build, act)


# --------------------------------------------------------------------------- calling


CALLS: dict[str, Callable[[nn.Module, Any], Any]] = {
    "positional": lambda m, sd: m.load_state_dict(sd, False),
    "positional3": lambda m, sd: m.load_state_dict(sd, False, True),
    "keywords": lambda m, sd: m.load_state_dict(state_dict=sd, strict=False, assign=True),
    "truthy": lambda m, sd: m.load_state_dict(sd, strict=0, assign=1),
    "bad_keyword": lambda m, sd: m.load_state_dict(sd, stict=False),
    "no_args": lambda m, sd: m.load_state_dict(),
    "too_many": lambda m, sd: m.load_state_dict(sd, True, False, None),
    "twice": lambda m, sd: m.load_state_dict(sd, state_dict=sd),
    "unbound_stock": lambda m, sd: nn.Module.load_state_dict(m, sd, strict=False),
    "via_class": lambda m, sd: type(m).load_state_dict(m, sd, False),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_calling_conventions(call: str) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        del sd["inner.b"]
        sd["q"] = torch.ones(1)
        return CALLS[call](m, sd)

    check(net, act)


@pytest.mark.parametrize("call", list(CALLS))
def test_patched_torch_load_state_dict(call: str) -> None:
    """A recorder replacing ``torch.nn.Module.load_state_dict`` sees the caller's
    exact arguments (and runs the original)."""
    original = torch.nn.Module.__dict__["load_state_dict"]

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        del sd["inner.b"]

        def label(x: Any) -> Any:
            return "sd" if x is sd else "self" if x is m else repr(x)

        def recorder(self: Any, *args: Any, **kwargs: Any) -> Any:
            ctx.log.append(("recorded", label(self), [label(a) for a in args],
                            {k: label(v) for k, v in kwargs.items()}))  # fmt: skip
            return original(self, *args, **kwargs)

        torch.nn.Module.load_state_dict = recorder  # type: ignore[method-assign]
        try:
            return CALLS[call](m, sd)
        finally:
            torch.nn.Module.load_state_dict = original  # type: ignore[method-assign]

    check(net, act)
    assert torch.nn.Module.__dict__["load_state_dict"] is original


# --------------------------------------------------------------------------- random trees

# Non-ASCII names and keys take the loader's other path for splitting keys by child.
NAMES = ["0", "_x", "T", "a", "w1", "é", "aé"]
SHAPES = [(), (1,), (2,), (2, 3)]


def entry(depth: int) -> st.SearchStrategy[Any]:
    leaves: list[st.SearchStrategy[Any]] = [
        st.tuples(st.just("param"), st.sampled_from(SHAPES), st.booleans()),
        st.tuples(st.just("buffer"), st.sampled_from(SHAPES), st.booleans()),
        st.just(("none_param",)),
        st.just(("none_buffer",)),
        st.just(("none_child",)),
        st.tuples(st.just("tied"), st.integers(0, 50)),
        st.tuples(st.just("shared"), st.integers(0, 50)),
        st.just(("linear",)),
        st.just(("bn",)),
    ]
    if depth < 3:
        leaves.append(st.tuples(st.just("child"), node(depth + 1)))
    return st.one_of(*leaves)


@st.composite
def node(draw: st.DrawFn, depth: int = 1) -> Any:
    kinds = ["custom", "custom", "seq", "mlist"] + (["linear", "bn"] if depth > 1 else [])
    kind = draw(st.sampled_from(kinds))
    if kind in ("linear", "bn"):
        return (kind,)
    if depth >= 3 and kind in ("seq", "mlist"):
        return ("custom", [])
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, min_size=depth == 1, max_size=4))
    entries = [(n, draw(entry(depth))) for n in names]
    if kind == "custom":
        return ("custom", entries)
    mods = [e for _, e in entries if e[0] in ("linear", "bn", "child", "shared")]
    return (kind, mods)


def build_tree(base: Base, spec: Any) -> nn.Module:
    torch.manual_seed(0)
    made: list[nn.Module] = []
    params: list[nn.Parameter] = []
    Leaf = classes(base).Leaf

    def module_of(e: Any) -> nn.Module | None:
        if e[0] == "linear":
            m: nn.Module = nn.Linear(2, 2)
            params.extend(m.parameters())
        elif e[0] == "bn":
            m = nn.BatchNorm1d(2)
            params.extend(m.parameters())
        elif e[0] == "child":
            m = make(e[1])
        elif e[0] == "shared":
            m = made[e[1] % len(made)] if made else nn.Linear(2, 2)
        else:
            m = make(e)
        made.append(m)
        return m

    def make(spec: Any) -> nn.Module:
        kind, entries = spec[0], spec[1] if len(spec) > 1 else []
        if kind in ("linear", "bn"):
            return module_of(spec)  # type: ignore[return-value]
        if kind == "seq":
            return nn.Sequential(*[module_of(e) for e in entries])
        if kind == "mlist":
            return nn.ModuleList([module_of(e) for e in entries])
        m = Leaf()
        for name, e in entries:
            tag = e[0]
            if tag == "param":
                p = nn.Parameter(torch.randn(e[1]), requires_grad=e[2])
                params.append(p)
                m._parameters[name] = p
            elif tag == "buffer":
                m._buffers[name] = torch.randn(e[1])
                if not e[2]:
                    m._non_persistent_buffers_set.add(name)
            elif tag == "none_param":
                m._parameters[name] = None
            elif tag == "none_buffer":
                m._buffers[name] = None
            elif tag == "none_child":
                m._modules[name] = None
            elif tag == "tied":
                m._parameters[name] = (
                    params[e[1] % len(params)] if params else nn.Parameter(torch.randn(2))
                )
            else:
                m._modules[name] = module_of(e)
        return m

    return make(spec)


op = st.one_of(
    st.tuples(st.just("drop"), st.integers(0, 99)),
    st.tuples(
        st.just("add"), st.integers(0, 99), st.sampled_from(["", ".x", ".0.y", "T", ".é", "é.z"])
    ),
    st.tuples(st.just("rename"), st.integers(0, 99), st.sampled_from(["_x", "0", "weight", "ü"])),
    st.tuples(st.just("reshape"), st.integers(0, 99)),
    st.tuples(st.just("dtype"), st.integers(0, 99)),
    st.tuples(st.just("nontensor"), st.integers(0, 99)),
    st.tuples(st.just("old_version"), st.integers(0, 99)),
)


def perturb(sd: OrderedDict, ops: list[Any]) -> None:
    for o in ops:
        keys = list(sd)
        if not keys:
            k = ""
        else:
            k = keys[o[1] % len(keys)]
        if o[0] == "drop" and keys:
            del sd[k]
        elif o[0] == "add":
            sd[k.rpartition(".")[0] + o[2] + ".added" if k else "added" + o[2]] = torch.ones(2)
        elif o[0] == "rename" and keys:
            head = k.rpartition(".")[0]
            sd[(head + "." if head else "") + o[2]] = sd.pop(k)
        elif o[0] == "reshape" and keys:
            sd[k] = torch.full((3,), 7.0)
        elif o[0] == "dtype" and keys and isinstance(sd[k], torch.Tensor):
            sd[k] = sd[k].double() * 2
        elif o[0] == "nontensor" and keys:
            sd[k] = 1.25
        elif o[0] == "old_version":
            meta = sd._metadata  # type: ignore[attr-defined]
            prefixes = list(meta)
            if prefixes:
                meta[prefixes[o[1] % len(prefixes)]]["version"] = 1


@settings(max_examples=200, deadline=None)
@given(
    spec=node(),
    ops=st.lists(op, max_size=5),
    strict=st.booleans(),
    assign=st.booleans(),
    keep_meta=st.booleans(),
)
def test_random_trees(
    spec: Any, ops: list[Any], strict: bool, assign: bool, keep_meta: bool
) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        # Two exact loads first: the load under test may replay their recording.
        warm = [describe(outcome(lambda: m.load_state_dict(fresh(m, ctx, s)))) for s in (1, 2)]
        sd = fresh(m)
        perturb(sd, ops)
        if not keep_meta:
            sd = OrderedDict(sd)
        ctx.track(sd)
        return warm, describe(outcome(lambda: m.load_state_dict(sd, strict=strict, assign=assign)))

    check(lambda base: build_tree(base, spec), act)


# --------------------------------------------------------------------------- wide


@pytest.mark.parametrize("strict", [True, False])
def test_wide_tree(strict: bool) -> None:
    def build(base: Base) -> nn.Module:
        torch.manual_seed(0)
        c = classes(base)
        m = c.Leaf()
        for i in range(1000):
            m.add_module(f"c{i}", nn.Linear(2, 2) if i % 3 else c.Inner())
        m.add_module("bn", nn.BatchNorm1d(2))
        return m

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        for i in range(0, 1000, 97):
            sd.pop(f"c{i}.p", None)
            sd.pop(f"c{i}.bias", None)
        for i in range(0, 1000, 89):
            sd[f"c{i}.extra"] = torch.ones(1)
        sd["c5.weight"] = torch.ones(3, 3)
        sd["c1000.weight"] = torch.ones(1)
        return m.load_state_dict(sd, strict=strict)

    check(build, act)
