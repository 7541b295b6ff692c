"""Benchmark cases of module calls with hooks, and of the calls fastmodule hands over
to torch's own ``_call_impl``.

- Hooked calls (``call_forward_hook``, ``call_pre_post_hooks``, ``mlp64_global_hook``,
  ``quant_observers``, ``weight_norm_convs``): the lower bound calls the hooks and the
  forwards directly, with no module machinery.
- The hand-over group (``handover_*``): calls fastmodule does not run natively
  (backward hooks, an own ``__call__``/``__getattribute__``, an unusual instance dict, a
  trace function). Its fast column must stay within 3% of stock; the lower bound is
  stock itself (a hand-over cannot be cheaper than torch's own path).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_py

from fastmodule.acceleration import accelerated
from fastmodule.bench.case import Case, Variant, pair, three
from fastmodule.bench.synthetic import FastIdentity, StockIdentity, identity_forward, torch_mlp

__all__ = ["HOOK_CASES"]


def _pre(module: nn.Module, args: Any) -> None:
    return None


def _post(module: nn.Module, args: Any, output: Any) -> None:
    return None


def _hooked(m: nn.Module, pre: bool) -> nn.Module:
    if pre:
        m.register_forward_pre_hook(_pre)
    m.register_forward_hook(_post)
    return m


def _build_hooked_call(pre: bool) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        x = torch.zeros(1)
        stock, fast = _hooked(StockIdentity(), pre), _hooked(FastIdentity(), pre)
        ns = {"m": stock, "x": x, "f": stock.forward, "pre": _pre, "post": _post}
        lower = "a = (x,); o = f(x); post(m, a, o)"
        if pre:
            lower = "a = (x,); pre(m, a); o = f(x); post(m, a, o)"
        return three(
            Variant("m(x)", {"m": stock, "x": x}),
            Variant("m(x)", {"m": fast, "x": x}),
            Variant(lower, ns),
        )

    return build


@contextlib.contextmanager
def _global_hook() -> Iterator[None]:
    handle = module_py.register_module_forward_hook(_post)
    try:
        yield
    finally:
        handle.remove()


def _mlp_hooked_lower(
    x: torch.Tensor, layers: list[tuple[Any, Any, Any, Any]], top: nn.Module
) -> torch.Tensor:
    """The MLP without module calls, the global hook called once per module call as
    torch would (Linear, ReLU, their Sequential; the outer Sequential last)."""
    for block, lin, relu, (w, b) in layers:
        y = F.linear(x, w, b)
        _post(lin, (x,), y)
        z = F.relu(y)
        _post(relu, (y,), z)
        _post(block, (x,), z)
        x = z
    _post(top, (x,), x)
    return x


def _build_mlp64_global_hook(device: torch.device) -> dict[str, Variant]:
    torch.manual_seed(0)
    stock = torch_mlp().to(device)
    fast = copy.deepcopy(stock)
    layers = [
        (blk, blk[0], blk[1], (blk[0].weight.detach(), blk[0].bias.detach())) for blk in stock
    ]
    x = torch.randn(1, 32, device=device)

    @contextlib.contextmanager
    def stock_context() -> Iterator[None]:
        with torch.inference_mode(), _global_hook():
            yield

    @contextlib.contextmanager
    def fast_context() -> Iterator[None]:
        with torch.inference_mode(), accelerated(fast), _global_hook():
            yield

    with stock_context():
        ref = stock(x)
    with fast_context():
        if not torch.equal(ref, fast(x)):
            raise RuntimeError("mlp64_global_hook: stock and fast disagree")
    return three(
        Variant("m(x)", {"m": stock, "x": x}, stock_context),
        Variant("m(x)", {"m": fast, "x": x}, fast_context),
        Variant(
            "f(x, layers, top)",
            {"f": _mlp_hooked_lower, "x": x, "layers": layers, "top": stock},
            torch.inference_mode,
        ),
    )


def _small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )


def _observed_lower(x: torch.Tensor, leaves: list[tuple[Any, Any]]) -> torch.Tensor:
    """Each layer's forward, then its observer's forward, without module calls."""
    for forward, observe in leaves:
        x = forward(x)
        if observe is not None:
            observe(x)
    return x


def _accelerated_context(fast: nn.Module) -> Callable[[], Any]:
    @contextlib.contextmanager
    def context() -> Iterator[None]:
        with torch.no_grad(), accelerated(fast):
            yield

    return context


def _build_quant_observers(device: torch.device) -> dict[str, Variant]:
    """``torch.ao.quantization.prepare`` on a small CNN: each layer gets an observer
    submodule called from a forward hook."""
    torch.manual_seed(0)
    model = _small_cnn().eval()
    model.qconfig = torch.ao.quantization.default_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = torch.ao.quantization.prepare(model)
    fast = copy.deepcopy(stock)
    leaves = [(leaf.forward, getattr(leaf, "activation_post_process", None)) for leaf in stock]
    leaves = [(f, None if obs is None else obs.forward) for f, obs in leaves]
    x = torch.randn(1, 3, 8, 8)
    context = _accelerated_context(fast)
    with torch.no_grad():
        ref = stock(x)
        with context():
            out = fast(x)
        if not torch.equal(ref, out):
            raise RuntimeError("quant_observers: stock and fast disagree")
    return three(
        Variant("m(x)", {"m": stock, "x": x}, torch.no_grad),
        Variant("m(x)", {"m": fast, "x": x}, context),
        Variant("f(x, leaves)", {"f": _observed_lower, "x": x, "leaves": leaves}, torch.no_grad),
    )


def _weight_norm_lower(x: torch.Tensor, convs: list[tuple[Any, Any, Any]]) -> torch.Tensor:
    """``weight_norm``'s recomputed weight and the convolution, without module calls."""
    for v, g, b in convs:
        x = F.conv1d(x, torch._weight_norm(v, g, 0), b, padding=1)
    return x


def _weight_normed() -> nn.Sequential:
    # Built twice from one seed: a weight_norm'ed module cannot be deep-copied.
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convs = [nn.utils.weight_norm(nn.Conv1d(16, 16, 3, padding=1)) for _ in range(8)]
    with torch.no_grad():
        return nn.Sequential(*convs)


def _build_weight_norm_convs(device: torch.device) -> dict[str, Variant]:
    """8 ``Conv1d`` under the classic ``torch.nn.utils.weight_norm``: a forward
    pre-hook recomputes and assigns each weight on every call."""
    stock, fast = _weight_normed(), _weight_normed()
    convs = [(c.weight_v.detach(), c.weight_g.detach(), c.bias.detach()) for c in stock]
    x = torch.randn(1, 16, 32)
    context = _accelerated_context(fast)
    with torch.no_grad():
        ref = stock(x)
        with context():
            out = fast(x)
        if not torch.equal(ref, out) or not torch.allclose(ref, _weight_norm_lower(x, convs)):
            raise RuntimeError("weight_norm_convs: stock, fast and lower bound disagree")
    return three(
        Variant("m(x)", {"m": stock, "x": x}, torch.no_grad),
        Variant("m(x)", {"m": fast, "x": x}, context),
        Variant("f(x, convs)", {"f": _weight_norm_lower, "x": x, "convs": convs}, torch.no_grad),
    )


# --- hand-overs ------------------------------------------------------------------------


def _own_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return nn.Module.__call__(self, *args, **kwargs)


def _own_getattribute(self: nn.Module, name: str) -> Any:
    return object.__getattribute__(self, name)


StockOwnCall, FastOwnCall = pair("OwnCall", {"forward": identity_forward, "__call__": _own_call})
StockOwnGetattribute, FastOwnGetattribute = pair(
    "OwnGetattribute", {"forward": identity_forward, "__getattribute__": _own_getattribute}
)


def _handover(
    make: Callable[[type[nn.Module]], nn.Module],
    classes: tuple[type[nn.Module], type[nn.Module]] = (StockIdentity, FastIdentity),
    context: Callable[[], Any] = contextlib.nullcontext,
) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        x = torch.zeros(1)
        stock, fast = (make(c) for c in classes)
        return three(
            Variant("m(x)", {"m": stock, "x": x}, context),
            Variant("m(x)", {"m": fast, "x": x}, context),
            Variant("m(x)", {"m": stock, "x": x}, context),
        )

    return build


def _with(register: str) -> Callable[[type[nn.Module]], nn.Module]:
    def make(cls: type[nn.Module]) -> nn.Module:
        m = cls()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(m, register)(lambda *a: None)
        return m

    return make


def _unusual_dict(cls: type[nn.Module]) -> nn.Module:
    m = cls()
    m.__dict__[0] = "a key that is not a str"
    return m


def _build_handover_frame_counting(device: torch.device) -> dict[str, Variant]:
    """torch's ``InstanceNorm1d``, whose ``forward`` warns with a stack level:
    fastmodule keeps torch's call frames for it (``fastmodule._verified.frame_counting``)."""
    stock, fast = nn.InstanceNorm1d(4), nn.InstanceNorm1d(4)
    x = torch.randn(1, 4, 2)
    context = _accelerated_context(fast)
    return three(
        Variant("m(x)", {"m": stock, "x": x}, torch.no_grad),
        Variant("m(x)", {"m": fast, "x": x}, context),
        Variant("m(x)", {"m": stock, "x": x}, torch.no_grad),
    )


@contextlib.contextmanager
def _global_backward_hook() -> Iterator[None]:
    was = module_py._global_is_full_backward_hook
    handle = module_py.register_module_full_backward_hook(lambda *a: None)
    try:
        yield
    finally:
        handle.remove()
        module_py._global_is_full_backward_hook = was


def _quiet_tracer(frame: Any, event: str, arg: Any) -> None:
    return None


@contextlib.contextmanager
def _profile_function() -> Iterator[None]:
    previous = sys.getprofile()
    sys.setprofile(_quiet_tracer)
    try:
        yield
    finally:
        sys.setprofile(previous)


HOOK_CASES: tuple[Case, ...] = (
    Case("call_forward_hook", "m(x) with one forward hook", _build_hooked_call(pre=False)),
    Case(
        "call_pre_post_hooks",
        "m(x) with a forward pre-hook and a forward hook",
        _build_hooked_call(pre=True),
    ),
    Case(
        "mlp64_global_hook",
        "mlp64_accelerated's MLP under one global forward hook (register_module_forward_hook)",
        _build_mlp64_global_hook,
    ),
    Case(
        "quant_observers",
        "small CNN after torch.ao.quantization.prepare (observers called from forward hooks)",
        _build_quant_observers,
    ),
    Case(
        "weight_norm_convs",
        "8 Conv1d(16,16,3) under nn.utils.weight_norm (a forward pre-hook per conv)",
        _build_weight_norm_convs,
    ),
    Case(
        "handover_backward_hook",
        "m(x) with a full backward hook (torch's _call_impl runs it)",
        _handover(_with("register_full_backward_hook")),
    ),
    Case(
        "handover_backward_pre_hook",
        "m(x) with a full backward pre-hook",
        _handover(_with("register_full_backward_pre_hook")),
    ),
    Case(
        "handover_legacy_backward_hook",
        "m(x) with a register_backward_hook hook",
        _handover(_with("register_backward_hook")),
    ),
    Case(
        "handover_global_backward_hook",
        "m(x) under register_module_full_backward_hook",
        _handover(lambda cls: cls(), context=_global_backward_hook),
    ),
    Case(
        "handover_own_call",
        "m(x) on a class whose own __call__ calls nn.Module.__call__",
        _handover(lambda cls: cls(), (StockOwnCall, FastOwnCall)),
    ),
    Case(
        "handover_own_getattribute",
        "m(x) on a class with its own __getattribute__",
        _handover(lambda cls: cls(), (StockOwnGetattribute, FastOwnGetattribute)),
    ),
    Case(
        "handover_unusual_dict",
        "m(x) on a module whose __dict__ has a key that is not a str",
        _handover(_unusual_dict),
    ),
    Case(
        "handover_frame_counting",
        "m(x) on torch's InstanceNorm1d, whose forward counts its caller's frames",
        _build_handover_frame_counting,
    ),
    Case(
        "handover_profile_function",
        "m(x) while a profile function is set (sys.setprofile)",
        _handover(lambda cls: cls(), context=_profile_function),
    ),
)
