"""A decision stays true until it is used: run-time changes to what a native path
reproduces are seen, stock against fast.

A native path reproduces torch's Python code. What it rests on can change between
import and a call, or between two steps of one call: a function's ``__code__`` or
defaults (IPython's ``%autoreload``, hot-reload tools, test doubles), a ``Tensor``
method a tool patched with a counting wrapper, ``warnings.warn`` patched by
``unittest.mock``, a layer attribute a forward pre-hook changes. Each scenario runs
on stock modules and on the same modules accelerated, and compares results,
exceptions, warnings and the call counts of every patched function (the shapes of
``../shared/reference/repros`` 29-32 and their variants)."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastmodule

Make = Callable[[], nn.Module]


@contextlib.contextmanager
def replaced_code(func: Any, new: Callable[..., Any]) -> Iterator[None]:
    """``func.__code__ = new.__code__`` for the block (what ``%autoreload`` does)."""
    old = func.__code__
    func.__code__ = new.__code__
    try:
        yield
    finally:
        func.__code__ = old


def run(model: nn.Module, accelerate: bool, body: Callable[[nn.Module], Any]) -> Any:
    """``body(model)`` on stock classes or with the model's classes accelerated;
    its value or its exception (type and text)."""
    ctx = fastmodule.accelerated(model) if accelerate else contextlib.nullcontext()
    with ctx:
        try:
            return ("ok", body(model))
        except Exception as e:  # noqa: BLE001 - the outcome is compared
            return ("raised", type(e).__name__, str(e))


def same(make: Make, body: Callable[[nn.Module], Any]) -> Any:
    torch.manual_seed(0)
    stock = run(make(), False, body)
    torch.manual_seed(0)
    fast = run(make(), True, body)
    assert fast == stock
    return stock


def total(x: Any) -> float:
    return round(float(x.double().sum().item()), 4)


# --- code and defaults replaced (repro 29 and its variants) ---------------------------


def _lin(self: Any, input: Any) -> Any:
    return F.linear(input, self.weight, self.bias) + 100


def _act(self: Any, input: Any) -> Any:
    return input * 0 + 100


def _seq(self: Any, input: Any) -> Any:
    for module in self:
        input = module(input)
    return input + 100


def _seq_iter(self: Any) -> Any:
    return iter(list(self._modules.values())[:1])


def _f_relu(input: Any, inplace: bool = False) -> Any:
    return torch.relu(input) + 100


LAYERS: dict[str, tuple[Make, Any, tuple[int, ...]]] = {
    "Linear": (lambda: nn.Linear(3, 3), nn.Linear.forward, (2, 3)),
    "ReLU": (nn.ReLU, nn.ReLU.forward, (2, 3)),
    "Sequential": (lambda: nn.Sequential(nn.Identity(), nn.ReLU()), nn.Sequential.forward, (2, 3)),
    "Identity": (nn.Identity, nn.Identity.forward, (2, 3)),
    "GELU": (nn.GELU, nn.GELU.forward, (2, 3)),
    "Sigmoid": (nn.Sigmoid, nn.Sigmoid.forward, (2, 3)),
    "Softmax": (lambda: nn.Softmax(dim=1), nn.Softmax.forward, (2, 3)),
    "Dropout": (lambda: nn.Dropout(0.0), nn.Dropout.forward, (2, 3)),
    "LayerNorm": (lambda: nn.LayerNorm(3), nn.LayerNorm.forward, (2, 3)),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(3).eval(), nn.BatchNorm1d.forward, (2, 3)),
    "Conv1d": (lambda: nn.Conv1d(3, 3, 1), nn.Conv1d.forward, (2, 3, 4)),
    "Embedding": (lambda: nn.Embedding(4, 3), nn.Embedding.forward, ()),
    "Flatten": (nn.Flatten, nn.Flatten.forward, (2, 3, 1)),
}


def _input(shape: tuple[int, ...]) -> torch.Tensor:
    if not shape:
        return torch.tensor([[0, 1, 2]])
    return torch.randn(*shape)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_forward_code_replaced(name: str) -> None:
    """Every served layer runs the code its ``forward`` has now, also after the
    native path served it (the call caches and remembered reads)."""
    make, forward, shape = LAYERS[name]
    x = _input(shape)
    new = _lin if name == "Linear" else _seq if name == "Sequential" else _act

    def body(m: nn.Module) -> Any:
        before = total(m(x))
        with replaced_code(forward, new):
            during = [total(m(x)), total(nn.Sequential(m)(x))]
        return before, during, total(m(x))

    before, during, after = same(make, body)[1]
    assert before == after
    assert during[0] != before


def test_sequential_iter_code_replaced() -> None:
    """``Sequential.forward`` iterates ``self``: a replaced ``__iter__`` is what it
    iterates with, and what ``for m in seq``/``list(seq)`` use."""
    x = torch.randn(2, 3)

    def body(m: nn.Module) -> Any:
        with replaced_code(nn.Sequential.__iter__, _seq_iter):
            return total(m(x)), len(list(m)), total(m(x))

    out = same(lambda: nn.Sequential(nn.Identity(), nn.ReLU(), nn.Linear(3, 3)), body)
    assert out[1][1] == 1


def test_module_list_iter_and_len_code_replaced() -> None:
    def body(m: nn.Module) -> Any:
        with replaced_code(nn.ModuleList.__iter__, _seq_iter):
            return len(list(iter(m))), len(m)

    out = same(lambda: nn.ModuleList([nn.ReLU(), nn.ReLU()]), body)
    assert out[1][0] == 1


def test_functional_relu_code_replaced() -> None:
    """``nn.ReLU`` reproduces ``F.relu``'s body: a replaced ``F.relu`` runs."""
    x = torch.randn(2, 3)

    def body(m: nn.Module) -> Any:
        with replaced_code(F.relu, _f_relu):
            return total(m(x))

    assert same(nn.ReLU, body)[1] == total(torch.relu(x) + 100)


def test_functional_defaults_replaced() -> None:
    """A reproduced ``F`` function's defaults are part of what is reproduced:
    ``nn.Softmax`` leaves ``F.softmax``'s ``dtype`` to its default."""
    x = torch.randn(2, 3)

    def body(m: nn.Module) -> Any:
        old = F.softmax.__defaults__
        assert old is not None
        F.softmax.__defaults__ = (*old[:-1], torch.float64)
        try:
            return str(m(x).dtype), str(m(x).dtype)
        finally:
            F.softmax.__defaults__ = old

    assert same(lambda: nn.Softmax(dim=1), body)[1] == ("torch.float64", "torch.float64")


def _call_impl_plus(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self.forward(*args, **kwargs) + 100


def _wrapped_plus(self: Any, *args: Any, **kwargs: Any) -> Any:
    return self._call_impl(*args, **kwargs) + 1000


@pytest.mark.parametrize("which", ["_call_impl", "_wrapped_call_impl"])
@pytest.mark.parametrize("hooked", [False, True])
def test_call_path_code_replaced(which: str, hooked: bool) -> None:
    """The module call reproduces ``_wrapped_call_impl`` and ``_call_impl``."""
    x = torch.randn(2, 3)
    func = getattr(nn.Module, which)
    new = _call_impl_plus if which == "_call_impl" else _wrapped_plus

    def body(m: nn.Module) -> Any:
        if hooked:
            m.register_forward_pre_hook(lambda mod, args: None)
        first = total(m(x))
        with replaced_code(func, new):
            during = total(m(x)), total(m(x))
        return first, during, total(m(x))

    out = same(lambda: nn.Sequential(nn.Linear(3, 3), nn.ReLU()), body)
    assert out[1][0] != out[1][1][0]


def _getattr_loud(self: Any, name: str) -> Any:
    raise AttributeError(f"replaced: {name}")


class _ClassCell:
    """Bodies for torch's ``__setattr__``/``__delattr__``, whose code has one free
    variable (``__class__``, for ``super()``): a replacement must have it too."""

    def setattr_plain(self, name: str, value: Any) -> None:
        __class__  # noqa: B018 - the free variable torch's function has
        object.__setattr__(self, name, value)

    def delattr_loud(self, name: str) -> None:
        __class__  # noqa: B018 - the free variable torch's function has
        raise AttributeError(f"replaced delattr: {name}")


def test_getattr_code_replaced() -> None:
    def body(m: nn.Module) -> Any:
        seen = [m.weight.shape]
        with replaced_code(nn.Module.__getattr__, _getattr_loud):
            try:
                seen.append(m.weight)
            except AttributeError as e:
                seen.append(str(e))
            seen.append(hasattr(m, "bias"))
        seen.append(m.weight.shape)
        return seen

    out = same(lambda: nn.Linear(2, 2), body)
    assert out[1][1] == "replaced: weight"


def test_setattr_and_register_code_replaced() -> None:
    """``m.x = Parameter`` through a replaced ``__setattr__`` and
    ``register_parameter``."""

    def register_loud(self: Any, name: str, param: Any) -> None:
        raise RuntimeError(f"replaced register_parameter: {name}")

    def body(m: nn.Module) -> Any:
        out = []
        with replaced_code(nn.Module.__setattr__, _ClassCell.setattr_plain):
            m.a = nn.Parameter(torch.zeros(1))
            out.append((sorted(m._parameters), "a" in m.__dict__))
        with replaced_code(nn.Module.__delattr__, _ClassCell.delattr_loud):
            try:
                del m.bias
            except AttributeError as e:
                out.append(str(e))
        with replaced_code(nn.Module.register_parameter, register_loud):
            try:
                m.b = nn.Parameter(torch.zeros(1))
            except RuntimeError as e:
                out.append(str(e))
            try:
                m.register_parameter("c", None)
            except RuntimeError as e:
                out.append(str(e))
        out.append(sorted(m._parameters))
        return out

    out = same(lambda: nn.Linear(2, 2), body)[1]
    assert out[0] == (["bias", "weight"], True)
    assert out[1] == "replaced delattr: bias"
    assert out[2] == "replaced register_parameter: b"


@pytest.mark.parametrize("base", [nn.Module, fastmodule.Module])
def test_whole_tree_method_code_replaced(base: type[nn.Module]) -> None:
    """A replaced ``state_dict``/``named_parameters``/``train`` runs at the root and
    at every module of the tree, as torch's recursion calls it."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

    def model() -> nn.Module:
        m = nn.Sequential(Block(), Block())
        return m

    def state_dict_marked(
        self: Any, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        if destination is None:
            destination = {}
        destination[prefix + "<marked>"] = type(self).__name__
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(
                    destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars
                )
        return destination

    def named_parameters_none(
        self: Any, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Any:
        yield from ()

    def train_marked(self: Any, mode: bool = True) -> Any:
        self.__dict__["marked"] = mode
        for module in self.children():
            module.train(mode)
        return self

    def body(m: nn.Module) -> Any:
        out = [sorted(m.state_dict())]
        with replaced_code(nn.Module.state_dict, state_dict_marked):
            out.append(sorted(m.state_dict().items()))
            out.append(sorted(m[0].state_dict().items()))
        with replaced_code(nn.Module.named_parameters, named_parameters_none):
            out.append([n for n, _ in m.named_parameters()])
            out.append(len(list(m.parameters())))
        with replaced_code(nn.Module.train, train_marked):
            m.eval()
            out.append([getattr(x, "marked", None) for x in m.modules()])
        out.append(sorted(m.state_dict()))
        out.append(len(list(m.named_parameters())))
        return out

    out = same(model, body)
    assert out[1][3] == []


# --- warnings.warn patched (repro 30) ---------------------------------------------------


@pytest.mark.parametrize("patch", ["warnings.warn", "module.warnings"])
def test_always_call_warning_through_patched_warn(patch: str) -> None:
    """A failing ``always_call`` hook's warning goes through ``warnings.warn`` as
    module.py reads it, with torch's arguments."""

    def body(m: nn.Module) -> Any:
        def failing_hook(mod: Any, args: Any, result: Any) -> None:
            raise ValueError("hook boom")

        def failing_pre_hook(mod: Any, args: Any) -> None:
            raise RuntimeError("pre boom")

        m.register_forward_hook(failing_hook, always_call=True)
        m.register_forward_pre_hook(failing_pre_hook)
        target = "torch.nn.modules.module.warnings" if patch == "module.warnings" else patch
        with mock.patch(target) as w:
            try:
                m(torch.ones(1, 2))
            except RuntimeError as e:
                raised = str(e)
        calls = w.warn.call_args_list if patch == "module.warnings" else w.call_args_list
        return raised, [(str(c.args[0])[:60], sorted(c.kwargs.items())) for c in calls]

    out = same(lambda: nn.Linear(2, 2), body)
    assert len(out[1][1]) == 1


def test_always_call_warning_unpatched_points_where_stock_does() -> None:
    def body(m: nn.Module) -> Any:
        def failing_hook(mod: Any, args: Any, result: Any) -> None:
            raise ValueError("hook boom")

        def failing_forward_hook(mod: Any, args: Any, result: Any) -> None:
            raise RuntimeError("forward boom")

        m.register_forward_hook(failing_forward_hook)
        m.register_forward_hook(failing_hook, always_call=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                m(torch.ones(1, 2))
            except RuntimeError:
                pass
        return [(str(x.message)[:50], os.path.basename(x.filename), x.lineno) for x in w]

    assert len(same(lambda: nn.Linear(2, 2), body)[1]) == 1


# --- Tensor methods patched (repro 31 and its variants) ---------------------------------


@contextlib.contextmanager
def counting(cls: type, name: str, calls: list[str]) -> Iterator[None]:
    """``cls.<name>`` replaced by a wrapper that records each call."""
    orig = cls.__dict__.get(name)
    found = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return found(self, *args, **kwargs)

    setattr(cls, name, wrapper)
    try:
        yield
    finally:
        if orig is None:
            delattr(cls, name)
        else:
            setattr(cls, name, orig)


TENSOR_CASES: dict[str, tuple[Make, tuple[int, ...]]] = {
    "BatchNorm1d 2-d": (lambda: nn.BatchNorm1d(3), (4, 3)),
    "BatchNorm1d 3-d": (lambda: nn.BatchNorm1d(3), (4, 3, 5)),
    "BatchNorm1d wrong rank": (lambda: nn.BatchNorm1d(3), (4, 3, 5, 2)),
    "BatchNorm2d 4-d": (lambda: nn.BatchNorm2d(3), (2, 3, 2, 2)),
    "BatchNorm2d 3-d": (lambda: nn.BatchNorm2d(3), (4, 3, 5)),
    "BatchNorm1d one value per channel": (lambda: nn.BatchNorm1d(3), (1, 3)),
    "BatchNorm1d eval": (lambda: nn.BatchNorm1d(3).eval(), (4, 3)),
    "Dropout2d 4-d": (lambda: nn.Dropout2d(0.5), (2, 3, 2, 2)),
    "Dropout2d 3-d": (lambda: nn.Dropout2d(0.5), (3, 2, 2)),
    "Dropout1d 3-d": (lambda: nn.Dropout1d(0.5), (2, 3, 4)),
    "AdaptiveAvgPool2d int": (lambda: nn.AdaptiveAvgPool2d(1), (1, 2, 4, 4)),
    "AdaptiveAvgPool2d tuple": (lambda: nn.AdaptiveAvgPool2d((None, 2)), (1, 2, 4, 4)),
    "Embedding padding_idx": (lambda: nn.Embedding(5, 2, padding_idx=3), ()),
    "LayerNorm": (lambda: nn.LayerNorm(3), (2, 3)),
    "Softmax": (lambda: nn.Softmax(dim=1), (2, 3)),
    "Flatten": (nn.Flatten, (2, 3, 2)),
    "Conv1d": (lambda: nn.Conv1d(3, 2, 1), (1, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(TENSOR_CASES))
@pytest.mark.parametrize("method", ["dim", "size", "softmax", "add_"])
def test_patched_tensor_method_called_as_often(name: str, method: str) -> None:
    make, shape = TENSOR_CASES[name]
    x = _input(shape)

    def body(m: nn.Module) -> Any:
        out = []
        for _ in range(2):
            calls: list[str] = []
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with counting(torch.Tensor, method, calls):
                    try:
                        r = total(m(x))
                    except Exception as e:  # noqa: BLE001 - compared
                        r = f"{type(e).__name__}: {e}"
            out.append((r, len(calls)))
        return out

    same(make, body)


def test_patched_parameter_method() -> None:
    """A method patched on ``Parameter`` only (the weight's class)."""
    calls: list[str] = []

    def body(m: nn.Module) -> Any:
        calls.clear()
        with counting(nn.Parameter, "size", calls):
            r = total(m(torch.tensor([[0, 1, 4]])))
        return r, len(calls)

    same(lambda: nn.Embedding(5, 2, padding_idx=3), body)


# --- hooks that change what a decision rested on (repro 32 and its variants) ------------


@pytest.mark.parametrize("layer", ["Softmax", "Softmin", "LogSoftmax"])
@pytest.mark.parametrize("change", ["to None", "from None"])
def test_pre_hook_changes_softmax_dim(layer: str, change: str) -> None:
    start, then = (1, None) if change == "to None" else (None, 1)

    def body(m: nn.Module) -> Any:
        def pre(mod: Any, args: Any) -> None:
            mod.dim = then

        m.register_forward_pre_hook(pre)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = total(m(torch.ones(2, 3)))
        return r, [(str(x.message)[:40], os.path.basename(x.filename), x.lineno) for x in w]

    same(lambda: getattr(nn, layer)(dim=start), body)


PRE_HOOK_CHANGES: dict[str, tuple[Make, str, Any, tuple[int, ...]]] = {
    "Dropout p": (lambda: nn.Dropout(0.0), "p", 1.0, (2, 3)),
    "Dropout training": (lambda: nn.Dropout(1.0), "training", False, (2, 3)),
    "Dropout inplace": (lambda: nn.Dropout(0.0), "inplace", True, (2, 3)),
    "ReLU inplace": (nn.ReLU, "inplace", True, (2, 3)),
    "LayerNorm eps": (lambda: nn.LayerNorm(3), "eps", 10.0, (2, 3)),
    "BatchNorm eps": (lambda: nn.BatchNorm1d(3), "eps", 10.0, (4, 3)),
    "BatchNorm training": (lambda: nn.BatchNorm1d(3), "training", False, (4, 3)),
    "Conv padding": (lambda: nn.Conv1d(3, 2, 3), "padding", (1,), (1, 3, 4)),
    "Softmax dim": (lambda: nn.Softmax(dim=1), "dim", 0, (2, 3)),
    "GELU approximate": (nn.GELU, "approximate", "tanh", (2, 3)),
    "Flatten start_dim": (nn.Flatten, "start_dim", 0, (2, 3, 2)),
    "Linear weight": (lambda: nn.Linear(3, 3), "weight", nn.Parameter(torch.ones(3, 3)), (2, 3)),
}


@pytest.mark.parametrize("name", sorted(PRE_HOOK_CHANGES))
def test_pre_hook_changes_layer_attribute(name: str) -> None:
    make, attr, value, shape = PRE_HOOK_CHANGES[name]
    x = _input(shape)

    def body(m: nn.Module) -> Any:
        first = total(m(x.clone()))

        def pre(mod: Any, args: Any) -> None:
            setattr(mod, attr, value)

        m.register_forward_pre_hook(pre)
        y = x.clone()
        return first, total(m(y)), total(y), total(m(x.clone()))

    same(make, body)
