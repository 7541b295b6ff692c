"""torch's common layers run without their Python frames (``src/call/layers/``):
the same outputs and gradients bit for bit as stock, in train and eval, with and
without grad; torch's own code wherever anything differs (a subclass's forward,
a patched ``F`` function, a ``__torch_function__`` input or mode, hooks); and
no Python frame of torch's forward on the native route."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.testing._internal.common_modules import module_db
from torch.utils._python_dispatch import TorchDispatchMode

import fastmodule
from fastmodule._verified import layers
from tests.conftest import NATIVE, outcome

# (Where no native path is on at all, the comparisons run: both sides run torch's code.)
pytestmark = pytest.mark.skipif(
    NATIVE and layers.LAYERS is not None, reason="layer forwards not native here"
)

COVERED = {
    nn.LayerNorm: "layer_norm",
    nn.RMSNorm: "rms_norm",
    nn.Embedding: "embedding",
    nn.GELU: "gelu",
    nn.SiLU: "silu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.Softmax: "softmax",
    nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d",
    nn.BatchNorm1d: "batch_norm",
    nn.BatchNorm2d: "batch_norm",
    nn.MaxPool2d: "max_pool2d",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d",
}
INFOS = [m for m in module_db if m.module_cls in COVERED]


def clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        c = x.detach().clone()
        c.requires_grad_(x.requires_grad)
        return c
    if isinstance(x, tuple | list):
        return type(x)(clone(v) for v in x)
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    return x


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.stride() == b.stride()
            and torch.equal(a.nan_to_num(), b.nan_to_num())
            and torch.equal(a.isnan(), b.isnan())
        )
    if isinstance(a, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b or (a != a and b != b)


def run(
    build: Callable[[], nn.Module],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    train: bool,
    grad: bool,
    accelerate: bool,
) -> Any:
    torch.manual_seed(0)
    m = build()
    m.train(train)
    args, kwargs = clone(args), clone(kwargs)

    def go() -> Any:
        out: list[Any] = []
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):  # warm calls: the native caches
                torch.manual_seed(1)
                with torch.set_grad_enabled(grad):
                    out.append(outcome(lambda: m(*args, **kwargs)))
        # Where a warning is attributed: see test_softmax_dim_none_warns_where_stock_does.
        out.append([(x.category, str(x.message)) for x in w])
        r = out[-2]
        if grad and r[0] == "ok" and isinstance(r[1], torch.Tensor) and r[1].requires_grad:
            r[1].float().sum().backward()
            out.append({k: p.grad for k, p in m.named_parameters()})
            out.append([a.grad for a in args if isinstance(a, torch.Tensor)])
        out.append({k: b for k, b in m.named_buffers()})
        return out

    if accelerate:
        with fastmodule.accelerated(m):
            return go()
    return go()


def parity(build: Callable[[], nn.Module], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for train in (True, False):
        for grad in (True, False):
            stock = run(build, args, kwargs, train, grad, False)
            fast = run(build, args, kwargs, train, grad, True)
            assert same(stock, fast), (train, grad)


def samples(info: Any) -> list[Any]:
    out = []
    for training in (True, False):
        for requires_grad in (True, False):
            try:
                got = info.module_inputs_func(
                    info,
                    device="cpu",
                    dtype=torch.float32,
                    requires_grad=requires_grad,
                    training=training,
                )
            except TypeError:
                continue
            out += got
    return out


@pytest.mark.parametrize("info", INFOS, ids=lambda i: i.name)
def test_module_db_parity(info: Any) -> None:
    for sample in samples(info):
        c = sample.constructor_input

        def build(c: Any = c) -> nn.Module:
            return info.module_cls(*c.args, **c.kwargs)

        f = sample.forward_input
        if f is None:
            continue
        parity(build, tuple(f.args), dict(f.kwargs))


def x(*shape: int, rg: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(99)
    return torch.randn(*shape, generator=g).requires_grad_(rg)


HAND: list[tuple[str, Callable[[], nn.Module], tuple[Any, ...]]] = [
    ("identity", nn.Identity, (x(3, 4),)),
    ("identity_obj", nn.Identity, ("not a tensor",)),
    ("flatten", nn.Flatten, (x(2, 3, 4),)),
    ("flatten_dims", lambda: nn.Flatten(0, -1), (x(2, 3, 4),)),
    ("unflat_error", lambda: nn.Flatten(3, 9), (x(2, 3),)),
    ("dropout", nn.Dropout, (x(8, 8),)),
    ("dropout_inplace", lambda: nn.Dropout(0.3, inplace=True), (x(8, 8, rg=False),)),
    ("dropout_p0", lambda: nn.Dropout(0.0), (x(8, 8),)),
    ("dropout_p1", lambda: nn.Dropout(1.0), (x(8, 8),)),
    ("dropout_int_p", lambda: nn.Dropout(1), (x(8, 8),)),
    ("dropout1d", nn.Dropout1d, (x(2, 3, 4),)),
    ("dropout1d_unbatched", nn.Dropout1d, (x(3, 4),)),
    ("dropout1d_bad", nn.Dropout1d, (x(3, 4, 5, 6),)),
    ("dropout2d", nn.Dropout2d, (x(2, 3, 4, 5),)),
    ("dropout2d_3d", nn.Dropout2d, (x(3, 4, 5),)),
    ("dropout2d_5d", nn.Dropout2d, (x(1, 3, 4, 5, 2),)),
    ("dropout3d", nn.Dropout3d, (x(2, 3, 4, 5, 2),)),
    ("dropout3d_4d", nn.Dropout3d, (x(3, 4, 5, 2),)),
    ("alpha_dropout", nn.AlphaDropout, (x(8, 8),)),
    ("feature_alpha_dropout", nn.FeatureAlphaDropout, (x(2, 3, 4, 4),)),
    ("softmax_none", nn.Softmax, (x(2, 3),)),
    ("softmax_none_3d", nn.Softmax, (x(2, 3, 4),)),
    ("embedding_pad", lambda: nn.Embedding(10, 3, padding_idx=2), (torch.tensor([[1, 2, 9]]),)),
    (
        "embedding_pad_neg",
        lambda: nn.Embedding(10, 3, padding_idx=-2),
        (torch.tensor([[1, 8, 9]]),),
    ),
    ("embedding_pad0", lambda: nn.Embedding(10, 3, padding_idx=0), (torch.tensor([[0, 8, 9]]),)),
    ("embedding_max_norm", lambda: nn.Embedding(10, 3, max_norm=1.0), (torch.tensor([[1, 8, 9]]),)),
    ("embedding_oob", lambda: nn.Embedding(10, 3), (torch.tensor([[1, 80]]),)),
    (
        "conv2d_reflect",
        lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
        (x(1, 2, 5, 5),),
    ),
    # (Not padding="same" with an even kernel: its C++ warning is emitted once per
    # process, so whichever side runs first sees it.)
    ("conv2d_bad", lambda: nn.Conv2d(2, 3, 3), (x(1, 4, 5, 5),)),
    ("bn2d_wrong_rank", lambda: nn.BatchNorm2d(3), (x(2, 3, 4),)),
    ("bn2d_one_value", lambda: nn.BatchNorm2d(3), (x(1, 3, 1, 1),)),
    ("bn2d_no_stats", lambda: nn.BatchNorm2d(3, track_running_stats=False), (x(2, 3, 2, 2),)),
    ("bn2d_cma", lambda: nn.BatchNorm2d(3, momentum=None), (x(2, 3, 2, 2),)),
    ("bn1d_2d", lambda: nn.BatchNorm1d(3), (x(4, 3),)),
    ("bn2d_eps0", lambda: nn.BatchNorm2d(3, eps=0.0), (x(2, 3, 2, 2),)),
    ("bn2d_eps_neg", lambda: nn.BatchNorm2d(3, eps=-1.0), (x(2, 3, 2, 2),)),
    ("bn2d_eps_nan", lambda: nn.BatchNorm2d(3, eps=float("nan")), (x(2, 3, 2, 2),)),
    ("dropout_nan", lambda: nn.Dropout(float("nan")), (x(4, 4),)),
    ("maxpool_indices", lambda: nn.MaxPool2d(2, return_indices=True), (x(1, 2, 4, 4),)),
    ("maxpool_ceil", lambda: nn.MaxPool2d(3, 2, ceil_mode=True), (x(1, 2, 5, 5),)),
    ("adaptive_none", lambda: nn.AdaptiveAvgPool2d((None, 2)), (x(1, 2, 5, 5),)),
    ("adaptive_list", lambda: nn.AdaptiveAvgPool2d([3, 2]), (x(1, 2, 5, 5),)),
    ("adaptive_too_long", lambda: nn.AdaptiveAvgPool2d((1, 1, 1, 1)), (x(2, 5, 5),)),
    ("silu_inplace", lambda: nn.SiLU(inplace=True), (x(3, 4, rg=False),)),
    ("gelu_tanh", lambda: nn.GELU("tanh"), (x(3, 4),)),
    ("gelu_bad", lambda: nn.GELU("nope"), (x(3, 4),)),
    ("layer_norm_bad", lambda: nn.LayerNorm(5), (x(3, 4),)),
]


@pytest.mark.parametrize(("name", "build", "args"), HAND, ids=[h[0] for h in HAND])
def test_hand_parity(name: str, build: Callable[[], nn.Module], args: tuple[Any, ...]) -> None:
    parity(build, args, {})


def test_changed_attributes_followed() -> None:
    """Values changed between calls (p, training, eps, padding_mode...) are seen."""

    def build() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(0.5),
            nn.Linear(4, 3),
        )

    def scenario(m: nn.Module) -> list[Any]:
        inp = x(2, 2, 6, 6)
        out = []
        for step in range(4):
            torch.manual_seed(step)
            out.append(outcome(lambda: m(inp)))
            if step == 0:
                m[6].p = 0.2
                m[1].eps = 0.5
            if step == 1:
                m.eval()
                m[0].padding_mode = "circular"
            if step == 2:
                m[6].p = 1.5  # F.dropout's ValueError
        return out

    torch.manual_seed(0)
    a, b = build(), build()
    b.load_state_dict(a.state_dict())
    stock = scenario(a)
    with fastmodule.accelerated(b):
        fast = scenario(b)
    assert same(stock, fast)


# --------------------------------------------------------------------------- hand-overs


class FramesSeen(TorchDispatchMode):
    """Names of the Python functions on the stack at each aten op."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        f = sys._getframe(1)
        while f is not None:
            if "torch/nn/" in f.f_code.co_filename.replace("\\", "/"):
                self.names.add(f.f_code.co_qualname)
            f = f.f_back
        return func(*args, **(kwargs or {}))


FRAMED: list[tuple[Callable[[], nn.Module], tuple[Any, ...]]] = [
    (lambda: nn.Flatten(), (x(2, 3, 4),)),
    (lambda: nn.Dropout(0.5).train(), (x(4, 4),)),
    (lambda: nn.Dropout2d(0.5).train(), (x(2, 3, 4, 4),)),
    (lambda: nn.LayerNorm(4), (x(3, 4),)),
    (lambda: nn.RMSNorm(4), (x(3, 4),)),
    (lambda: nn.Embedding(10, 4), (torch.tensor([1, 2]),)),
    (lambda: nn.GELU(), (x(3, 4),)),
    (lambda: nn.SiLU(), (x(3, 4),)),
    (lambda: nn.Tanh(), (x(3, 4),)),
    (lambda: nn.Sigmoid(), (x(3, 4),)),
    (lambda: nn.Softmax(-1), (x(3, 4),)),
    (lambda: nn.Conv1d(2, 3, 3), (x(1, 2, 6),)),
    (lambda: nn.Conv2d(2, 3, 3), (x(1, 2, 6, 6),)),
    (lambda: nn.BatchNorm1d(3), (x(4, 3),)),
    (lambda: nn.BatchNorm2d(3), (x(2, 3, 4, 4),)),
    (lambda: nn.MaxPool2d(2), (x(1, 2, 4, 4),)),
    (lambda: nn.AdaptiveAvgPool2d((2, 2)), (x(1, 2, 4, 4),)),
]


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize(("build", "args"), FRAMED)
@pytest.mark.requires_native("no frame of torch's layer code on the native route")
def test_no_frames_on_the_native_route(build: Any, args: Any, train: bool) -> None:
    """Stock enters torch's forward (and ``F``'s function); accelerated, no frame of
    torch's ``nn`` code is on the stack when the ops run. (A tracer or profiler would
    make the call hand over, so the stack is read from the ops' dispatch.)"""
    m = build()
    if not isinstance(m, nn.Dropout | nn.Dropout2d):  # in eval they run no op to watch
        m.train(train)
    stock = FramesSeen()
    with stock:
        m(*args)
    assert any(n.endswith("forward") for n in stock.names)
    fast = FramesSeen()
    with fastmodule.accelerated(m):
        m(*args)  # warm
        with fast:
            m(*args)
    assert fast.names == set()


class Sub(nn.LayerNorm):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) + 1


class Wrapped(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        log.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


log: list[str] = []


class Mode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        log.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _with(m: nn.Module, **attrs: Any) -> nn.Module:
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


HANDOVER = [
    (lambda: nn.LayerNorm(4), lambda: x(3, 4)),
    (lambda: nn.Dropout(0.2), lambda: x(3, 4)),
    (lambda: nn.Embedding(10, 4), lambda: torch.tensor([1, 2])),
    (lambda: nn.Conv2d(2, 3, 3), lambda: x(1, 2, 5, 5)),
    (lambda: nn.BatchNorm2d(2), lambda: x(2, 2, 3, 3)),
    # `_check_input_dim` calls `input.dim()` twice for a 3-d input.
    (lambda: nn.BatchNorm1d(2), lambda: x(3, 2, 4)),
    # An int momentum: torch's forward runs after the rank was checked.
    (lambda: _with(nn.BatchNorm1d(2), momentum=1), lambda: x(3, 2)),
    (lambda: _with(nn.BatchNorm1d(2).eval(), momentum=1), lambda: x(3, 2)),
    (lambda: nn.MaxPool2d(2), lambda: x(1, 2, 4, 4)),
    (lambda: nn.AdaptiveAvgPool2d(1), lambda: x(1, 2, 4, 4)),
    (lambda: nn.SiLU(), lambda: x(3, 4)),
    (lambda: nn.Softmax(0), lambda: x(3, 4)),
    (lambda: nn.GELU(), lambda: x(3, 4)),
]


@pytest.mark.parametrize(("build", "make"), HANDOVER)
@pytest.mark.parametrize("how", ["subclass_input", "mode"])
def test_torch_function_gets_torch_code(build: Any, make: Any, how: str) -> None:
    """A ``__torch_function__`` input or an active mode sees exactly stock's calls."""

    def go(accelerate: bool) -> Any:
        torch.manual_seed(0)
        m = build()
        inp = make()
        log.clear()

        def call() -> Any:
            torch.manual_seed(3)
            if how == "mode":
                with Mode():
                    return m(inp)
            return m(inp.as_subclass(Wrapped))

        if accelerate:
            with fastmodule.accelerated(m):
                r = call()
        else:
            r = call()
        return torch.Tensor(r) if isinstance(r, torch.Tensor) else r, list(log)

    stock, fast = go(False), go(True)
    assert same(stock[0], fast[0])
    assert stock[1] == fast[1]


def test_batch_norm_rank_error_under_mode() -> None:
    """The rank error after `_check_input_dim`'s calls, seen by a mode as stock's."""

    def go(accelerate: bool) -> Any:
        m, inp = nn.BatchNorm1d(2), x(1, 2, 3, 4)
        log.clear()
        with fastmodule.accelerated(m) if accelerate else contextlib.nullcontext(), Mode():
            got = outcome(lambda: m(inp))
        return got, list(log)

    assert go(False) == go(True)


def test_subclass_and_patched_functions_run_torch_code() -> None:
    seen: list[str] = []

    def patched_ln(*a: Any, **k: Any) -> Any:
        seen.append("layer_norm")
        return original(*a, **k)

    m = Sub(4)
    with fastmodule.accelerated(m):
        assert torch.equal(m(x(3, 4)), F.layer_norm(x(3, 4), (4,), m.weight, m.bias) + 1)
        original = F.layer_norm
        F.layer_norm = patched_ln
        try:
            n = nn.LayerNorm(4)
            with fastmodule.accelerated(n):
                n(x(3, 4))
                n(x(3, 4))
        finally:
            F.layer_norm = original
    assert seen == ["layer_norm", "layer_norm"]


def test_forward_hooks_run_torch_code() -> None:
    m = nn.Conv2d(2, 3, 3)
    seen: list[Any] = []
    m.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    with fastmodule.accelerated(m):
        m(x(1, 2, 5, 5))
    assert seen == [torch.Size([1, 3, 3, 3])]


def test_softmax_dim_none_warns_where_stock_does() -> None:
    def go(accelerate: bool) -> Any:
        m = nn.Softmax()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            if accelerate:
                with fastmodule.accelerated(m):
                    m(x(2, 3))
            else:
                m(x(2, 3))
        return [(str(r.message), r.filename, r.lineno) for r in w]

    assert go(False) == go(True)
    assert go(True)
