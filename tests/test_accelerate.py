"""``fastmodule.accelerate`` / ``restore`` / ``install``: stock modules made fast in place.

Acceleration is per class and process-wide, so every scenario is measured on the
stock classes first (the oracle), then on an identically seeded tree after
``accelerate``, and the two observations are compared exactly. Every test restores
what it accelerated; an autouse fixture fails any test that leaves a class
accelerated, so later stock oracles never silently run accelerated code.

torch's whole-tree methods reach the native bodies through a statement put in
front of torch's code (``fastmodule._verified.inline_routes``) and, on CPython 3.11 for
calls made from C, through their vectorcall entry point. Scenarios call them
both directly and through :func:`via_c` (a ``functools.partial`` call, made
from C).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import pickle
import re
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE, LogFunctions, LogOps, outcome

M = TypeVar("M", bound=nn.Module)
Accel = Callable[[M], M]


# --------------------------------------------------------------------------- bookkeeping


def torch_module_classes() -> list[type[nn.Module]]:
    """``torch.nn.Module`` and every subclass in the process, fastmodule's own excluded."""
    out: list[type[nn.Module]] = [nn.Module]
    seen: set[type] = {nn.Module}
    stack: list[type] = [nn.Module]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                if not issubclass(sub, fastmodule.Module):
                    out.append(sub)
    return out


def left_accelerated() -> list[type[nn.Module]]:
    """Classes that are accelerated in place, or still carry native call/getattr slots."""
    return [
        cls
        for cls in torch_module_classes()
        if _core.is_accelerated_class(cls) or fastmodule.slots_of(cls)[:2] != (False, False)
    ]


def restore_everything() -> list[type[nn.Module]]:
    """Undo ``install`` and every in-place acceleration; returns what was left over."""
    left = left_accelerated()
    fastmodule.uninstall()
    for cls in left:
        _core.restore_class(cls)
    return left


@contextlib.contextmanager
def no_leftovers() -> Iterator[None]:
    """Require a clean process around the block; after it, clean up and fail on leftovers."""
    assert not fastmodule.installed(), "fastmodule.install() in effect before the test"
    assert left_accelerated() == [], "classes accelerated before the test"
    try:
        yield
    finally:
        was_installed = fastmodule.installed()
        left = restore_everything()
    if was_installed or left:
        names = [cls.__qualname__ for cls in left]
        pytest.fail(
            f"test left acceleration behind: installed={was_installed}, "
            f"{len(names)} classes: {names[:10]}"
        )


@contextlib.contextmanager
def accelerating() -> Iterator[Accel[Any]]:
    """``fastmodule.accelerate``, with every class it reached restored on exit."""
    models: list[nn.Module] = []
    classes: dict[type, None] = {}

    def go(model: M) -> M:
        models.append(model)
        if isinstance(model, nn.Module):
            for m in nn.Module.modules(model):
                classes.setdefault(type(m), None)
        return fastmodule.accelerate(model)

    try:
        yield go
    finally:
        try:
            for model in models:
                fastmodule.restore(model)
        finally:
            fastmodule.uninstall()
            # (Where no native path is on, accelerate() changed no class.)
            for cls in classes if NATIVE else ():
                _core.restore_class(cls)


@pytest.fixture(autouse=True)
def _nothing_left_accelerated() -> Iterator[None]:
    """Fail (after cleaning up) any test that leaves a module class accelerated."""
    with no_leftovers():
        yield


@pytest.fixture
def accel() -> Iterator[Accel[Any]]:
    """``fastmodule.accelerate``, with every class it reached restored at teardown."""
    with accelerating() as go:
        yield go


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# --------------------------------------------------------------------------- helpers


def via_c(name: str, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module.<name>(*args, **kwargs)``, called from C (where 3.11 routes it natively)."""
    return functools.partial(getattr(type(module), name), module, *args, **kwargs)()


def same(got: Any, expected: Any, path: str = "") -> None:
    """Assert ``got`` equals ``expected`` exactly, recursing into containers.

    Tensors must agree in Python type, dtype, shape, ``requires_grad``, grad_fn kind
    and every value (NaN equal to NaN).
    """
    assert type(got) is type(expected), f"{path}: {type(got)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert got.requires_grad == expected.requires_grad, path
        assert type(got.grad_fn).__name__ == type(expected.grad_fn).__name__, path
        assert got.dtype == expected.dtype and got.shape == expected.shape, path
        torch.testing.assert_close(
            got.detach(), expected.detach(), rtol=0, atol=0, equal_nan=True, msg=path
        )
    elif isinstance(expected, dict):
        assert list(got) == list(expected), path
        for k in expected:
            same(got[k], expected[k], f"{path}[{k!r}]")
        if hasattr(expected, "_metadata"):
            assert got._metadata == expected._metadata, f"{path}._metadata"
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected), path
        if hasattr(expected, "_fields"):
            assert got._fields == expected._fields, path
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            same(g, e, f"{path}[{i}]")
    else:
        assert got == expected, path


def compare(
    build: Callable[[], nn.Module],
    scenario: Callable[[nn.Module], Any],
    accel: Accel[Any],
) -> Any:
    """Run ``scenario`` on a stock tree, then on an identically seeded accelerated one.

    Both trees are built before anything is accelerated; the observation (value, or
    exception type and text, and the warnings) of the accelerated run must equal the
    stock one. Returns the stock outcome.
    """
    torch.manual_seed(0)
    stock_model = build()
    torch.manual_seed(0)
    fast_model = build()
    torch.manual_seed(1)
    expected = observed(lambda: scenario(stock_model))
    accel(fast_model)
    # Where no native path is on, accelerate() changes nothing: both runs are stock's.
    assert all(fastmodule.is_accelerated(m) for m in nn.Module.modules(fast_model)) is NATIVE
    torch.manual_seed(1)
    got = observed(lambda: scenario(fast_model))
    same(got, expected)
    return expected[0]


def observed(fn: Callable[[], Any]) -> tuple[Any, list[tuple[type, str]]]:
    """``outcome(fn)`` and the warnings it emitted (category and text, every one).

    libtorch's ``TORCH_WARN_ONCE`` warnings ("Triggered internally") fire once per
    process, so only the stock run would see them; they are left out.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = outcome(fn)
    return result, [
        (w.category, str(w.message)) for w in caught if "Triggered internally" not in str(w.message)
    ]


def class_dict(cls: type) -> dict[str, int]:
    """A class's dict, by name and identity of each value."""
    return {k: id(v) for k, v in cls.__dict__.items()}


# --------------------------------------------------------------------------- models


class Mixed(nn.Module):
    """A user class over torch leaves and containers, with a shared child and buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3))
        self.heads = nn.ModuleList([nn.Linear(8, 4), nn.Linear(8, 4)])
        self.extra = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Identity()})
        self.shared = self.heads[0]
        self.register_buffer("scale", torch.tensor(1.5))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)
        self.plain = 3

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.emb(tokens))
        h = self.norm(h)[:, -1] * self.scale
        h = self.body(h)
        h = self.heads[0](h) + self.heads[1](h) + self.shared(h)
        return self.extra["b"](self.extra["a"](h))


def tokens() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 16, (5, 6), generator=g)


def small() -> nn.Module:
    """Only torch classes, so a fresh interpreter can unpickle it without this file."""
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 3))


def x_in(rows: int = 3, cols: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(4321)
    return torch.randn(rows, cols, generator=g)


def grads_by_name(model: nn.Module) -> dict[str, Any]:
    return {
        k: None if p.grad is None else p.grad.clone()
        for k, p in nn.Module.named_parameters(model, remove_duplicate=False)
    }


def flags(model: nn.Module) -> list[tuple[str, bool]]:
    return [(k, m.training) for k, m in nn.Module.named_modules(model, remove_duplicate=False)]


def dtypes(model: nn.Module) -> list[tuple[str, torch.dtype]]:
    return [(k, t.dtype) for k, t in model.state_dict(keep_vars=True).items()]


# --------------------------------------------------------------------------- API


def test_accelerate_returns_model_idempotent_and_restores(accel: Accel[Any]) -> None:
    model = Mixed()
    assert not fastmodule.is_accelerated(model)
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())
    assert accel(model) is model
    assert accel(model) is model
    # (Where no native path is on, accelerate() changes nothing and returns the model.)
    assert all(fastmodule.is_accelerated(m) for m in model.modules()) is NATIVE
    assert fastmodule.is_accelerated(nn.Linear(2, 2)) is NATIVE, "per class: a new Linear too"
    assert not fastmodule.is_accelerated(nn.Conv1d(1, 1, 1)), "classes outside the tree stay"
    assert fastmodule.restore(model) is model
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())
    assert fastmodule.restore(model) is model
    assert left_accelerated() == []


@pytest.mark.requires_native("accelerate()'s rollback when the core fails on a class")
def test_failed_accelerate_restores_what_it_did(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small()
    real = _core.accelerate_class
    done: list[type] = []

    def flaky(cls: type) -> Any:
        if cls is nn.ReLU:
            raise RuntimeError("boom")
        done.append(cls)
        return real(cls)

    monkeypatch.setattr(_core, "accelerate_class", flaky)
    assert outcome(lambda: fastmodule.accelerate(model)) == ("raised", RuntimeError, "boom")
    assert done == [nn.Sequential, nn.Linear, nn.LayerNorm]
    assert left_accelerated() == []
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())


def test_is_accelerated_of_non_modules_and_fastmodule() -> None:
    assert fastmodule.is_accelerated(3) is False
    assert fastmodule.is_accelerated(nn.Linear) is False
    assert fastmodule.is_accelerated(nn.Linear(1, 1)) is False

    class Fast(fastmodule.Module):
        pass

    fast = Fast()
    # Where no native path is on, nothing is: fastmodule.Module runs torch's code.
    assert fastmodule.is_accelerated(fast) is NATIVE
    fastmodule.restore(fast)
    assert fastmodule.is_accelerated(fast) is NATIVE, "fastmodule.Module subclasses stay fast"


@pytest.mark.parametrize(
    ("arg", "name"),
    [(3, "int"), (nn.Linear, "type"), (None, "NoneType"), ([nn.Linear(1, 1)], "list")],
)
def test_non_module_type_error(arg: Any, name: str) -> None:
    for fn in ("accelerate", "restore"):
        got = outcome(lambda fn=fn: getattr(fastmodule, fn)(arg))
        assert got == ("raised", TypeError, f"{fn}() expects a torch.nn.Module, got {name}")
    assert left_accelerated() == []


def test_classes_keep_identity_dict_and_mro(accel: Accel[Any]) -> None:
    model = Mixed()
    classes = {type(m) for m in model.modules()} | {nn.Module}
    before = {cls: (class_dict(cls), cls.__mro__, cls.__name__) for cls in classes}
    lin = model.body[0]
    accel(model)
    assert type(lin) is nn.Linear
    assert type(model.heads) is nn.ModuleList and type(model) is Mixed
    for cls in classes:
        assert (class_dict(cls), cls.__mro__, cls.__name__) == before[cls], cls
    assert set(lin.__dict__) == set(nn.Linear(8, 8).__dict__)


def test_repr_unchanged(accel: Accel[Any]) -> None:
    model = Mixed()
    expected = [repr(model), str(model), model.extra_repr(), repr(model.body[0])]
    accel(model)
    assert [repr(model), str(model), model.extra_repr(), repr(model.body[0])] == expected


def test_pickle_bytes_unchanged(accel: Accel[Any]) -> None:
    model = small()
    expected = pickle.dumps(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    accel(model)
    assert pickle.dumps(model) == expected
    again = io.BytesIO()
    torch.save(model, again)
    assert again.getvalue() == buf.getvalue()


LOAD_IN_FRESH_INTERPRETER = textwrap.dedent(
    """
    import pickle, sys
    import torch
    saved, pickled, out = sys.argv[1:4]
    a = torch.load(saved, weights_only=False)
    with open(pickled, "rb") as f:
        b = pickle.load(f)
    assert "fastmodule" not in sys.modules, "fastmodule was imported"
    x = torch.arange(12.0).reshape(3, 4)
    torch.save(
        {
            "a": a.eval()(x).detach(),
            "b": b.eval()(x).detach(),
            "sd": a.state_dict(),
            "types": [f"{type(m).__module__}.{type(m).__qualname__}" for m in b.modules()],
        },
        out,
    )
    """
)


def test_saved_accelerated_model_loads_without_fastmodule(
    accel: Accel[Any], tmp_path: Path
) -> None:
    model = small().eval()
    x = torch.arange(12.0).reshape(3, 4)
    expected = {
        "a": model(x).detach(),
        "b": model(x).detach(),
        "sd": model.state_dict(),
        "types": [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()],
    }
    accel(model)
    torch.save(model, tmp_path / "model.pt")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps(model))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_IN_FRESH_INTERPRETER,
            str(tmp_path / "model.pt"),
            str(tmp_path / "model.pkl"),
            str(tmp_path / "out.pt"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    same(got, expected)


def test_deepcopy(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        clone = copy.deepcopy(model)
        assert clone is not model and fastmodule.is_accelerated(clone) == (
            fastmodule.is_accelerated(model)
        )
        assert clone.shared is clone.heads[0]
        clone.eval()
        return repr(clone), clone.state_dict(), clone(tokens()), flags(clone), clone.plain

    compare(Mixed, scenario, accel)


def test_quantize_dynamic(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        model.eval()
        q = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        types = [(k, type(m)) for k, m in q.named_modules()]
        return repr(q), types, q(x_in()), list(q.state_dict())

    expected = compare(small, scenario, accel)
    assert any("quantized" in t.__module__ for _, t in expected[1][1])


# --------------------------------------------------------------------------- mixed tree


def observe_walks(model: nn.Module) -> dict[str, Any]:
    """Names of every walk, called directly and from C."""
    out: dict[str, Any] = {}
    for call in ("direct", "c"):

        def run(name: str, *args: Any, call: str = call, **kwargs: Any) -> Any:
            if call == "c":
                return via_c(name, model, *args, **kwargs)
            return getattr(model, name)(*args, **kwargs)

        for rd in (True, False):
            out[call, "modules", rd] = [
                (k, type(m).__name__)
                for k, m in run("named_modules", prefix="p", remove_duplicate=rd)
            ]
            out[call, "params", rd] = [k for k, _ in run("named_parameters", remove_duplicate=rd)]
            out[call, "buffers", rd] = [k for k, _ in run("named_buffers", remove_duplicate=rd)]
        out[call, "children"] = [k for k, _ in run("named_children")]
        out[call, "params_local"] = [k for k, _ in run("named_parameters", recurse=False)]
        out[call, "n_params"] = len(list(run("parameters")))
        out[call, "n_modules"] = len(list(run("modules")))
        out[call, "n_buffers"] = len(list(run("buffers")))
        out[call, "n_children"] = len(list(run("children")))
    return out


def test_mixed_walks(accel: Accel[Any]) -> None:
    compare(Mixed, observe_walks, accel)


def test_mixed_forward_backward_train_eval(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        out: dict[str, Any] = {}
        out["eval_ret"] = model.eval() is model
        out["eval_flags"] = flags(model)
        out["eval"] = model(tokens())
        out["train_ret"] = model.train() is model
        out["train_flags"] = flags(model)
        torch.manual_seed(7)
        y = model(tokens())
        out["train"] = y
        y.pow(2).sum().backward()
        out["grads"] = grads_by_name(model)
        out["state_after_train"] = model.state_dict()
        via_c("train", model, False)
        out["c_eval_flags"] = flags(model)
        via_c("train", model.body, True)
        out["c_partial_flags"] = flags(model)
        out["c_partial_out"] = model(tokens())
        via_c("train", model)
        torch.manual_seed(7)
        out["c_train"] = model(tokens())
        out["train_bad"] = outcome(lambda: model.train(3))
        out["c_train_bad"] = outcome(lambda: via_c("train", model, 3))
        return out

    compare(Mixed, scenario, accel)


def test_mixed_zero_grad_requires_grad(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        out: dict[str, Any] = {}
        model(tokens()).sum().backward()
        model.zero_grad(set_to_none=False)
        out["zeroed"] = grads_by_name(model)
        model.zero_grad()
        out["none"] = grads_by_name(model)
        model(tokens()).sum().backward()
        via_c("zero_grad", model, False)
        out["c_zeroed"] = grads_by_name(model)
        via_c("zero_grad", model)
        out["c_none"] = grads_by_name(model)
        model.requires_grad_(False)
        out["rg_off"] = [(k, p.requires_grad) for k, p in model.named_parameters()]
        via_c("requires_grad_", model.body)
        out["rg_c"] = [(k, p.requires_grad) for k, p in model.named_parameters()]
        out["out"] = model(tokens())
        seen: list[str] = []
        out["apply_ret"] = via_c("apply", model, lambda m: seen.append(type(m).__name__)) is model
        model.apply(lambda m: seen.append(type(m).__name__))
        out["apply"] = seen
        return out

    compare(Mixed, scenario, accel)


def test_mixed_state_dict(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        model.eval()
        return {
            "sd": model.state_dict(),
            "c_sd": via_c("state_dict", model),
            "prefix": model.state_dict(prefix="root."),
            "c_prefix": via_c("state_dict", model, prefix="root.", keep_vars=True),
            "keep_vars": model.state_dict(keep_vars=True),
            "child": model.body.state_dict(),
            "c_child": via_c("state_dict", model.heads),
            "positional": outcome(lambda: model.state_dict(None, "x.")),
        }

    compare(Mixed, scenario, accel)


def test_mixed_load_state_dict(accel: Accel[Any]) -> None:
    torch.manual_seed(99)
    source = Mixed()
    source(tokens())  # move the BatchNorm running stats
    good = source.state_dict()
    bad = dict(good)
    bad["bogus.weight"] = torch.zeros(1)
    del bad["norm.bias"]
    wrong_shape = dict(good)
    wrong_shape["body.0.weight"] = torch.zeros(3, 3)

    def scenario(model: nn.Module) -> Any:
        out: dict[str, Any] = {}
        out["strict_bad"] = outcome(lambda: model.load_state_dict(bad))
        out["c_strict_bad"] = outcome(lambda: via_c("load_state_dict", model, bad))
        out["shape"] = outcome(lambda: model.load_state_dict(wrong_shape, strict=False))
        out["c_shape"] = outcome(lambda: via_c("load_state_dict", model, wrong_shape))
        out["after_errors"] = model.state_dict()
        out["lax"] = tuple(model.load_state_dict(bad, strict=False))
        out["c_lax"] = tuple(via_c("load_state_dict", model, bad, strict=False))
        out["ok"] = tuple(model.load_state_dict(good))
        out["loaded"] = model.state_dict()
        out["c_ok"] = tuple(via_c("load_state_dict", model, good, assign=True))
        out["assigned"] = model.state_dict(keep_vars=True)
        out["same_objects"] = [
            model.state_dict(keep_vars=True)[k] is v for k, v in good.items() if k in good
        ]
        out["out"] = model.eval()(tokens())
        out["not_mapping"] = outcome(lambda: model.load_state_dict([1]))
        return out

    compare(Mixed, scenario, accel)


def test_mixed_conversions(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        model.eval()
        out: dict[str, Any] = {}
        out["double_ret"] = model.double() is model
        out["double"] = dtypes(model)
        out["double_out"] = model(tokens())
        out["half"] = dtypes(model.half())
        out["to64"] = dtypes(model.to(torch.float64))
        out["to64_out"] = model(tokens())
        out["float"] = dtypes(model.float())
        via_c("_apply", model, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
        out["c_bf16"] = dtypes(model)
        via_c("to", model, torch.float32)
        out["c_to32"] = dtypes(model)
        out["out"] = model(tokens())
        out["to_bad"] = outcome(lambda: model.to(torch.int64))
        out["grads"] = grads_by_name(model)
        out["sd"] = model.state_dict()
        return out

    compare(Mixed, scenario, accel)


def test_mixed_paths(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        out: dict[str, Any] = {}
        for name in ("get_submodule", "get_parameter", "get_buffer"):
            for target in ("", "body.0", "body.0.weight", "scale", "scratch", "nope", "body.9"):
                for call in ("direct", "c"):

                    def get(name: str = name, target: str = target, call: str = call) -> Any:
                        if call == "c":
                            got = via_c(name, model, target)
                        else:
                            got = getattr(model, name)(target)
                        return type(got).__name__, getattr(got, "shape", None)

                    out[name, target, call] = outcome(get)
        out["set"] = outcome(lambda: model.set_submodule("body.2", nn.Tanh()))
        out["set_bad"] = outcome(lambda: model.set_submodule("nope.x", nn.Tanh()))
        out["modules"] = [(k, type(m).__name__) for k, m in model.named_modules()]
        return out

    compare(Mixed, scenario, accel)


HOOK_KINDS = ("pre", "pre_kw", "fwd", "fwd_kw", "always", "bwd", "bwd_pre")


def register_hooks(model: nn.Module, log: list[Any]) -> list[Any]:
    """Hooks of every kind on the root and some children, each logging its firing."""
    handles = []

    def tag(t: Any) -> Any:
        return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__

    for name, m in [("root", model), ("lin", model.body[0]), ("head1", model.heads[1])]:
        handles.append(m.register_forward_pre_hook(lambda m, a, n=name: log.append((n, "pre"))))
        handles.append(
            m.register_forward_pre_hook(
                lambda m, a, k, n=name: log.append((n, "pre_kw", sorted(k))),
                with_kwargs=True,
                prepend=True,
            )
        )
        handles.append(
            m.register_forward_hook(lambda m, a, o, n=name: log.append((n, "fwd", tag(o))))
        )
        handles.append(
            m.register_forward_hook(
                lambda m, a, k, o, n=name: log.append((n, "fwd_kw", tag(o))),
                with_kwargs=True,
                prepend=True,
            )
        )
        handles.append(
            m.register_forward_hook(
                lambda m, a, o, n=name: log.append((n, "always")), always_call=True
            )
        )
    lin = model.body[0]
    handles.append(
        lin.register_full_backward_hook(
            lambda m, gi, go: log.append(("lin", "bwd", [tag(g) for g in go]))
        )
    )
    handles.append(
        lin.register_full_backward_pre_hook(lambda m, go: log.append(("lin", "bwd_pre")))
    )
    # hooks that change values
    handles.append(model.heads[1].register_forward_hook(lambda m, a, o: o * 2))
    handles.append(model.norm.register_forward_pre_hook(lambda m, a: (a[0] + 1,)))
    handles.append(
        model.register_state_dict_pre_hook(lambda m, prefix, keep_vars: log.append(("sd_pre",)))
    )
    handles.append(
        model.register_state_dict_post_hook(
            lambda m, sd, prefix, local: log.append(("sd_post", len(sd)))
        )
    )
    handles.append(
        model.norm.register_load_state_dict_pre_hook(
            lambda m, sd, prefix, *a: log.append(("lpre",))
        )
    )
    handles.append(
        model.register_load_state_dict_post_hook(
            lambda m, keys: log.append(("lpost", list(keys.missing_keys)))
        )
    )
    return handles


def test_mixed_hooks(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        log: list[Any] = []
        gpre = nn.modules.module.register_module_forward_pre_hook(
            lambda m, a: log.append(("global_pre", type(m).__name__))
        )
        gfwd = nn.modules.module.register_module_forward_hook(
            lambda m, a, o: log.append(("global_fwd", type(m).__name__))
        )
        handles = register_hooks(model, log)
        try:
            model.eval()
            out = {"eval": model(tokens())}
            model.train()
            torch.manual_seed(3)
            y = model(tokens())
            y.sum().backward()
            out["train"] = y
            out["grads"] = grads_by_name(model)
            out["sd"] = model.state_dict()
            out["c_sd"] = via_c("state_dict", model)
            out["load"] = tuple(model.load_state_dict(out["sd"]))
            out["c_load"] = tuple(via_c("load_state_dict", model, out["sd"]))
        finally:
            gpre.remove()
            gfwd.remove()
        for h in handles[::2]:
            h.remove()
        out["removed"] = model.eval()(tokens())
        out["log"] = log
        return out

    compare(Mixed, scenario, accel)


class Plain(nn.Module):
    """A module that sets attributes before ``__init__`` when asked to."""

    def __init__(self, early: str | None = None) -> None:
        if early == "param":
            self.p = nn.Parameter(torch.zeros(1))
        elif early == "module":
            self.c = nn.Linear(1, 1)
        elif early == "buffer":
            self.register_buffer("b", torch.zeros(1))
        elif early == "plain":
            self.x = 1
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.bn = nn.BatchNorm1d(2)
        self.register_buffer("buf", torch.ones(1))


REGISTRATION: dict[str, Callable[[Plain], Any]] = {
    "buffer_dot": lambda m: m.register_buffer("a.b", torch.zeros(1)),
    "buffer_empty": lambda m: m.register_buffer("", torch.zeros(1)),
    "buffer_exists": lambda m: m.register_buffer("lin", torch.zeros(1)),
    "buffer_attr": lambda m: m.register_buffer("training", torch.zeros(1)),
    "buffer_type": lambda m: m.register_buffer("x", 3),
    "buffer_name_type": lambda m: m.register_buffer(3, torch.zeros(1)),
    "buffer_none": lambda m: m.register_buffer("none", None),
    "buffer_replace": lambda m: m.register_buffer("buf", torch.zeros(2), persistent=False),
    "param_plain_tensor": lambda m: m.register_parameter("p", torch.zeros(1)),
    "param_dot": lambda m: m.register_parameter("a.b", nn.Parameter(torch.zeros(1))),
    "param_exists": lambda m: m.register_parameter("buf", nn.Parameter(torch.zeros(1))),
    "param_non_leaf": lambda m: m.register_parameter(
        "p", nn.Parameter(torch.zeros(1, requires_grad=True)) * 2
    ),
    "param_none": lambda m: m.register_parameter("p", None),
    "add_module_int": lambda m: m.add_module("x", 3),
    "add_module_dot": lambda m: m.add_module("a.b", nn.ReLU()),
    "add_module_empty": lambda m: m.add_module("", nn.ReLU()),
    "add_module_attr": lambda m: m.add_module("forward", nn.ReLU()),
    "add_module_none": lambda m: m.add_module("gone", None),
    "register_module": lambda m: m.register_module("r", nn.ReLU()),
    "set_tensor_on_param": lambda m: setattr(m.lin, "weight", torch.zeros(2, 2)),
    "set_none_on_param": lambda m: setattr(m.lin, "weight", None),
    "set_int_on_buffer": lambda m: setattr(m, "buf", 3),
    "set_tensor_on_buffer": lambda m: setattr(m, "buf", torch.zeros(4)),
    "set_int_on_module": lambda m: setattr(m, "lin", 3),
    "set_param_on_buffer": lambda m: setattr(m, "buf", nn.Parameter(torch.zeros(1))),
    "set_module_on_param": lambda m: setattr(m.lin, "weight", nn.ReLU()),
    "set_param_on_plain": lambda m: (
        setattr(m, "q", 1),
        setattr(m, "q", nn.Parameter(torch.ones(1))),
    ),
    "set_module_on_plain": lambda m: (setattr(m, "q", 1), setattr(m, "q", nn.ReLU())),
    "del_param": lambda m: delattr(m.lin, "weight"),
    "del_buffer": lambda m: delattr(m, "buf"),
    "del_module": lambda m: delattr(m, "bn"),
    "del_missing": lambda m: delattr(m, "nope"),
    "get_missing": lambda m: m.nope,
    "get_registered": lambda m: (type(m.lin).__name__, m.buf.shape, m.lin.weight.shape),
    "early_param": lambda m: Plain("param"),
    "early_module": lambda m: Plain("module"),
    "early_buffer": lambda m: Plain("buffer"),
    "early_plain": lambda m: Plain("plain").x,
}


def registries(m: nn.Module) -> Any:
    """Keys of every registry and plain attribute of ``m`` and its children."""
    out = []
    for k, sub in nn.Module.named_modules(m):
        d = sub.__dict__
        out.append(
            (
                k,
                list(d["_parameters"]),
                list(d["_buffers"]),
                list(d["_modules"]),
                sorted(d["_non_persistent_buffers_set"]),
                sorted(x for x in d if not x.startswith("_")),
            )
        )
    return out


@pytest.mark.parametrize("case", list(REGISTRATION))
def test_registration_errors(case: str, accel: Accel[Any]) -> None:
    action = REGISTRATION[case]

    def scenario(model: nn.Module) -> Any:
        result = outcome(lambda: action(model))
        if result[0] == "ok" and isinstance(result[1], nn.Module):
            result = ("ok", registries(result[1]))
        return result, registries(model), model.state_dict(keep_vars=True)

    compare(Plain, scenario, accel)


class Slotted(nn.Module):
    """A module class that declares ``__slots__`` (instances still have a ``__dict__``)."""

    __slots__ = ("extra",)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (self.extra if hasattr(self, "extra") else 1)


def test_slots(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        x = x_in(2, 3)
        out: list[Any] = [outcome(lambda: model.extra)]
        out.append(model(x))
        model.extra = 2.0
        out += [model.extra, "extra" in model.__dict__, model(x)]
        del model.extra
        out += [outcome(lambda: model.extra), outcome(lambda: delattr(model, "extra"))]
        model.extra = nn.Linear(3, 3)  # a module goes to _modules, not the slot
        out += [
            outcome(lambda: type(model.extra).__name__),
            list(model._modules),
            list(model.state_dict()),
        ]
        out.append(outcome(lambda: setattr(model, "extra", 4.0)))  # a child module is there
        del model.extra
        model.extra = 4.0
        out += [outcome(lambda: model.extra), list(model._modules), model(x)]
        out.append(outcome(lambda: setattr(model, "extra", nn.Parameter(torch.ones(1)))))
        out += [outcome(lambda: model.extra), list(model._parameters), repr(model)]
        return out

    compare(Slotted, scenario, accel)


class Meta(type(nn.Module)):  # type: ignore[misc]
    """A custom metaclass that post-processes instances and adds a class property."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__call__(*args, **kwargs)
        obj.made_by_meta = True
        return obj

    @property
    def kind(cls) -> str:
        return f"kind:{cls.__name__}"


class WithMeta(nn.Module, metaclass=Meta):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("b", torch.arange(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.b


def test_custom_metaclass(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        fresh = WithMeta()
        return (
            type(model).kind,
            type(model) is WithMeta,
            type(type(model)) is Meta,
            model.made_by_meta,
            fresh.made_by_meta,
            model(x_in(2, 3)),
            model.state_dict(),
            via_c("state_dict", model),
            [k for k, _ in via_c("named_modules", model)],
            repr(model),
        )

    compare(WithMeta, scenario, accel)
    assert (left_accelerated() != [] and _core.is_accelerated_class(WithMeta)) is NATIVE


class Symmetric(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu() + w.triu(1).transpose(-1, -2)


class Parametrized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        parametrize.register_parametrization(self.lin, "weight", Symmetric())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.lin(x)))


def test_parametrization_with_hooks(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        log: list[Any] = []
        model.lin.register_forward_hook(lambda m, a, o: log.append(("lin", tuple(o.shape))))
        model.register_forward_pre_hook(lambda m, a: log.append(("root",)))
        y = model(x_in(3, 4))
        y.sum().backward()
        out = {
            "y": y,
            "log": log,
            "weight": model.lin.weight,
            "type": type(model.lin).__name__,
            "is_param": parametrize.is_parametrized(model.lin, "weight"),
            "sd": model.state_dict(),
            "c_sd": via_c("state_dict", model),
            "names": [k for k, _ in model.named_parameters()],
            "grads": grads_by_name(model),
        }
        with parametrize.cached():
            out["cached"] = model(x_in(3, 4))
        out["load"] = tuple(model.load_state_dict(out["sd"]))
        parametrize.remove_parametrizations(model.lin, "weight")
        out["removed"] = (type(model.lin).__name__, model.state_dict(), model(x_in(3, 4)))
        return out

    compare(Parametrized, scenario, accel)


def test_parametrize_after_accelerate(accel: Accel[Any]) -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def scenario(model: nn.Module) -> Any:
        parametrize.register_parametrization(model[0], "weight", Symmetric())
        model[0].register_forward_hook(lambda m, a, o: o * 3)
        return model(x_in(3, 4)), model.state_dict(), [k for k, _ in model.named_parameters()]

    compare(build, scenario, accel)


class SelfAccelerating(nn.Module):
    """Calls ``fastmodule.accelerate(self)`` from inside its own forward, when asked."""

    def __init__(self, do_it: bool) -> None:
        super().__init__()
        self.do_it = do_it
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.do_it:
            fastmodule.accelerate(self)
        return self.norm(self.lin(x)) * 2


def test_accelerate_from_inside_forward() -> None:
    torch.manual_seed(0)
    stock = SelfAccelerating(False)
    expected = [stock(x_in()), stock(x_in()), stock.state_dict()]
    torch.manual_seed(0)
    model = SelfAccelerating(True)
    try:
        assert not fastmodule.is_accelerated(model)
        got = [model(x_in()), model(x_in()), model.state_dict()]
        assert all(fastmodule.is_accelerated(m) for m in model.modules()) is NATIVE
    finally:
        fastmodule.restore(model)
    same(got, expected)


# --------------------------------------------------------------------------- install


def test_install_uninstall() -> None:
    assert not fastmodule.installed()

    class Before(nn.Module):
        pass

    try:
        fastmodule.install()
        fastmodule.install()
        # Where no native path is on, install() changes nothing.
        assert fastmodule.installed() is NATIVE
        assert fastmodule.is_accelerated(Before()) is NATIVE
        assert fastmodule.is_accelerated(nn.Linear(1, 1)) is NATIVE

        class Late(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(2, 2)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.lin(x)

        late = Late()
        assert fastmodule.is_accelerated(late) is NATIVE
        x = x_in(2, 2)
        torch.testing.assert_close(late(x), x @ late.lin.weight.T + late.lin.bias, rtol=0, atol=0)
        assert list(late.state_dict()) == ["lin.weight", "lin.bias"]
    finally:
        fastmodule.uninstall()
    assert not fastmodule.installed()
    assert not fastmodule.is_accelerated(late)
    assert not fastmodule.is_accelerated(Before())
    assert not fastmodule.is_accelerated(nn.Linear(1, 1))

    class After(nn.Module):
        pass

    assert not fastmodule.is_accelerated(After())
    fastmodule.uninstall()
    assert not fastmodule.installed()


def subclass_scenario() -> Any:
    """Class creation through ``__init_subclass__`` chains, with and without kwargs."""

    class Parent(nn.Module):
        def __init_subclass__(cls, flag: int = 0, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            cls.flag = flag

    class Child(Parent, flag=3):
        pass

    def bad() -> None:
        class Bad(nn.Module, unknown=1):  # type: ignore[call-arg]
            pass

    def bad_child() -> None:
        class BadChild(Parent, flag=1, unknown=2):  # type: ignore[call-arg]
            pass

    return (
        Child.flag,
        Parent.__dict__.get("flag"),
        outcome(bad),
        outcome(bad_child),
        "__init_subclass__" in Child.__dict__,
        fastmodule.is_accelerated(Child()),
    )


def test_install_keeps_init_subclass_semantics() -> None:
    expected = subclass_scenario()
    assert expected[-1] is False
    try:
        fastmodule.install()
        got = subclass_scenario()
    finally:
        fastmodule.uninstall()
    assert got[:-1] == expected[:-1]
    assert got[-1] is NATIVE


def test_install_then_restore_model_then_uninstall() -> None:
    model = small()
    try:
        fastmodule.install()
        assert fastmodule.is_accelerated(model[0]) is NATIVE
        fastmodule.restore(model)
        assert not fastmodule.is_accelerated(model[0])
        assert fastmodule.installed() is NATIVE
        fastmodule.accelerate(model)
    finally:
        fastmodule.uninstall()
    assert not any(fastmodule.is_accelerated(m) for m in model.modules())


# --------------------------------------------------------------------------- ecosystem


def torch_frames(calls: Callable[[], Any]) -> set[str]:
    """Names of the functions of torch's ``module.py`` that ``calls()`` enters
    (fastmodule's own frames, which carry torch's file and names, left out)."""
    from fastmodule._methods import dispatch as _dispatch

    torch_file = sys.modules["torch.nn.modules.module"].__file__
    ours = {f.__code__ for f in _dispatch.BODIES.values()}
    ours |= {f.__code__ for f in vars(fastmodule.Module).values() if hasattr(f, "__code__")}
    names: set[str] = set()

    def prof(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename == torch_file and code not in ours:
            names.add(code.co_name)

    # With a profile function set, fastmodule hands every call to torch's code (so
    # profilers see stock frames): switched off here, to watch the native routes.
    was = _core.set_tracer_check(False)
    sys.setprofile(prof)
    try:
        calls()
    finally:
        sys.setprofile(None)
        _core.set_tracer_check(was)
    return names


@pytest.mark.requires_native("which of torch's frames the native whole-tree bodies skip")
def test_native_route_is_taken_from_c(accel: Accel[Any]) -> None:
    """The C-called whole-tree methods really run fastmodule's bodies once accelerated,
    so the parity tests above compare two different implementations: torch's bodies
    (and their helpers) are not entered; on 3.11, where the vectorcall entry point
    routes calls from C, not even torch's frame is."""
    model = small()

    def calls() -> None:
        via_c("state_dict", model)
        list(via_c("named_parameters", model))

    assert {"state_dict", "named_parameters", "_save_to_state_dict", "_named_members"} <= (
        torch_frames(calls)
    )
    accel(model)
    skipped = {"_save_to_state_dict", "_named_members"}
    if sys.version_info < (3, 12):
        skipped |= {"state_dict", "named_parameters"}
    assert torch_frames(calls).isdisjoint(skipped)


TORCH_HELPERS = {
    "_save_to_state_dict",
    "_load_from_state_dict",
    "_named_members",
    "named_children",
    "compute_should_use_set_data",
}


@pytest.mark.requires_native("which of torch's helpers the native whole-tree bodies skip")
def test_native_route_is_taken_from_python(accel: Accel[Any]) -> None:
    """Called from Python code (which 3.11 inlines, bypassing the vectorcall), the
    whole-tree methods of an accelerated model run fastmodule's bodies too: none of
    the helpers torch's own bodies call is entered."""
    model = small()

    def calls() -> None:
        model.load_state_dict(model.state_dict())
        list(model.named_parameters())
        list(model.children())
        model.train()
        model.zero_grad()
        model.float()

    assert TORCH_HELPERS <= torch_frames(calls)
    accel(model)
    assert torch_frames(calls).isdisjoint(TORCH_HELPERS)


def test_routed_torch_functions_look_unchanged() -> None:
    """What Python code can ask torch's routed functions (source, signature, file,
    lines, names, generator-ness) is what it was before fastmodule was imported."""
    from fastmodule._methods import dispatch as _dispatch
    from fastmodule._verified import inline_routes

    for name in _dispatch.BODIES:
        func = nn.Module.__dict__[name]
        before = types.FunctionType(
            inline_routes.original_code(name), func.__globals__, name, func.__defaults__
        )
        before.__kwdefaults__ = func.__kwdefaults__
        before.__annotations__ = func.__annotations__
        code, orig = func.__code__, before.__code__
        assert inspect.getsource(func) == inspect.getsource(before), name
        assert inspect.signature(func) == inspect.signature(before), name
        for attr in ("co_filename", "co_firstlineno", "co_name", "co_qualname", "co_argcount"):
            assert getattr(code, attr) == getattr(orig, attr), (name, attr)
        assert code.co_kwonlyargcount == orig.co_kwonlyargcount, name
        n_args = code.co_argcount + code.co_kwonlyargcount
        n_args += sum(bool(code.co_flags & f) for f in (inspect.CO_VARARGS, inspect.CO_VARKEYWORDS))
        assert code.co_varnames[:n_args] == orig.co_varnames[:n_args], name
        assert inspect.isgeneratorfunction(func) == inspect.isgeneratorfunction(before), name
    if inline_routes.NEEDED:
        inline_routes.install(_dispatch.BODIES, ())  # a second install changes nothing
        assert inline_routes.prefixed() == sorted(_dispatch.BODIES)


def test_prefix_only_where_torch_source_matches_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A routed function whose source on disk no longer compiles to its running code
    (an edited file, say) keeps torch's code; the others are still prefixed."""
    from fastmodule._methods import dispatch as _dispatch
    from fastmodule._methods import walks
    from fastmodule._verified import inline_routes

    module = sys.modules["torch.nn.modules.module"]
    funcs = {
        name: types.FunctionType(
            inline_routes.original_code(name),
            module.__dict__,
            name,
            nn.Module.__dict__[name].__defaults__,
        )
        for name in _dispatch.BODIES
    }
    source = inspect.getsource(module)
    assert sorted(inline_routes._prefixed(funcs, set(walks.WALKED))) == sorted(funcs)
    edited = source.replace("self.training = mode", "self.training = bool(mode)", 1)
    assert edited != source
    monkeypatch.setattr(inspect, "getsource", lambda obj: edited)
    assert sorted(inline_routes._prefixed(funcs, set(walks.WALKED))) == sorted(
        set(funcs) - {"train"}
    )
    monkeypatch.setattr(
        inspect, "getsource", lambda obj: (_ for _ in ()).throw(OSError("no source"))
    )
    assert inline_routes._prefixed(funcs, set(walks.WALKED)) == {}


@pytest.mark.requires_native("the flag fastmodule gives torch's prefixed functions")
def test_prefix_flag_follows_acceleration() -> None:
    """While no class is accelerated in place, torch's prefixed functions pay one
    global read (the flag); it turns on and off with acceleration."""
    from fastmodule._verified import inline_routes

    if not inline_routes.NEEDED:
        pytest.skip("torch's code is not prefixed on this interpreter")
    namespace = sys.modules["torch.nn.modules.module"].__dict__
    assert namespace["_fastmodule_accelerated"] is False
    with accelerating() as go:
        go(small())
        assert namespace["_fastmodule_accelerated"] is True
    assert namespace["_fastmodule_accelerated"] is False


class UsesWalks(nn.Module):
    """A forward that walks its own tree, as HF models do for their dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = next(self.parameters())
        x = x * len(list(self.named_modules())) + len(list(self.children()))
        for _, q in self.named_parameters():
            x = x + q.sum()
        for b in self.buffers():
            x = x * b
        return self.b(self.a(x)) * p.dtype.itemsize


@pytest.mark.parametrize("other_accelerated", [False, True])
def test_torch_compile_fullgraph_inlines_torch_walks(
    accel: Accel[Any], other_accelerated: bool
) -> None:
    """Dynamo inlines torch's walks in a compiled forward (the same graph, one frame)
    on stock and accelerated models alike, whether or not the route is switched on."""
    import torch._dynamo.testing

    class Unrelated(nn.Module):
        pass

    if other_accelerated:
        accel(Unrelated())

    def scenario(model: nn.Module) -> Any:
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        out = [compiled(x_in()), compiled(x_in(5, 4)), model(x_in())]
        return out, counter.frame_count, counter.op_count

    compare(UsesWalks, scenario, accel)


def test_compiled_walks_recompile_at_most_once_when_acceleration_starts(
    accel: Accel[Any],
) -> None:
    """A compiled forward that inlines torch's walks keeps its graph when some other
    model is accelerated; on 3.11, where Dynamo guards the prefix's flag, it is
    compiled once more, and only the first time the flag changes."""
    import torch._dynamo.testing

    from fastmodule._verified import inline_routes

    torch.manual_seed(0)
    model = UsesWalks()
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x = x_in()
    expected = model(x)
    counts = [counter.frame_count]
    torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
    counts.append(counter.frame_count)
    accel(nn.Sequential(nn.Tanh()))
    torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
    counts.append(counter.frame_count)
    if NATIVE:  # (else accel() accelerated nothing)
        _core.restore_class(nn.Tanh)
        _core.restore_class(nn.Sequential)
    torch.testing.assert_close(compiled(x), expected, rtol=0, atol=0)
    counts.append(counter.frame_count)
    extra = 1 if "parameters" in inline_routes.prefixed() else 0
    assert counts == [0, 1, 1 + extra, 1 + extra]


def test_warnings_point_at_the_caller(accel: Accel[Any]) -> None:
    """The FutureWarning for positional ``state_dict`` arguments and the replica
    ``zero_grad`` warning name the caller's line, as stock's do, whichever route
    reached the native body."""

    def scenario(model: nn.Module) -> Any:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.state_dict(None)
            model._is_replica = True
            model.zero_grad()
            via_c("state_dict", model, None)
        first = scenario.__code__.co_firstlineno
        return [(w.category, w.filename, w.lineno - first) for w in caught]

    compare(small, scenario, accel)


def test_torch_compile_fullgraph(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        # Each side compiles from an empty cache: otherwise the second (fast) run may
        # reuse the first's compiled code, and see none of the warnings building
        # guards gives (Dynamo's "Guards may run slower" on CPython 3.13.0).
        torch._dynamo.reset()
        model.eval()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        return compiled(x_in()), compiled(x_in(5, 4)), model(x_in())

    compare(small, scenario, accel)


def test_fx_symbolic_trace(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        gm = torch.fx.symbolic_trace(model)
        return gm.code, str(gm.graph), gm.eval()(tokens()), list(gm.state_dict())

    compare(Mixed, scenario, accel)


def test_functional_call(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        model.eval()
        params = {
            k: torch.full_like(v, 0.01 * i) for i, (k, v) in enumerate(model.named_parameters())
        }
        y = torch.func.functional_call(model, params, (tokens(),))
        y2 = torch.func.functional_call(model, (params, dict(model.named_buffers())), tokens())
        bad = outcome(
            lambda: torch.func.functional_call(
                model, {"nope": torch.zeros(1)}, (tokens(),), strict=True
            )
        )
        tied = torch.func.functional_call(
            model, {"heads.0.weight": torch.ones(4, 8)}, (tokens(),), tie_weights=True
        )
        untied = torch.func.functional_call(
            model, {"shared.weight": torch.ones(4, 8)}, (tokens(),), tie_weights=False
        )
        return y, y2, bad, tied, untied, model.state_dict(), model(tokens())

    compare(Mixed, scenario, accel)


def test_jit_trace_and_script(accel: Accel[Any]) -> None:
    mangle = re.compile(r"___torch_mangle_\d+\.")

    def scenario(model: nn.Module) -> Any:
        model.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(model, x_in())
            scripted = torch.jit.script(model)
        # no_grad: the JIT executor's autograd plan depends on how often the process
        # has run this graph before, not on the module
        with torch.no_grad():
            return (
                mangle.sub("", str(traced.graph)),
                [(n.kind(), n.scopeName()) for n in traced.inlined_graph.nodes()],
                traced(x_in()),
                mangle.sub("", str(scripted.inlined_graph)),
                scripted(x_in()),
                list(scripted.state_dict()),
            )

    compare(small, scenario, accel)


def test_torch_export(accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> Any:
        model.eval()
        ep = torch.export.export(model, (x_in(),))
        stacks = [
            (str(n.target), [p for p, _ in (n.meta.get("nn_module_stack") or {}).values()])
            for n in ep.graph.nodes
            if n.op == "call_function"
        ]
        return str(ep.graph), stacks, list(ep.state_dict), ep.module()(x_in()), model(x_in())

    compare(small, scenario, accel)


# --------------------------------------------------------------------------- edge cases


class PropertyRaises(nn.Module):
    """Attribute lookups where torch's ``__getattr__`` fallback shows through."""

    shadowed = None  # a class attribute wins over ``_parameters['shadowed']``

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self._parameters["shadowed"] = nn.Parameter(torch.zeros(1))

    @property
    def broken(self) -> Any:
        return self.missing_thing  # AttributeError inside a property

    @property
    def child(self) -> nn.Module:
        return self.lin


class OwnGetattr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def __getattr__(self, name: str) -> Any:
        if name == "magic":
            return 42
        return super().__getattr__(name)


@pytest.mark.parametrize("cls", [PropertyRaises, OwnGetattr])
def test_attribute_lookup_edge_cases(cls: type[nn.Module], accel: Accel[Any]) -> None:
    def scenario(m: nn.Module) -> Any:
        out: list[Any] = [
            outcome(lambda: m.broken),
            outcome(lambda: type(m.child).__name__),
            outcome(lambda: m.shadowed),
            outcome(lambda: m.magic),
            outcome(lambda: m.nope),
            hasattr(m, "nope"),
            getattr(m, "nope", "default"),
            sorted(dir(m)),
        ]
        m.__dict__["lin"] = "instance dict wins"
        out.append(outcome(lambda: m.lin))
        del m.__dict__["lin"]
        out.append(outcome(lambda: type(m.lin).__name__))
        shallow = copy.copy(m)
        out.append((shallow._parameters is m._parameters, list(shallow.state_dict())))
        m.training = False
        out.append([s.training for s in m.modules()])
        return out

    compare(cls, scenario, accel)


def make_class() -> type[nn.Module]:
    """A fresh module class, so patching it never affects another test."""

    class Patched(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = 2
            self.lin = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.k

    return Patched


def test_class_patched_after_accelerate(accel: Accel[Any]) -> None:
    """Methods and dunders set on (and deleted from) the class after acceleration."""

    def scenario(m: nn.Module) -> Any:
        cls = type(m)
        x = x_in(1, 2)
        out: list[Any] = [m(x)]
        cls.forward = lambda self, x: x + 100
        out.append(m(x))
        m.forward = lambda x: x - 1  # instance attribute beats the class
        out.append(m(x))
        del m.forward
        cls.__call__ = lambda self, x: "custom call"
        out.append(outcome(lambda: m(x)))
        del cls.__call__
        out.append(outcome(lambda: m(x)))
        cls.__getattr__ = lambda self, n: f"getattr:{n}"
        out += [outcome(lambda: m.zzz), outcome(lambda: m.lin.weight.shape)]
        del cls.__getattr__
        out.append(outcome(lambda: m.zzz))
        cls.k = property(lambda self: 7)  # a data descriptor beats the instance dict
        out += [outcome(lambda: m.k), outcome(lambda: setattr(m, "k", 1))]
        cls.k = 5
        out.append(outcome(lambda: m.k))
        cls.__setattr__ = lambda self, n, v: object.__setattr__(self, n, ("set", v))
        m.q = 1
        out.append(m.__dict__.get("q"))
        del cls.__setattr__
        m.q = nn.ReLU()
        out += [m.__dict__.get("q"), list(m._modules)]
        cls.__delattr__ = lambda self, n: None
        del m.q
        out.append(list(m._modules))
        del cls.__delattr__
        del m.q
        out.append(list(m._modules))
        return out

    compare(lambda: make_class()(), scenario, accel)


def test_restore_after_class_dunder_patch(accel: Accel[Any]) -> None:
    model = make_class()()
    cls = type(model)
    x = x_in(1, 2)
    expected = model(x)
    accel(model)
    cls.__call__ = lambda self, x: "custom"
    assert model(x) == "custom"
    fastmodule.restore(model)
    assert model(x) == "custom"
    del cls.__call__
    same(model(x), expected)
    accel(model)
    same(model(x), expected)
    fastmodule.restore(model)
    same(model(x), expected)


def test_torch_nn_module_patches_run(accel: Accel[Any]) -> None:
    """Patching ``torch.nn.Module``'s methods after acceleration reaches fast instances."""

    def scenario(m: nn.Module) -> Any:
        log: list[Any] = []
        out: list[Any] = []
        saved = {k: nn.Module.__dict__[k] for k in ("__call__", "state_dict", "__getattr__")}
        saved_setattr = nn.Module.__dict__["__setattr__"]

        def wrap(name: str) -> Callable[..., Any]:
            def patched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
                log.append((name, type(self).__name__, args[:1] if name == "__getattr__" else ()))
                return saved[name](self, *args, **kwargs)

            return patched

        try:
            for name in saved:
                setattr(nn.Module, name, wrap(name))
            nn.Module.__setattr__ = lambda self, n, v: (  # type: ignore[method-assign]
                log.append(("__setattr__", n)),
                saved_setattr(self, n, v),
            )[1]
            out.append(m(x_in(2, 4)))
            out.append(list(m.state_dict()))
            out.append(list(via_c("state_dict", m)))
            out.append(outcome(lambda: m[0].weight.shape))
            out.append(outcome(lambda: m.nope))
            m[0].foo = 1
            m.extra = nn.Tanh()
        finally:
            for name, fn in saved.items():
                setattr(nn.Module, name, fn)
            nn.Module.__setattr__ = saved_setattr  # type: ignore[method-assign]
        out += [log, m(x_in(2, 4)), list(m.state_dict())]
        return out

    compare(small, scenario, accel)
    assert all(v is nn.Module.__dict__[k] for k, v in vars(nn.Module).items())


def test_prune_weight_norm_spectral_norm(accel: Accel[Any]) -> None:
    import torch.nn.utils.prune as prune

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Linear(5, 3))

    def scenario(m: nn.Module) -> Any:
        prune.l1_unstructured(m[0], "weight", amount=0.5)
        nn.utils.parametrizations.weight_norm(m[2])
        nn.utils.spectral_norm(m[3])
        torch.manual_seed(5)
        y = m(x_in())
        y.sum().backward()
        out = [
            y,
            m.state_dict(),
            [k for k, _ in m.named_parameters()],
            [k for k, _ in m.named_buffers()],
        ]
        prune.remove(m[0], "weight")
        out += [m.state_dict(), m.eval()(x_in())]
        return out

    compare(build, scenario, accel)


def test_checkpointed_forward(accel: Accel[Any]) -> None:
    import torch.utils.checkpoint as checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = small()
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint.checkpoint(lambda t: self.drop(self.inner(t)), x, use_reentrant=False)

    def scenario(m: nn.Module) -> Any:
        x = x_in().requires_grad_()
        y = m(x)
        y.sum().backward()
        return y, x.grad, {k: p.grad for k, p in m.named_parameters()}

    compare(Checkpointed, scenario, accel)


class Logged(torch.Tensor):
    """A tensor subclass that records the torch functions it meets."""

    log: list[Any] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.log.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_layer_forwards_under_modes_patches_and_bad_calls(accel: Accel[Any]) -> None:
    """Sequential/Linear/ReLU forwards: modes, tensor subclasses, patched functionals,
    argument errors, autocast, inference mode, replaced or missing parameters."""

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.ReLU(inplace=True))

    def scenario(m: nn.Module) -> Any:
        x = x_in(2, 3)
        out: list[Any] = []
        log: list[Any] = []
        with LogFunctions(log):
            out.append(m(x))
        with LogOps(log):
            out.append(m(x))
        Logged.log.clear()
        y = m(x.as_subclass(Logged))
        out += [log, type(y).__name__, list(Logged.log)]
        for patched, fn in [("linear", lambda i, w, b=None: i @ w.T + 1000), ("relu", None)]:
            original = getattr(F, patched)
            if fn is None:
                fn = lambda i, inplace=False, original=original: original(i, inplace) - 5  # noqa: E731
            setattr(F, patched, fn)
            try:
                out.append(m(x))
            finally:
                setattr(F, patched, original)
        lin, relu = m[0], m[1]
        out += [
            outcome(lambda: lin(x, x)),
            outcome(lambda: lin(input=x)),
            outcome(lambda: lin(inp=x)),
            outcome(lambda: lin()),
            outcome(lambda: m(x, x)),
            outcome(lambda: m(input=x)),
            outcome(lambda: relu(x, x)),
            outcome(lambda: lin(torch.ones(2, 5))),
            outcome(lambda: lin(3)),
            outcome(lambda: relu("a")),
            outcome(lambda: relu(torch.tensor([-1, 2]))),
            outcome(lambda: lin(x.double())),
            outcome(lambda: nn.Linear(3, 2, device="meta")(x)),
        ]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out.append(m(x))
        with torch.inference_mode():
            y = m(x)
            out.append((y.is_inference(), y.requires_grad))
        with torch.no_grad():
            out.append(m(x))
        inplace_in = torch.randn(2, 4)
        out.append((m[3](inplace_in) is inplace_in, inplace_in))
        lin.forward = lambda x: "instance forward"
        out.append(outcome(lambda: lin(x)))
        del lin.forward
        weight = lin.weight
        del lin.weight
        lin.weight = torch.ones(4, 3)  # a plain tensor attribute, as functional tools do
        out.append(outcome(lambda: lin(x)))
        del lin.weight
        lin.weight = weight
        lin.bias = None
        out.append(outcome(lambda: lin(x)))
        m.add_module("nothing", None)
        out.append(outcome(lambda: m(x)))
        del m.nothing
        out.append(outcome(lambda: nn.Sequential()(x)))

        class SubLinear(nn.Linear):
            pass

        out.append(outcome(lambda: SubLinear(3, 2)(x)))
        y = m(x)
        y.sum().backward()
        out += [y, [p.grad for p in m.parameters()]]
        return out

    compare(build, scenario, accel)


def test_layer_reads_follow_every_change_after_warm_calls(accel: Accel[Any]) -> None:
    """The native layers remember what they read (``weight``/``bias``, ``inplace``,
    ``_modules``, the functionals) between calls; each change below, made after
    repeated calls, must be seen by the very next call as stock sees it."""

    def build() -> nn.Module:
        # Enough modules that cache slots are shared between several of them.
        body = [nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(300)]
        return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), *body)

    def scenario(m: nn.Module) -> Any:
        x = x_in(2, 3)
        out: list[Any] = []

        def warm() -> None:
            for _ in range(3):
                out.append(m(x))

        lin, relu, inner = m[0], m[1], m[2]
        warm()
        lin.weight = nn.Parameter(torch.full((4, 3), 0.5))  # rebinds _parameters['weight']
        warm()
        lin._parameters["bias"] = nn.Parameter(torch.full((4,), -0.25))  # the dict itself
        warm()
        with torch.no_grad():
            lin.weight.mul_(2)  # same object, new values
        warm()
        lin.__dict__["bias"] = torch.ones(4)  # an instance attribute shadows the registry
        warm()
        del lin.__dict__["bias"]
        warm()
        relu.inplace = True
        warm()
        relu.inplace = False
        warm()
        inner.append(nn.Identity())  # the same _modules dict grows
        warm()
        inner._modules = {"0": inner[0]}  # a new registry object
        warm()
        del inner._modules["0"]
        warm()
        type(relu).extra = 1  # a class change
        warm()
        del type(relu).extra
        for name, fn in [
            ("linear", lambda i, w, b=None: i @ w.T + 1000),
            ("relu", lambda i, inplace=False: i - 5),
        ]:
            original = getattr(F, name)
            setattr(F, name, fn)
            try:
                warm()
            finally:
                setattr(F, name, original)
            warm()
        torch_relu = torch.relu
        torch.relu = lambda i: i * 0 + 7  # type: ignore[assignment]
        try:
            warm()
        finally:
            torch.relu = torch_relu
        warm()
        return out

    compare(build, scenario, accel)


class Mutator(nn.Module):
    """A layer that edits its parent Sequential while that Sequential iterates."""

    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action
        self.parent: list[nn.Sequential] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = self.parent[0]
        if self.action == "append":
            seq.append(nn.ReLU())
        elif self.action == "delete":
            del seq[-1]
        elif self.action == "replace":
            seq[-1] = nn.Tanh()  # same size: the loop goes on with the new module
        elif self.action == "raise":
            raise ValueError("inside the loop")
        return x + 1


@pytest.mark.parametrize("action", ["append", "delete", "replace", "raise"])
def test_sequential_edited_during_its_own_forward(accel: Accel[Any], action: str) -> None:
    """Sequential.forward iterates its ``_modules`` values lazily: a child that edits
    the container mid-loop gets stock's RuntimeError, or stock's result."""

    def build() -> nn.Module:
        mutator = Mutator(action)
        seq = nn.Sequential(nn.Linear(3, 3), mutator, nn.Linear(3, 3), nn.ReLU())
        mutator.parent.append(seq)
        return seq

    def scenario(m: nn.Module) -> Any:
        x = x_in(2, 3)
        return [outcome(lambda: m(x)), [type(c).__name__ for c in m]]

    compare(build, scenario, accel)


@pytest.mark.requires_native("the native slots acceleration installs per class")
def test_plain_module_instances_leave_nn_module_untouched() -> None:
    """A tree of bare ``nn.Module()`` containers accelerates ``nn.Module`` itself in
    place; its slots stay CPython's (classes inherit them), and restoring leaves no
    native slot anywhere, so stock calls after the block are stock."""
    root = nn.Module()
    root.add_module("block", nn.Module())
    root.block.add_module("lin", nn.Linear(2, 2))
    with fastmodule.accelerated(root):
        assert fastmodule.is_accelerated(root)
        assert _core.installed(nn.Module)[:2] == (False, False)
        assert _core.installed(nn.Linear)[:2] == (True, True)

        class Later(nn.Linear):
            pass

        assert _core.installed(Later)[:2] == (False, False)
        assert not fastmodule.is_accelerated(Later(2, 2))
    assert left_accelerated() == []
    assert not fastmodule.is_accelerated(root.block.lin)


def test_container_protocols_match_stock() -> None:
    """ModuleList/Sequential/ModuleDict iteration, len and views (served natively
    for accelerated classes) give what stock gives, errors included."""

    def build() -> nn.Module:
        torch.manual_seed(0)
        root = nn.Module()
        root.lst = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
        root.seq = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
        root.dct = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.ReLU()})
        return root

    def observe(root: nn.Module) -> list[Any]:
        def mutate_while_iterating() -> None:
            for _ in root.lst:
                root.lst.append(nn.ReLU())

        return [
            [type(m).__name__ for m in root.lst],
            [type(m).__name__ for m in root.seq],
            list(root.dct),
            list(root.dct.keys()),
            [type(m).__name__ for m in root.dct.values()],
            [(k, type(m).__name__) for k, m in root.dct.items()],
            (len(root.lst), len(root.seq), len(root.dct)),
            type(iter(root.lst)).__name__,
            type(root.dct.keys()).__name__,
            outcome(lambda: root.lst.__iter__(1)),
            outcome(lambda: root.dct.items(extra=1)),
            outcome(mutate_while_iterating),
        ]

    stock = observe(build())
    root = build()
    with fastmodule.accelerated(root):
        assert fastmodule.is_accelerated(root.lst) is NATIVE
        fast = observe(root)
    assert fast == stock
