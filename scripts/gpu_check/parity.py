"""Stock torch against fastmodule on one device, exactly: the checks of ``make gpu-check``.

Each check runs the same operation twice, on two identical models: once on stock torch
and once with fastmodule's native paths on (``fastmodule.accelerated`` around the whole
operation, or a ``fastmodule.Module`` subclass built from the same methods as a stock
one), and compares everything the operation leaves visible: its return value or
exception, the output, every parameter, buffer and gradient (device, dtype, shape,
values, bit for bit), which ``nn.Parameter`` objects survived, and what hooks saw.

    python parity.py --device cuda --out parity.json [--skip NAME ...]

On ``--device cpu`` (the dry run) every check keeps its structure; what needs a CUDA
device is replaced by its CPU equivalent (``.cpu()`` for ``.cuda()``, an eager replay
for a CUDA graph's) or skipped, and each record's ``note`` says which. The JSON file is
rewritten after every check, so a run stopped by a timeout keeps the checks it finished.
Exit status: 0 when every check passed or was skipped, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fastmodule

#: Version of the JSON written here (``parity.json``).
SCHEMA = 1


class Mismatch(AssertionError):
    """Stock and fastmodule disagree."""


class Skip(Exception):
    """The check does not apply here (its message says why)."""


# --- describing results --------------------------------------------------------------


class Described(dict):
    """A tensor as :func:`plain` describes it (left as it is by a second ``plain``)."""


def plain(value: Any) -> Any:
    """``value`` as comparable data: tensors by device, dtype, shape, flags and values
    (copied to the CPU), containers element by element, anything else as itself or by
    its type."""
    if isinstance(value, Described):
        return value
    if isinstance(value, torch.Tensor):
        t = value.detach()
        out = Described(
            {
                "tensor": type(value).__name__,
                "device": str(t.device),
                "dtype": str(t.dtype),
                "shape": tuple(t.shape),
                "requires_grad": value.requires_grad,
                "values": t.to("cpu", copy=True),
            }
        )
        if isinstance(value, nn.Parameter):
            out["grad"] = plain(value.grad)
        return out
    if hasattr(value, "_asdict"):  # NamedTuple, e.g. load_state_dict's keys
        return {"namedtuple": type(value).__name__, **plain(value._asdict())}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return f"<{type(value).__name__}>"


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two :func:`plain` values differ (empty: identical)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            if a.is_floating_point() and a.shape == b.shape and a.dtype == b.dtype:
                diff = (a.double() - b.double()).abs().nan_to_num(float("inf")).max().item()
                return [f"{path or 'value'}: values differ (max abs diff {diff:g})"]
            return [f"{path or 'value'}: values differ"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path or 'value'}: keys {list(a)} != {list(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}" if path else k)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path or 'value'}: length {len(a)} != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    if type(a) is not type(b) or a != b:
        return [f"{path or 'value'}: {a!r} != {b!r}"]
    return []


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """``fn()``'s value (as :func:`plain`) or the type and text of what it raised."""
    try:
        return {"ok": plain(fn())}
    except Exception as e:  # noqa: BLE001 - the exception is the result compared
        return {"raised": type(e).__name__, "message": str(e)}


def snapshot(model: nn.Module) -> dict[str, Any]:
    """Every parameter (with its grad) and buffer of ``model``, and each module's mode."""
    return {
        "parameters": {n: plain(p) for n, p in model.named_parameters()},
        "buffers": {n: plain(b) for n, b in model.named_buffers()},
        "training": [m.training for m in model.modules()],
    }


@contextlib.contextmanager
def kept_objects(model: nn.Module, into: dict[str, Any]) -> Iterator[None]:
    """On exit, ``into["kept"]``: for each parameter and buffer name, whether the same
    object is there as on entry (a conversion keeps or replaces them)."""
    before = {n: t for n, t in model.named_parameters()} | {n: t for n, t in model.named_buffers()}
    yield
    after = {n: t for n, t in model.named_parameters()} | {n: t for n, t in model.named_buffers()}
    into["kept"] = {n: before.get(n) is t for n, t in after.items()}


# --- the models ----------------------------------------------------------------------


def _block_init(self: nn.Module) -> None:
    nn.Module.__init__(self)
    self.proj = nn.Linear(16, 16)
    self.norm = nn.LayerNorm(16)
    self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))
    self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
    self.register_buffer("cache", torch.zeros(16))
    self.register_buffer("offset", torch.full((16,), 0.25), persistent=False)


def _block_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = self.norm(self.proj(x)) * self.scale
    for layer in self.layers:
        h = h + torch.relu(layer(h))
    # A registered buffer rebound in forward (as a KV cache is).
    self.cache = h.detach().mean(0)
    return h + self.cache + self.offset


# One name for both: it is in load_state_dict's error messages.
StockBlock = type("Block", (nn.Module,), {"__init__": _block_init, "forward": _block_forward})
FastBlock = type(
    "Block", (fastmodule.Module,), {"__init__": _block_init, "forward": _block_forward}
)


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)
    )


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    # Eager attention: SDPA's fused CUDA backward kernels may accumulate in any order,
    # and the training checks compare gradients bit for bit.
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=128,
        n_positions=32,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    return GPT2LMHeadModel(config).eval()


@dataclass(frozen=True)
class Zoo:
    """One model: stock and fast builds with equal values, its inputs, how it is called."""

    name: str
    stock: Callable[[], nn.Module]
    fast: Callable[[], nn.Module]
    #: ``inputs(device, seed)``: the call's positional arguments.
    inputs: Callable[[torch.device, int], tuple[Any, ...]]
    run: Callable[..., torch.Tensor] = field(default=lambda m, *a: m(*a))
    #: Whether the model is made of torch's classes only (rather than a
    #: ``fastmodule.Module`` subclass at its root).
    accelerate: bool = True


def _seeded(build: Callable[[], nn.Module], seed: int = 0) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        torch.manual_seed(seed)
        return build()

    return make


def _randn(*shape: int) -> Callable[[torch.device, int], tuple[Any, ...]]:
    def inputs(device: torch.device, seed: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g).to(device),)

    return inputs


def _ids(device: torch.device, seed: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 128, (1, 8), generator=g).to(device),)


def zoo() -> list[Zoo]:
    """The models every check runs on (GPT-2 only where transformers is installed)."""
    models = [
        Zoo("mlp", _seeded(_mlp), _seeded(_mlp), _randn(8, 16)),
        Zoo("cnn", _seeded(_cnn), _seeded(_cnn), _randn(2, 3, 16, 16)),
        Zoo("block", _seeded(StockBlock), _seeded(FastBlock), _randn(8, 16), accelerate=False),
    ]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return models
    return models + [
        Zoo(
            "gpt2",
            _seeded(_gpt2),
            _seeded(_gpt2),
            _ids,
            run=lambda m, ids: m(ids, use_cache=False).logits,
        )
    ]


@dataclass
class Ctx:
    """Where a run happens."""

    device: torch.device
    #: The device state is moved from and loaded across: the CPU beside a CUDA device;
    #: on a CPU run the CPU itself.
    other: torch.device
    natives: dict[str, bool] = field(default_factory=dict)
    #: Comparisons made by the current check, and those where both sides raised alike.
    compared: int = 0
    raised: list[str] = field(default_factory=list)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def both(ctx: Ctx, entry: Zoo, op: Callable[[nn.Module], Any]) -> tuple[Any, Any]:
    """``op`` on a fresh stock model and on a fresh fast one (native paths on around
    the whole of it): both results as :func:`plain` data, or what each raised."""
    stock = entry.stock()
    if any(fastmodule.is_accelerated(m) for m in stock.modules()):
        raise RuntimeError(f"{entry.name}: the stock model has accelerated classes")
    torch.manual_seed(1234)
    result_stock = outcome(lambda: op(stock))
    ctx.sync()
    fast = entry.fast()
    # A fastmodule.Module subclass is fast by itself; its torch children are accelerated.
    with fastmodule.accelerated(fast):
        ctx.natives[entry.name] = all(fastmodule.is_accelerated(m) for m in fast.modules())
        torch.manual_seed(1234)
        result_fast = outcome(lambda: op(fast))
        ctx.sync()
    return result_stock, result_fast


def compare(ctx: Ctx, what: str, op: Callable[[nn.Module], Any], models: list[Zoo]) -> None:
    """:func:`both` for each model; raises :class:`Mismatch` listing every difference.
    Where stock raised and fast raised the same, ``ctx.raised`` says so (the check
    then compared exceptions, not results)."""
    problems: list[str] = []
    for entry in models:
        s, f = both(ctx, entry, op)
        ctx.compared += 1
        diff = differences(s, f)
        if diff:
            problems += [f"{what} [{entry.name}] {d}" for d in diff[:8]]
        elif "raised" in s:
            ctx.raised.append(f"{what} [{entry.name}] {s['raised']}: {s['message'][:300]}")
    if problems:
        raise Mismatch("\n".join(problems))


# --- the checks ----------------------------------------------------------------------


def check_initial_state(ctx: Ctx) -> str | None:
    """Stock and fast builds start equal (else nothing below would mean anything)."""
    compare(ctx, "built", snapshot, zoo())
    return None


def check_call(ctx: Ctx) -> str | None:
    """The module call on the device: eval under no_grad, then train mode (BatchNorm's
    running statistics) with a backward pass (every gradient)."""

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            m.to(ctx.device)
            x1, x2 = entry.inputs(ctx.device, 1), entry.inputs(ctx.device, 2)
            with torch.no_grad():
                evaluated = entry.run(m.eval(), *x1)
            trained = entry.run(m.train(), *x2)
            trained.float().square().mean().backward()
            return {"eval": evaluated, "train": trained, "state": snapshot(m)}

        return run

    for entry in zoo():
        compare(ctx, "call", op(entry), [entry])
    return None


def check_hooks(ctx: Ctx) -> str | None:
    """Forward pre-hook, forward hook and full backward hook on the device: what each
    saw, in order, and the outputs and gradients they shaped."""

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            m.to(ctx.device).train()
            log: list[Any] = []
            first = next(c for c in m.modules() if isinstance(c, nn.Linear))
            first.register_forward_pre_hook(lambda mod, args: log.append(("pre", plain(args))))

            def forward_hook(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
                log.append(("forward", plain(out)))
                return out * 2

            first.register_forward_hook(forward_hook)
            first.register_full_backward_hook(
                lambda mod, gin, gout: log.append(("backward", plain(gout)))
            )
            out = entry.run(m, *entry.inputs(ctx.device, 3))
            out.float().sum().backward()
            return {"out": out, "log": log, "state": snapshot(m)}

        return run

    for entry in zoo():
        compare(ctx, "hooks", op(entry), [entry])
    return None


def _with_grads(entry: Zoo) -> Callable[[nn.Module], None]:
    def give(m: nn.Module) -> None:
        entry.run(m, *entry.inputs(torch.device("cpu"), 4)).float().sum().backward()

    return give


def _conversions(ctx: Ctx) -> list[tuple[str, Callable[[nn.Module], nn.Module]]]:
    dev = ctx.device
    return [
        ("to(device)", lambda m: m.to(dev)),
        ("to(device=..)", lambda m: m.to(device=dev)),
        ("to(str)", lambda m: m.to(str(dev))),
        ("to(device, float64)", lambda m: m.to(dev, torch.float64)),
        ("to(device, non_blocking)", lambda m: m.to(dev, non_blocking=True)),
        ("to(tensor)", lambda m: m.to(torch.empty(0, device=dev, dtype=torch.float64))),
        ("to(device).to(float64).to(float32)", lambda m: m.to(dev).to(torch.float64).float()),
        ("to(device).to(other)", lambda m: m.to(dev).to(ctx.other)),
    ]


def _convert(
    ctx: Ctx, entry: Zoo, convert: Callable[[nn.Module], nn.Module], grads: bool
) -> Callable[[nn.Module], Any]:
    def run(m: nn.Module) -> Any:
        if grads:
            _with_grads(entry)(m)
        seen: dict[str, Any] = {}
        with kept_objects(m, seen):
            returned = convert(m)
        ctx.sync()
        device = next(m.parameters()).device
        dtype = next(m.parameters()).dtype
        x = tuple(
            a.to(device, dtype) if a.is_floating_point() else a.to(device)
            for a in entry.inputs(device, 5)
        )
        with torch.no_grad():
            out = entry.run(m.eval(), *x)
        return {"returned_self": returned is m, **seen, "state": snapshot(m), "out": out}

    return run


def _future_flags() -> list[tuple[str, Callable[[bool], None], Callable[[], bool]]]:
    flags = [
        (
            "overwrite_module_params_on_conversion",
            torch.__future__.set_overwrite_module_params_on_conversion,
            torch.__future__.get_overwrite_module_params_on_conversion,
        )
    ]
    if hasattr(torch.__future__, "set_swap_module_params_on_conversion"):
        flags.append(
            (
                "swap_module_params_on_conversion",
                torch.__future__.set_swap_module_params_on_conversion,
                torch.__future__.get_swap_module_params_on_conversion,
            )
        )
    return flags


def check_to(ctx: Ctx) -> str | None:
    """``.to`` onto the device in each of its forms, with and without gradients, and
    under torch.__future__'s conversion flags: the value returned, which parameter
    objects survived, every tensor after, and the call that follows."""
    for entry in zoo():
        for name, convert in _conversions(ctx):
            for grads in (False, True):
                label = f"{name}{' with grads' if grads else ''}"
                compare(ctx, label, _convert(ctx, entry, convert, grads), [entry])
        for flag, set_flag, get_flag in _future_flags():
            was = get_flag()
            set_flag(True)
            try:
                compare(
                    ctx,
                    f"to(device) under {flag}",
                    _convert(ctx, entry, lambda m: m.to(ctx.device), grads=True),
                    [entry],
                )
            finally:
                set_flag(was)
    if not ctx.cuda:
        return "no CUDA device: every move is CPU to CPU (a no-op move); dtypes still convert"
    return None


def check_cuda_methods(ctx: Ctx) -> str | None:
    """``.cuda()`` in its forms, ``.cpu()`` back, and ``.half()``/``.double()``/``.float()``
    on the device (on a CPU run: ``.cpu()`` and the dtype methods only)."""
    if ctx.cuda:
        index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
        methods: list[tuple[str, Callable[[nn.Module], nn.Module]]] = [
            ("cuda()", lambda m: m.cuda()),
            ("cuda(index)", lambda m: m.cuda(index)),
            ("cuda(device)", lambda m: m.cuda(torch.device("cuda", index))),
            ("cuda().cpu()", lambda m: m.cuda().cpu()),
        ]
        note = None
    else:
        methods = [("cpu()", lambda m: m.cpu())]
        note = ".cuda() needs a CUDA device: its CPU equivalent .cpu() was checked in its place"
    methods += [
        ("half().float()", lambda m: m.to(ctx.device).half().float()),
        ("double()", lambda m: m.to(ctx.device).double()),
        ("bfloat16().float()", lambda m: m.to(ctx.device).bfloat16().float()),
    ]
    for entry in zoo():
        for name, method in methods:
            for grads in (False, True):
                label = f"{name}{' with grads' if grads else ''}"
                compare(ctx, label, _convert(ctx, entry, method, grads), [entry])
    return note


def _other_state(entry: Zoo) -> dict[str, torch.Tensor]:
    """A state_dict of the same architecture with other values (seed 7), on the CPU."""
    torch.manual_seed(7)
    model = entry.stock()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _loads(ctx: Ctx, entry: Zoo) -> list[tuple[str, Callable[[nn.Module], Any]]]:
    dev, other = ctx.device, ctx.other
    source = _other_state(entry)

    def moved(sd: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in sd.items()}

    def load(device: torch.device, sd_device: torch.device, **kw: Any) -> Callable[..., Any]:
        def run(m: nn.Module) -> Any:
            m.to(device)
            sd = moved(source, sd_device)
            seen: dict[str, Any] = {}
            with kept_objects(m, seen):
                result = outcome(lambda: m.load_state_dict(sd, **kw))
            return {"result": result, **seen, "state": snapshot(m)}

        return run

    def partial(m: nn.Module) -> Any:
        m.to(dev)
        sd = moved(source, other)
        sd.pop(next(iter(sd)))
        sd["not_a_key"] = torch.zeros(1)
        strict = outcome(lambda: m.load_state_dict(sd))
        loose = outcome(lambda: m.load_state_dict(sd, strict=False))
        return {"strict": strict, "loose": loose, "state": snapshot(m)}

    def float64(m: nn.Module) -> Any:
        m.to(dev)
        sd = {k: v.double() if v.is_floating_point() else v for k, v in source.items()}
        return {"result": m.load_state_dict(sd), "state": snapshot(m)}

    def saved(m: nn.Module) -> Any:
        m.to(other)
        buf = io.BytesIO()
        torch.save(m.state_dict(), buf)
        buf.seek(0)
        sd = torch.load(buf, map_location=dev, weights_only=True)
        target = entry.stock() if entry.accelerate else type(m)()
        fresh = target.to(dev)
        return {"result": fresh.load_state_dict(sd), "loaded": plain(sd), "state": snapshot(fresh)}

    return [
        (f"load {other.type} state into {dev.type} model", load(dev, other)),
        (f"load {dev.type} state into {other.type} model", load(other, dev)),
        (f"load {dev.type} state into {other.type} model, assign", load(other, dev, assign=True)),
        (f"load {other.type} state into {dev.type} model, assign", load(dev, other, assign=True)),
        ("load with a missing and an unexpected key, strict and not", partial),
        ("load float64 state into the float32 model", float64),
        ("torch.save/torch.load(map_location) round trip", saved),
    ]


def check_state_dict(ctx: Ctx) -> str | None:
    """``state_dict`` on the device (values, devices, keep_vars identity, prefix), and
    ``load_state_dict`` across devices (copy and assign), with wrong keys, another
    dtype, and through torch.save/torch.load with map_location."""

    def state(m: nn.Module) -> Any:
        m.to(ctx.device)
        named = dict(m.named_parameters()) | dict(m.named_buffers())
        kept = m.state_dict(keep_vars=True)
        return {
            "state_dict": m.state_dict(),
            "prefixed": list(m.state_dict(prefix="p.")),
            "keep_vars_same_objects": {k: v is named.get(k) for k, v in kept.items()},
        }

    compare(ctx, "state_dict", state, zoo())
    for entry in zoo():
        for name, op in _loads(ctx, entry):
            compare(ctx, name, op, [entry])
    if not ctx.cuda:
        return "no CUDA device: 'across devices' is CPU to CPU here"
    return None


class Replayer:
    """A CUDA graph of ``step`` (captured after warm-up on a side stream, as torch's
    documentation does), or, without a CUDA device, ``step`` itself run again."""

    def __init__(self, ctx: Ctx, step: Callable[[], None], warmup: int = 3) -> None:
        self.ctx = ctx
        if not ctx.cuda:
            self.graph = None
            self.step = step
            step()
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            step()

    def replay(self) -> None:
        if self.graph is None:
            self.step()
        else:
            self.graph.replay()
            torch.cuda.synchronize()


def check_graph_inference(ctx: Ctx) -> str | None:
    """The module call captured in a CUDA graph (``torch.cuda.graph`` around a
    ``torch.cuda.CUDAGraph``), replayed on new inputs copied into the static ones: the
    static outputs after each replay, and the eager call on the same input."""

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            m.to(ctx.device).eval()
            static = entry.inputs(ctx.device, 10)
            held: dict[str, torch.Tensor] = {}

            def step() -> None:
                with torch.no_grad():
                    held["out"] = entry.run(m, *static)

            replayer = Replayer(ctx, step)
            replays = []
            for seed in (11, 12):
                for s, new in zip(static, entry.inputs(ctx.device, seed), strict=True):
                    s.copy_(new)
                replayer.replay()
                replays.append(plain(held["out"]))
            with torch.no_grad():
                eager = entry.run(m, *static)
            return {"replays": replays, "eager": eager, "state": snapshot(m)}

        return run

    for entry in zoo():
        compare(ctx, "graph replay", op(entry), [entry])
    if not ctx.cuda:
        return "no CUDA device: the step ran eagerly where a CUDA graph would replay it"
    return None


def check_graph_training(ctx: Ctx) -> str | None:
    """A whole training step (forward, loss, backward, SGD step) captured in one CUDA
    graph, as in torch's documentation, replayed on new data: the parameters after."""

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            m.to(ctx.device).train()
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            static = entry.inputs(ctx.device, 20)
            held: dict[str, torch.Tensor] = {}

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                loss = entry.run(m, *static).float().square().mean()
                loss.backward()
                opt.step()
                held["loss"] = loss

            replayer = Replayer(ctx, step)
            losses = []
            for seed in (21, 22):
                for s, new in zip(static, entry.inputs(ctx.device, seed), strict=True):
                    s.copy_(new)
                replayer.replay()
                losses.append(plain(held["loss"]))
            return {"losses": losses, "state": snapshot(m)}

        return run

    for entry in zoo():
        if entry.name in ("mlp", "block"):
            compare(ctx, "graph training step", op(entry), [entry])
    if not ctx.cuda:
        return "no CUDA device: the step ran eagerly where a CUDA graph would replay it"
    return None


def check_make_graphed_callables(ctx: Ctx) -> str | None:
    """``torch.cuda.make_graphed_callables(module, sample_args)`` in train mode (forward
    and backward graphs; it replaces the module's ``forward``): outputs and gradients
    of two graphed iterations."""
    if not ctx.cuda:
        raise Skip("make_graphed_callables needs a CUDA device (no CPU equivalent)")

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            m.to(ctx.device).train()
            graphed = torch.cuda.make_graphed_callables(m, entry.inputs(ctx.device, 30))
            outs = []
            for seed in (31, 32):
                out = graphed(*entry.inputs(ctx.device, seed))
                out.square().mean().backward()
                outs.append(plain(out))
            return {"returned_self": graphed is m, "outs": outs, "state": snapshot(m)}

        return run

    for entry in zoo():
        if entry.name in ("mlp", "block"):
            compare(ctx, "make_graphed_callables", op(entry), [entry])
    return None


def check_compile_reduce_overhead(ctx: Ctx) -> str | None:
    """``torch.compile(model, mode="reduce-overhead")`` (CUDA graphs under Inductor):
    the outputs of repeated calls on old and new inputs, and how many graphs Dynamo
    made and where it broke them. Stock and fast must agree exactly."""
    from torch._dynamo.utils import counters

    def op(entry: Zoo) -> Callable[[nn.Module], Any]:
        def run(m: nn.Module) -> Any:
            torch._dynamo.reset()
            counters.clear()
            m.to(ctx.device).eval()
            compiled = torch.compile(m, mode="reduce-overhead")
            outs = []
            with torch.no_grad():
                for seed in (40, 40, 41, 42):
                    torch.compiler.cudagraph_mark_step_begin()
                    outs.append(plain(entry.run(compiled, *entry.inputs(ctx.device, seed))))
                eager = entry.run(m, *entry.inputs(ctx.device, 42))
            last = outs[-1]["values"]
            close = torch.allclose(last, eager.cpu(), rtol=1e-4, atol=1e-5)
            return {
                "outs": outs,
                "close_to_eager": close,
                "unique_graphs": counters["stats"]["unique_graphs"],
                "graph_breaks": dict(counters["graph_break"]),
                "state": snapshot(m),
            }

        return run

    try:
        for entry in zoo():
            if entry.name in ("mlp", "block"):
                compare(ctx, "compile(reduce-overhead)", op(entry), [entry])
    finally:
        torch._dynamo.reset()
    if ctx.raised:
        raise Skip("torch.compile failed on stock torch too: " + "; ".join(ctx.raised))
    if not ctx.cuda:
        return "no CUDA device: reduce-overhead compiled for the CPU (Inductor, no CUDA graphs)"
    return None


CHECKS: tuple[tuple[str, Callable[[Ctx], str | None]], ...] = (
    ("initial_state", check_initial_state),
    ("call", check_call),
    ("hooks", check_hooks),
    ("to", check_to),
    ("cuda_methods", check_cuda_methods),
    ("state_dict", check_state_dict),
    ("cuda_graph_inference", check_graph_inference),
    ("cuda_graph_training", check_graph_training),
    ("make_graphed_callables", check_make_graphed_callables),
    ("compile_reduce_overhead", check_compile_reduce_overhead),
)
CHECK_NAMES = tuple(name for name, _ in CHECKS)


def run_checks(device: str, out: Path, skip: list[str]) -> int:
    """Run every check on ``device``, writing ``out`` after each; the exit status."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            print("parity: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
            return 2
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    ctx = Ctx(device=dev, other=torch.device("cpu"))
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "device": str(dev),
        "cuda_device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "fastmodule": fastmodule.__version__,
        "native": None,
        "models": [z.name for z in zoo()],
        "planned": list(CHECK_NAMES),
        "checks": [],
    }

    def write() -> None:
        report["native"] = dict(ctx.natives)
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    failed = False
    for name, check in CHECKS:
        start = time.perf_counter()
        record: dict[str, Any] = {"name": name, "status": "pass", "note": None, "detail": None}
        ctx.compared, ctx.raised = 0, []
        if name in skip:
            record.update(status="skipped", note="not run (--skip)")
        else:
            try:
                record["note"] = check(ctx)
                if ctx.raised:
                    alike = "stock and fast raised alike: " + "; ".join(ctx.raised)
                    record["note"] = "; ".join(filter(None, [record["note"], alike]))
            except Skip as e:
                record.update(status="skipped", note=str(e))
            except Mismatch as e:
                record.update(status="fail", detail=str(e))
            except Exception:  # noqa: BLE001 - a check that breaks is reported, not fatal
                record.update(status="error", detail=traceback.format_exc())
        record["comparisons"] = ctx.compared
        record["seconds"] = round(time.perf_counter() - start, 2)
        failed |= record["status"] in ("fail", "error")
        report["checks"].append(record)
        write()
        line = f"parity: {name:<24} {record['status']:<7} {record['seconds']:6.1f} s"
        print(line + (f"  ({record['note']})" if record["note"] else ""), flush=True)
        if record["detail"]:
            print(record["detail"], flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    parser.add_argument("--skip", action="append", default=[], choices=CHECK_NAMES)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # The hooks check's inputs need no gradient (GPT-2's are token ids): torch says so.
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    return run_checks(args.device, args.out, args.skip)


if __name__ == "__main__":
    sys.exit(main())
