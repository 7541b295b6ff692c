"""Thread-stress scenarios for ``tests/test_thread_stress.py``, run in a child process.

torch releases the GIL inside its kernels (``detach``, ``copy_``, ``add_``, dtype
conversions), so another thread runs in the middle of every native path. Each scenario
below runs several threads on one model, stock (``side == "stock"``) or with fastmodule
(``side == "fast"``: user classes derive from ``fastmodule.Module`` and the torch layers
are accelerated in place), under ``sys.setswitchinterval(1e-6)`` and one torch thread, and
checks invariants that hold for *every* interleaving of stock torch, never timings:

- no crash (the child runs under ``PYTHONMALLOC=debug``; a crash fails the scenario it
  was in, see the parent) and no hang (every thread is joined with a timeout);
- exceptions only of the kinds stock can raise in that scenario, where it can raise
  them (a dtype error only in a call that overlapped a conversion, an iteration error
  only in a live walk or a call that overlapped a change of the dict it iterates);
- the cyclic GC never seen disabled by another thread (a watcher thread polls
  ``gc.isenabled()`` in the scenarios with callers or walkers and in ``gc_state``;
  stock never touches the GC state);
- per scenario: hooks called exactly once per call, walks yielding only what was
  registered under that name at some point, state dicts and loads consistent with a
  serial order, BatchNorm and ``_apply`` reading what torch reads when torch reads it,
  and the model equal to a reference that went through the same mutations serially.

The parent runs ``python -X faulthandler -m tests.thread_stress_support SECONDS
SIDE:SCENARIO...``; for each item the child prints ``START side:scenario``, then ``RESULT
{json}`` (``violations``: what no serial order of stock can give; ``stats``: counts of
what happened). A thread that does not finish makes the child dump every thread's
stack to stderr and exit at once.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import faulthandler
import gc
import itertools
import json
import os
import re
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import fastmodule

SIDES = ("stock", "fast")
#: Seconds each scenario stresses (each racing loop runs this long, at least a fixed
#: number of rounds); ``make test-threads`` sets it larger.
ENV_SECONDS = "FASTMODULE_STRESS_SECONDS"
DEFAULT_SECONDS = 0.4
#: How long a thread may take past its scenario's deadline before it counts as hung:
#: generous, as the machine may be shared and the child runs under the debug allocator.
JOIN_GRACE_S = 60.0

# What CPython says when a dict or OrderedDict iterated by a live walk is changed by
# another thread: torch's walks iterate the registries directly, so stock raises these.
ITERATION_CHANGED = [
    r"RuntimeError: dictionary changed size during iteration",
    r"RuntimeError: dictionary keys changed during iteration",
    r"RuntimeError: OrderedDict mutated during iteration",
]
# A call that overlaps ``.double()``/``.float()`` meets tensors of both dtypes (stock's
# ``_apply`` converts one tensor at a time, and the caller chose its input's dtype
# before): torch's kernels raise, each in its own words ("mat1 and mat2 must have the
# same dtype", "expected scalar type Double but found Float", "mixed dtype (CPU)",
# "index_select(): self and result must have the same scalar type", oneDNN's
# "itensor_view_from_dense expects float/... inputDouble", ...). A kernel also runs
# without the GIL while ``_apply`` swaps a parameter's storage and dtype (``param.data =``,
# under the GIL only), so a view it makes may pair the new itemsize with the old
# storage ("setStorage: sizes [16, 8], strides [1, 16], ... itemsize 8 requiring a
# storage size of 1024 are out of bounds for storage of size 512"; seen once in 20 s).
# Allowed only for a call that overlapped a conversion (``ModelCase.may_raise``).
MIXED_DTYPES = [
    r"(?i)RuntimeError: .*(?:dtype|scalar type|datatype|float|double)",
    r"RuntimeError: setStorage: .* out of bounds for storage of size \d+$",
]


def stress_seconds() -> float:
    """Seconds per scenario: ``FASTMODULE_STRESS_SECONDS`` or the default."""
    return float(os.environ.get(ENV_SECONDS, "") or DEFAULT_SECONDS)


@contextlib.contextmanager
def forced_interleaving() -> Iterator[None]:
    """Switch threads every microsecond and run torch's kernels on one thread, so the
    GIL changes hands inside every native path; both settings are restored after."""
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    sys.setswitchinterval(1e-6)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- bookkeeping


@dataclass
class Report:
    """What one scenario found: ``violations`` (what no serial order of stock gives)
    and ``stats`` (counts, to see that the stress did something)."""

    violations: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    hung: bool = False

    def check(self, ok: bool, message: str) -> None:
        """Record ``message`` as a violation unless ``ok``."""
        if not ok:
            self.violations.append(message)


class Errors:
    """Exceptions raised in the stress threads. Those that match the scenario's list for
    the raising thread's role (what stock can raise there) are counted; every other
    one is a violation, with its traceback."""

    def __init__(self, allowed: dict[str, list[str]]) -> None:
        self.allowed = {role: [re.compile(p) for p in ps] for role, ps in allowed.items()}
        self.counts: Counter[str] = Counter()
        self.unexpected: dict[str, list[Any]] = {}  # kind -> [count, first traceback]
        self.lock = threading.Lock()

    @staticmethod
    def text(exc: BaseException) -> str:
        """``Type: first line of the message``."""
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def allows(self, role: str, exc: BaseException) -> bool:
        """Whether ``exc`` is one stock can raise in role ``role``."""
        return any(p.match(self.text(exc)) for p in self.allowed.get(role, []))

    def record(self, role: str, exc: BaseException) -> None:
        """Sort one exception raised in a thread of role ``role``."""
        key = f"{role}: {self.text(exc)[:300]}"
        with self.lock:
            if self.allows(role, exc):
                self.counts[key] += 1
                return
            if key not in self.unexpected:
                tb = "".join(traceback.format_exception(exc))[-1500:]
                self.unexpected[key] = [0, tb]
            self.unexpected[key][0] += 1

    def into(self, report: Report) -> None:
        """Put the counts into ``report``'s stats and the unexpected ones into its
        violations (each kind once, with its count and first traceback)."""
        report.stats.setdefault("allowed exceptions", {}).update(self.counts)
        for key, (n, tb) in self.unexpected.items():
            report.violations.append(f"exception stock does not raise here ({n}x): {key}\n{tb}")


def spawn(role: str, body: Callable[[], None], errors: Errors) -> threading.Thread:
    """A started daemon thread running ``body``; an exception escaping it is recorded
    under ``role`` (daemon: a hung thread must not keep the child alive)."""

    def run() -> None:
        try:
            body()
        except BaseException as e:  # noqa: BLE001 - sorted by Errors
            errors.record(role, e)

    t = threading.Thread(target=run, name=role, daemon=True)
    t.start()
    return t


def join_all(threads: list[threading.Thread], deadline: float, report: Report) -> None:
    """Join every thread by ``deadline + JOIN_GRACE_S``; one still running is a hang."""
    for t in threads:
        t.join(max(0.0, deadline + JOIN_GRACE_S - time.monotonic()))
        if t.is_alive():
            report.hung = True
            report.violations.append(f"hang: thread {t.name!r} still running")


class GcWatch:
    """Polls ``gc.isenabled()`` from its own thread until stopped. Stock never changes
    the cyclic GC's state, so every poll must see it enabled: a native path that
    pauses the GC process-wide while it releases the GIL is seen here (and would undo
    another thread's ``gc.disable()``, or fork a child with the GC off)."""

    def __init__(self, errors: Errors) -> None:
        self.stop = threading.Event()
        self.polls = 0
        self.seen_off = 0
        self.thread = spawn("gc watcher", self._body, errors)

    def _body(self) -> None:
        while not self.stop.is_set():
            self.polls += 1
            if not gc.isenabled():
                self.seen_off += 1

    def finish(self, deadline: float, report: Report) -> None:
        """Stop, join, and report any poll that saw the GC disabled."""
        self.stop.set()
        join_all([self.thread], deadline, report)
        report.stats["gc polls"] = self.polls
        report.check(
            self.seen_off == 0,
            f"gc.isenabled() was False in {self.seen_off} of {self.polls} polls from another "
            "thread (stock never disables the GC)",
        )


class StartLine:
    """Starts a race with both threads running: the mutator spins until the main
    thread is about to make its call. (Waking a thread blocked on an Event takes the
    OS longer than a whole replayed walk, which would then be over before the
    mutator ran.)"""

    def __init__(self) -> None:
        self.ready = False
        self.go = False

    def wait_in_mutator(self) -> None:
        """In the mutator: say it is running, then spin until the race starts."""
        self.ready = True
        while not self.go:
            pass

    def start(self, mutator: threading.Thread) -> None:
        """In the main thread, right before its call: wait for the mutator (unless it
        died first), start."""
        while not self.ready and mutator.is_alive():
            pass
        self.go = True


def until(deadline: float, minimum: int) -> Iterator[int]:
    """0, 1, 2, ... while before ``deadline``, and at least ``minimum`` of them (a
    loaded machine still runs every scenario's rounds, only slower)."""
    for i in itertools.count():
        if i >= minimum and time.monotonic() >= deadline:
            return
        yield i


def seeded(shape: torch.Size | tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor drawn from its own generator (never torch's global RNG, which other
    threads draw from in an order no reference can replay)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    # From 1: BatchNorm divides by num_batches_tracked (a load may land between its
    # add_ and that division).
    return torch.randint(1, 5, shape, generator=g).to(dtype)


def reseed(module: nn.Module, seed: int) -> nn.Module:
    """``module`` (fresh, not yet in a tree) with every parameter and buffer drawn from
    ``seed``: its constructor drew from torch's global RNG."""
    with torch.no_grad():
        for j, t in enumerate(itertools.chain(module.parameters(), module.buffers())):
            t.copy_(seeded(t.shape, t.dtype, seed * 100 + j))
    return module


def seeded_state(template: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A state dict with ``template``'s keys, shapes and dtypes, values from ``seed``
    (variances kept positive)."""
    out = {}
    for j, (k, v) in enumerate(template.items()):
        t = seeded(v.shape, v.dtype, seed * 1000 + j)
        out[k] = t.abs() + 0.5 if k.endswith("running_var") else t
    return out


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors in a model's output (a tensor, a tuple, an HF ``ModelOutput``)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        return [t for o in out for t in tensors_of(o)]
    return []


def same_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Exactly equal: dtype, shape and every value (NaN equal to NaN)."""
    if a is None or b is None:
        return a is b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())


def fast_if(side: str, model: nn.Module) -> nn.Module:
    """``model`` accelerated in place on the fast side."""
    return fastmodule.accelerate(model) if side == "fast" else model


def base_of(side: str) -> type[nn.Module]:
    """The base class of the scenario's own module classes."""
    return fastmodule.Module if side == "fast" else nn.Module


def noop_hook(*args: Any) -> None:
    """A hook that changes nothing."""


# --------------------------------------------------------------------------- models, mutated


Step = Callable[[nn.Module, int, dict[str, Any]], None]


@dataclass
class ModelCase:
    """A model called by several threads while one thread mutates it.

    ``build(side)`` makes the seeded model; ``call(model)`` is one forward;
    ``steps`` are the mutator's steps, run in order ``i = 1, 2, ...`` (step
    ``steps[(i - 1) % len(steps)]``), each a deterministic function of the model's
    structure and ``i`` (never of values the callers change); ``may_raise`` maps a
    step's name to what stock raises in a call that overlaps that step (a call that
    overlaps no such step must not raise); ``settle(model)`` puts back what the
    callers changed on purpose (BatchNorm's running stats) before the model is
    compared with the reference."""

    build: Callable[[str], nn.Module]
    call: Callable[[nn.Module], Any]
    steps: list[Step]
    may_raise: dict[str, list[str]]
    settle: Callable[[nn.Module], None] = lambda m: None


def step_train(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
    """Toggle train/eval (only the mutator writes ``training``)."""
    m.train(not m.training)


def step_zero_grad(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
    """Give every parameter a seeded grad, then ``zero_grad`` (to None or zeros)."""
    for j, p in enumerate(m.parameters()):
        p.grad = seeded(p.shape, p.dtype, i * 100 + j)
    m.zero_grad(set_to_none=i % 2 == 0)


def step_dtype(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
    """Convert the whole model to double, or back to float."""
    ctx["double"] = not ctx.get("double", False)
    if ctx["double"]:
        m.double()
    else:
        m.float()


def step_load(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
    """Load seeded values into every entry of the current state dict (its keys, shapes
    and dtypes)."""
    m.load_state_dict(seeded_state(m.state_dict(), i))


def hook_step(path: str) -> Step:
    """Register a forward (pre-)hook on the submodule at ``path``; at most two stay
    registered (the oldest is removed)."""

    def step(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        handles = ctx.setdefault("hooks", [])
        target = m.get_submodule(path)
        if i % 2:
            handles.append(target.register_forward_hook(noop_hook, always_call=i % 3 == 0))
        else:
            handles.append(target.register_forward_pre_hook(noop_hook, prepend=i % 3 == 0))
        if len(handles) > 2:
            handles.pop(0).remove()

    return step


def current_dtype(m: nn.Module) -> torch.dtype:
    """The dtype the mutator last converted ``m`` to (parameters are never mixed
    between the mutator's steps)."""
    return next(m.parameters()).dtype


def rebind_step(path: str) -> Step:
    """Rebind the parameter at ``path`` to a new seeded ``Parameter``."""
    owner, _, name = path.rpartition(".")

    def step(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        mod = m.get_submodule(owner)
        old = getattr(mod, name)
        setattr(mod, name, nn.Parameter(seeded(old.shape, old.dtype, i)))

    return step


_MLP_CLASSES: dict[str, type[nn.Module]] = {}


def mlp_class(side: str) -> type[nn.Module]:
    """An MLP class of the side's base (one per side, so both the model and its
    reference are instances of it)."""
    if side not in _MLP_CLASSES:

        class MLP(base_of(side)):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.fc1 = nn.Linear(16, 32)
                self.act = nn.ReLU()
                self.fc2 = nn.Linear(32, 32)
                self.norm = nn.LayerNorm(32)
                self.fc3 = nn.Linear(32, 8)
                self.register_buffer("scale", torch.ones(8))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                x = self.act(self.fc1(x))
                x = self.norm(self.act(self.fc2(x)))
                return self.fc3(x) * self.scale

        _MLP_CLASSES[side] = MLP
    return _MLP_CLASSES[side]


def mlp_case() -> ModelCase:
    """(a) An MLP of the side's base class; the mutator rebinds, replaces, deletes,
    hooks, loads, converts, toggles and zeroes."""
    x = seeded((4, 16), torch.float32, 7)

    def build(side: str) -> nn.Module:
        torch.manual_seed(0)
        return fast_if(side, mlp_class(side)())

    def call(m: nn.Module) -> Any:
        # A caller that follows the model's dtype, read before the call: another
        # thread may convert in between (hence MIXED_DTYPES).
        return m(x.to(m.fc1.weight.dtype))

    def replace_act(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        m.act = nn.GELU() if i % 2 else nn.ReLU()

    def extra(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        if "extra" in m._modules:
            del m.extra
        else:
            m.extra = reseed(nn.Linear(4, 4), i).to(current_dtype(m))

    def buffer(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        m.register_buffer("scale", seeded((8,), current_dtype(m), i), persistent=i % 3 != 0)

    return ModelCase(
        build,
        call,
        [
            rebind_step("fc2.weight"),
            step_train,
            hook_step("fc1"),
            replace_act,
            extra,
            step_load,
            rebind_step("fc1.bias"),
            step_zero_grad,
            step_dtype,
            buffer,
            hook_step(""),
        ],
        {"step_dtype": MIXED_DTYPES},
    )


def layers_case() -> ModelCase:
    """(c) A ``Sequential`` of torch's layers (Embedding, Flatten, Linear, LayerNorm,
    ReLU, BatchNorm1d, Unflatten, Conv1d, GELU, Tanh, Dropout, Identity): the mutator
    also deletes and inserts the Dropout, replaces the LayerNorm and changes
    BatchNorm's attributes. Only elementwise layers follow the Dropout: ``insert``
    shifts every later layer by one, one assignment at a time, so a call meanwhile
    meets one of them twice, which must not change shapes (stock would raise shape
    errors, which no step here allows)."""
    ids = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(3))

    def build(side: str) -> nn.Module:
        torch.manual_seed(0)
        seq = nn.Sequential(
            nn.Embedding(20, 4),
            nn.Flatten(),
            nn.Linear(24, 16),
            nn.LayerNorm(16),
            nn.ReLU(),
            nn.BatchNorm1d(16),
            nn.Unflatten(1, (4, 4)),
            nn.Conv1d(4, 4, 3, padding=1),
            nn.GELU(),
            nn.Flatten(),
            nn.Linear(16, 8),
            nn.Tanh(),
            nn.Dropout(0.1),
            nn.Identity(),
        )
        return fast_if(side, seq)

    def of_type(m: nn.Module, cls: type[nn.Module]) -> tuple[int, nn.Module]:
        # By type: indices shift while the Dropout is out.
        return next((j, x) for j, x in enumerate(m) if isinstance(x, cls))

    def conv_weight(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        _, conv = of_type(m, nn.Conv1d)
        conv.weight = nn.Parameter(seeded(conv.weight.shape, conv.weight.dtype, i))

    def dropout(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        # Sequential's __delitem__ rebuilds _modules (renumbered); insert shifts them.
        if any(isinstance(x, nn.Dropout) for x in m):
            del m[of_type(m, nn.Dropout)[0]]
        else:
            m.insert(12, nn.Dropout(0.1 * (i % 4)))

    def replace_norm(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        j, _ = of_type(m, nn.LayerNorm)
        m[j] = reseed(nn.LayerNorm(16), i).to(current_dtype(m))

    def bn_attrs(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        _, bn = of_type(m, nn.BatchNorm1d)
        bn.momentum = None if i % 2 else 0.1
        bn.eps = 1e-5 * (1 + i % 3)

    def settle(m: nn.Module) -> None:
        # The callers' training-mode calls move the running stats, in an order no
        # reference can replay.
        for x in m.modules():
            if isinstance(x, nn.BatchNorm1d):
                x.reset_running_stats()

    return ModelCase(
        build,
        lambda m: m(ids),
        [
            conv_weight,
            step_train,
            hook_step("3"),
            dropout,
            step_load,
            bn_attrs,
            replace_norm,
            step_zero_grad,
            step_dtype,
            dropout,
            hook_step(""),
        ],
        # Sequential.forward iterates _modules, which del/insert change.
        {"step_dtype": MIXED_DTYPES, "dropout": ITERATION_CHANGED},
        settle,
    )


def hf_case() -> ModelCase:
    """(b) A 2-layer BertModel from a tiny config (no download): rebinds, hooks, a
    replaced pooler layer, loads, conversions, dropout changes, train/eval."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(4))

    def build(side: str) -> nn.Module:
        torch.manual_seed(0)
        return fast_if(side, transformers.BertModel(config))

    def pooler(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        m.pooler.dense = reseed(nn.Linear(16, 16), i).to(current_dtype(m))

    def dropout_p(m: nn.Module, i: int, ctx: dict[str, Any]) -> None:
        m.encoder.layer[1].output.dropout.p = 0.1 * (i % 3)

    return ModelCase(
        build,
        lambda m: m(input_ids=ids),
        [
            rebind_step("encoder.layer.0.attention.self.query.weight"),
            step_train,
            hook_step("encoder.layer.1"),
            pooler,
            step_load,
            dropout_p,
            step_zero_grad,
            step_dtype,
            hook_step("embeddings"),
        ],
        {"step_dtype": MIXED_DTYPES},
    )


def compare_with_reference(
    model: nn.Module, ref: nn.Module, call: Callable[[nn.Module], Any]
) -> list[str]:
    """How ``model`` (its own paths) differs from ``ref`` (stock code: read under
    ``fastmodule.disabled()``): modules (names, types, training, hook counts),
    state dict (keys, dtypes, values), non-persistent sets, grads, and the output
    of one eval-mode call."""

    def describe(m: nn.Module) -> list[Any]:
        return [
            (
                n,
                type(x).__name__,
                x.training,
                len(x._forward_hooks),
                len(x._forward_pre_hooks),
                sorted(x._non_persistent_buffers_set),
            )
            for n, x in m.named_modules()
        ]

    def grads(m: nn.Module) -> dict[str, torch.Tensor | None]:
        return {n: p.grad for n, p in m.named_parameters()}

    def output(m: nn.Module) -> list[torch.Tensor]:
        m.eval()
        with torch.no_grad():
            return tensors_of(call(m))

    diffs = []
    got = (describe(model), model.state_dict(), grads(model), output(model))
    with fastmodule.disabled():
        want = (describe(ref), ref.state_dict(), grads(ref), output(ref))
    if got[0] != want[0]:
        diffs.append(f"modules differ: {got[0]} vs reference {want[0]}")
    for what, g, w in (("state dict", got[1], want[1]), ("grads", got[2], want[2])):
        if list(g) != list(w):
            diffs.append(f"{what} keys differ: {list(g)} vs reference {list(w)}")
        else:
            bad = [k for k in g if not same_tensor(g[k], w[k])]
            if bad:
                diffs.append(f"{what} values differ from the reference at {bad}")
    if len(got[3]) != len(want[3]) or not all(map(same_tensor, got[3], want[3])):
        diffs.append("the output of an eval-mode call differs from the reference's")
    return diffs


def run_model_case(case: ModelCase, side: str, seconds: float, report: Report) -> None:
    """Two caller threads call the model (under ``no_grad``) while one mutator runs
    ``case.steps`` in order and a third thread watches the GC. A caller's exception
    must be one ``case.may_raise`` allows for a step its call overlapped (a global
    sequence orders every call's and step's start and end). Then the same steps, as
    many as the mutator ran, are applied serially to a reference built the same way
    and read by stock code, and the two must be equal."""
    model = case.build(side)
    with torch.no_grad():
        case.call(model)  # record what the fast paths record before the race
    model.state_dict()
    errors = Errors({})
    stop = threading.Event()
    ctx: dict[str, Any] = {}
    seq = itertools.count()  # next() is atomic under the GIL: a global order of events
    windows: list[tuple[int, int, str]] = []  # each step: (start, end, name), in order
    raised: list[tuple[int, int, Exception]] = []  # each failed call: (start, end, error)
    calls: list[int] = []
    deadline = time.monotonic() + seconds

    def mutate() -> None:
        try:
            for i in until(deadline, 2 * len(case.steps)):
                step = case.steps[i % len(case.steps)]
                start = next(seq)
                step(model, i + 1, ctx)
                windows.append((start, next(seq), step.__name__))
        finally:
            stop.set()

    def caller() -> None:
        n = 0
        while not stop.is_set() or n < 3:
            start = next(seq)
            try:
                with torch.no_grad():
                    case.call(model)
            except Exception as e:  # noqa: BLE001 - checked against the steps below
                raised.append((start, next(seq), e))
            n += 1
        calls.append(n)

    watch = GcWatch(errors)
    threads = [spawn("mutator", mutate, errors)] + [
        spawn("caller", caller, errors) for _ in range(2)
    ]
    join_all(threads, deadline, report)
    watch.finish(time.monotonic(), report)
    starts = [w[0] for w in windows]
    allowed = Errors(case.may_raise)
    for start, end, e in raised:
        # The steps this call overlapped (they run one after another, in order).
        first = max(0, bisect.bisect(starts, start) - 1)
        near = itertools.takewhile(lambda w: w[0] < end, itertools.islice(windows, first, None))
        overlapped = [w[2] for w in near if w[1] > start]
        role = next((r for r in overlapped if allowed.allows(r, e)), None)
        allowed.record(role or f"a call overlapping steps {sorted(set(overlapped))}", e)
    errors.into(report)
    allowed.into(report)
    steps = len(windows)
    report.stats.update(steps=steps, calls=sum(calls))
    if report.hung:
        return
    with fastmodule.disabled():
        ref = case.build(side)
        ref_ctx: dict[str, Any] = {}
        for i in range(steps):
            case.steps[i % len(case.steps)](ref, i + 1, ref_ctx)
    case.settle(model)
    with fastmodule.disabled():
        case.settle(ref)
    for d in compare_with_reference(model, ref, case.call):
        report.violations.append(f"after {steps} steps: {d}")


def scenario_mlp(side: str, seconds: float, report: Report) -> None:
    """(a) MLP: callers and a mutator; the model equals its serial reference after."""
    run_model_case(mlp_case(), side, seconds, report)


def scenario_hf_bert(side: str, seconds: float, report: Report) -> None:
    """(b) HF BertModel (tiny config): callers and a mutator; equal to its reference."""
    run_model_case(hf_case(), side, seconds, report)


def scenario_layers(side: str, seconds: float, report: Report) -> None:
    """(c) Sequential of torch layers: callers and a mutator; equal to its reference."""
    run_model_case(layers_case(), side, seconds, report)


# --------------------------------------------------------------------------- hooks


def scenario_hooks(side: str, seconds: float, report: Report) -> None:
    """(d) A hooked model: hooks registered for the whole scenario count each call.

    Every mutation keeps the values (a replaced layer is a copy, a rebound parameter a
    clone, a load reloads the same values, ``float()`` converts to the same dtype), so:

    - every call returns exactly the output computed before the threads started;
    - the permanent hooks (pre and post on the root, pre and post on ``body``) run
      exactly once per call, in the order root pre, body pre, body post, root post;
    - a temporary hook (the mutator registers and removes them: pre and post, on the
      root, on ``body`` and global) runs at most once per call, and when torch reads
      the hook dicts: a pre-hook's between the module's call and its ``forward``, a
      post-hook's between ``forward`` returning and the call returning (the forwards
      record when they start and end). So a hook whose ``remove()`` returned before
      that window is not run, and one registered before it and not yet being removed
      after it is run;
    - nothing raises.
    """
    base = base_of(side)
    local = threading.local()
    seq = itertools.count()  # next() is atomic under the GIL: a global order of events
    # (thread id, call) -> [forward start, forward end], for the root and for body.
    spans: dict[str, dict[tuple[int, int], list[int]]] = {"root": {}, "body": {}}

    def timed(where: str, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        span = spans[where][(threading.get_ident(), local.call)] = [next(seq), -1]
        y = forward()
        span[1] = next(seq)
        return y

    class Body(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin1 = nn.Linear(8, 16)
            self.act = nn.ReLU()
            self.lin2 = nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return timed("body", lambda: self.lin2(self.act(self.lin1(x))))

    class Hooked(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.body = Body()
            self.head = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return timed("root", lambda: self.head(self.body(x)))

    torch.manual_seed(0)
    model = fast_if(side, Hooked())
    fast_if(side, nn.Sequential(nn.Linear(1, 1)))
    x = seeded((3, 8), torch.float32, 5)
    local.call = -1
    with torch.no_grad():
        expected = model(x)
    for d in spans.values():
        d.clear()
    start_state = copy.deepcopy(model.state_dict())

    events: dict[tuple[int, int], list[str]] = {}  # (thread id, call) -> permanent hooks run
    temp_runs: list[tuple[str, int, int]] = []  # (hook, thread id, call)
    calls: list[tuple[int, int, int, int]] = []  # (thread id, call, start seq, end seq)
    # hook -> (pre or post, root or body, registered, removal started, removed)
    temp_life: dict[str, list[Any]] = {}

    def permanent(name: str) -> Callable[..., None]:
        def hook(*args: Any) -> None:
            events[(threading.get_ident(), local.call)].append(name)

        return hook

    model.register_forward_pre_hook(permanent("root pre"))
    model.register_forward_hook(permanent("root post"))
    model.body.register_forward_pre_hook(permanent("body pre"), prepend=True)
    model.body.register_forward_hook(permanent("body post"), always_call=True)

    def temporary(name: str, is_global: bool) -> Callable[..., None]:
        def hook(module: nn.Module, *args: Any) -> None:
            # A global hook runs for every module: count only the root's calls.
            if not is_global or module is model:
                temp_runs.append((name, threading.get_ident(), local.call))

        return hook

    errors = Errors({})
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    steps_done = [0]
    mod = torch.nn.modules.module

    def register(i: int) -> tuple[str, Any]:
        """The i-th temporary hook: pre or post, on the root, on body, or global."""
        # The mutator registers at every fourth step: cycle through the six kinds.
        name, kind = f"t{i}", ("pre", "post")[(i // 4) % 2]
        where = ("root", "body", "global")[(i // 8) % 3]
        hook = temporary(name, where == "global")
        if where == "global":
            register = (
                mod.register_module_forward_pre_hook
                if kind == "pre"
                else mod.register_module_forward_hook
            )
            h = register(hook)
        else:
            target = model if where == "root" else model.body
            if kind == "pre":
                h = target.register_forward_pre_hook(hook, prepend=i % 5 == 0)
            else:
                h = target.register_forward_hook(hook, always_call=i % 3 == 0)
        temp_life[name] = [kind, "body" if where == "body" else "root", next(seq), -1, -1]
        return name, h

    def unregister(name: str, handle: Any) -> None:
        temp_life[name][3] = next(seq)
        handle.remove()
        temp_life[name][4] = next(seq)

    def mutate() -> None:
        alive: list[tuple[str, Any]] = []
        try:
            for i in until(deadline, 40):
                k = i % 8
                if k in (0, 4):
                    alive.append(register(i))
                    if len(alive) > 2:
                        unregister(*alive.pop(0))
                elif k == 1:
                    model.body.act = nn.ReLU()
                elif k == 2:
                    head = nn.Linear(8, 4)
                    head.load_state_dict(model.head.state_dict())
                    model.head = head
                elif k == 3:
                    lin = model.body.lin1
                    lin.weight = nn.Parameter(lin.weight.detach().clone())
                elif k == 5:
                    # strict=False: ``extra`` (below) may be there, with its own values.
                    model.load_state_dict(start_state, strict=False)
                elif k == 6:
                    model.train(not model.training)
                    model.float()
                    model.zero_grad()
                else:
                    if hasattr(model, "extra"):
                        del model.extra
                    else:
                        model.extra = nn.Linear(2, 2)
                steps_done[0] = i + 1
        finally:
            for old, handle in alive:
                unregister(old, handle)
            stop.set()

    bad_outputs = [0]

    def caller() -> None:
        n = 0
        tid = threading.get_ident()
        while not stop.is_set() or n < 3:
            local.call = n
            events[(tid, n)] = []
            start = next(seq)
            with torch.no_grad():
                y = model(x)
            calls.append((tid, n, start, next(seq)))
            if not torch.equal(y, expected):
                bad_outputs[0] += 1
            n += 1

    watch = GcWatch(errors)
    threads = [spawn("mutator", mutate, errors)] + [
        spawn("caller", caller, errors) for _ in range(2)
    ]
    join_all(threads, deadline, report)
    watch.finish(time.monotonic(), report)
    errors.into(report)
    report.stats.update(calls=len(calls), steps=steps_done[0], temporary_runs=len(temp_runs))
    if report.hung:
        return
    report.check(bad_outputs[0] == 0, f"{bad_outputs[0]} calls returned another output")
    order = ["root pre", "body pre", "body post", "root post"]
    wrong = [(k, v) for k, v in events.items() if v != order]
    report.check(
        not wrong,
        f"{len(wrong)} calls ran the permanent hooks otherwise than once each in order "
        f"{order}; first: {wrong[:2]}",
    )
    runs = Counter(temp_runs)
    twice = [k for k, c in runs.items() if c > 1]
    report.check(not twice, f"temporary hooks run twice in one call: {twice[:3]}")

    def window(kind: str, where: str, key: tuple[int, int], start: int, end: int) -> tuple:
        """When torch reads this hook's dict in this call: (after, before)."""
        root, body = spans["root"][key], spans["body"][key]
        if where == "root":
            return (start, root[0]) if kind == "pre" else (root[1], end)
        return (root[0], body[0]) if kind == "pre" else (body[1], root[1])

    span = {(t, n): (s_, e_) for t, n, s_, e_ in calls}
    late = []
    for h, t, n in runs:
        kind, where, _, _, rm_done = temp_life[h]
        if (t, n) in span and rm_done < window(kind, where, (t, n), *span[(t, n)])[0]:
            late.append((h, kind, where, t, n))
    missed = []
    by_start = sorted((s_, e_, t, n) for t, n, s_, e_ in calls)
    call_starts = [c[0] for c in by_start]
    for h, (kind, where, reg, rm_start, _) in temp_life.items():
        # The calls running at the registration or started after it, until the
        # removal started: at most one per caller thread started before it.
        first = max(0, bisect.bisect(call_starts, reg) - 2)
        for s_, e_, t, n in itertools.islice(by_start, first, None):
            if s_ > rm_start:
                break
            lo, hi = window(kind, where, (t, n), s_, e_)
            if reg < lo and hi < rm_start and (h, t, n) not in runs:
                missed.append((h, kind, where, t, n))
    report.check(not late, f"hooks run although removed before torch reads them: {late[:3]}")
    report.check(not missed, f"hooks registered when torch reads them not run: {missed[:3]}")
    after = model.state_dict()
    report.check(
        all(torch.equal(after[k], v) for k, v in start_state.items()),
        "the state dict changed although every mutation kept the values",
    )


# --------------------------------------------------------------------------- walks


def scenario_walks(side: str, seconds: float, report: Report) -> None:
    """Walks while the tree is restructured. Two walker threads run ``named_parameters``,
    ``named_buffers``, ``named_modules``, ``parameters``, ``modules``, ``children``,
    ``state_dict`` (with and without ``keep_vars``), ``train``/``eval``, ``zero_grad``
    and ``float()`` while the mutator adds, deletes, replaces and moves modules,
    rebinds parameters and registers buffers. Invariants:

    - every ``(name, obj)`` a walk yields was reachable under that name through edges
      the mutator registered at some point (each edge ``parent.key = child`` is recorded
      before it is made; a live walk may combine edges of different moments);
    - a walk that drops duplicates yields no object twice;
    - a state dict's values are the registered tensors (or detached views of them);
    - only the iteration errors stock's live walks raise;
    - afterwards the tree, walked by fastmodule, equals the same tree walked by stock.
    """
    base = base_of(side)

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("b", torch.zeros(2))

    class Tree(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.head = nn.Linear(4, 2)

    torch.manual_seed(0)
    root = fast_if(side, Tree())
    keep: list[Any] = [root]  # everything ever registered stays alive: ids stay unique
    edges: dict[tuple[int, str], set[int]] = {}
    tensors: dict[int, torch.Tensor] = {}

    def edge(parent: nn.Module, key: str, child: Any) -> None:
        if child is None:
            return
        keep.append(child)
        edges.setdefault((id(parent), key), set()).add(id(child))
        if isinstance(child, torch.Tensor):
            tensors[id(child)] = child

    def subtree(parent: nn.Module, key: str, child: nn.Module) -> None:
        """Record ``parent.key = child`` and everything under ``child``."""
        edge(parent, key, child)
        for k, v in itertools.chain(child._parameters.items(), child._buffers.items()):
            edge(child, k, v)
        for k, v in child._modules.items():
            subtree(child, k, v)

    for k, v in root._modules.items():
        subtree(root, k, v)
    for k, v in root._parameters.items():
        edge(root, k, v)

    def new_block(i: int) -> nn.Module:
        return reseed(Block(), i)

    def mutate() -> None:
        try:
            restructure()
        finally:
            stop.set()

    def restructure() -> None:
        extras: list[str] = []
        for i in until(deadline, 30):
            k = i % 8
            blocks = root.blocks
            if k == 0:
                name = f"x{i}"
                m = reseed(nn.Linear(2, 2), i)
                subtree(root, name, m)
                root.add_module(name, m)
                extras.append(name)
                if len(extras) > 3:
                    delattr(root, extras.pop(0))
            elif k == 1:
                j = i % len(blocks)
                b = new_block(i)
                subtree(blocks, str(j), b)
                blocks[j] = b
            elif k == 2:
                lin = blocks[i % len(blocks)].lin
                p = nn.Parameter(seeded((4, 4), torch.float32, i))
                edge(lin, "weight", p)
                lin.weight = p
            elif k == 3:
                # ModuleList.__delitem__ renumbers: record the new keys first.
                mods = list(blocks)
                for j, m in enumerate(mods[1:]):
                    edge(blocks, str(j), m)
                del blocks[0]
                b = new_block(i)
                subtree(blocks, str(len(mods) - 1), b)
                blocks.append(b)
            elif k == 4:
                blk = blocks[i % len(blocks)]
                t = seeded((3,), torch.float32, i)
                edge(blk, f"c{i % 3}", t)
                blk.register_buffer(f"c{i % 3}", t, persistent=i % 2 == 0)
            elif k == 5:
                # Move a layer between two places: root.head <-> blocks[1].lin.
                blk = blocks[1]
                head, lin = root.head, blk.lin
                edge(root, "head", lin)
                edge(blk, "lin", head)
                root.head, blk.lin = lin, head
            elif k == 6:
                head = root.head
                if head.bias is None:
                    p = nn.Parameter(seeded(head.weight.shape[:1], torch.float32, i))
                    edge(head, "bias", p)
                    head.bias = p
                else:
                    head.register_parameter("bias", None)
            else:
                ml = nn.ModuleList(new_block(i * 10 + j) for j in range(2))
                subtree(root, "blocks", ml)
                root.blocks = ml
            steps[0] = i + 1

    found: list[tuple[str, str, int]] = []  # (walk, name, id) yielded
    dup: list[str] = []
    sd_values: list[tuple[str, torch.Tensor]] = []

    # Walks that drop duplicates (a memo): no object twice in one walk. A state dict
    # keeps duplicates (a module moved between two places is seen at both meanwhile).
    dedup = {"named_parameters", "named_buffers", "named_modules", "named_children", "objects"}

    def walk(kind: str, n: int) -> list[tuple[str, Any]]:
        """One walk or whole-tree call; the ``(name, obj)`` pairs it yielded."""
        if kind == "named_parameters":
            return list(root.named_parameters())
        if kind == "named_buffers":
            return list(root.named_buffers())
        if kind == "named_modules":
            return [(k, v) for k, v in root.named_modules() if k]
        if kind == "named_children":
            return list(root.named_children())
        if kind == "state_dict(keep_vars=True)":
            return list(root.state_dict(keep_vars=True).items())
        if kind == "state_dict()":
            sd_values.extend(root.state_dict().items())
        elif kind == "objects":
            # parameters()/modules()/buffers(): objects without names.
            return [("", o) for o in [*root.parameters(), *root.modules(), *root.buffers()]]
        elif kind == "train":
            root.train(n % 3 != 0)
        elif kind == "zero_grad":
            root.zero_grad()
        else:
            root.float()
        return []

    kinds = [
        "named_parameters",
        "named_buffers",
        "named_modules",
        "state_dict(keep_vars=True)",
        "state_dict()",
        "objects",
        "named_children",
        "train",
        "zero_grad",
        "float",
    ]

    def walker(w: int) -> None:
        n = 0
        while not stop.is_set() or n < 2 * len(kinds):
            kind = kinds[(n + w) % len(kinds)]
            n += 1
            try:
                got = walk(kind, n)
            except RuntimeError as e:
                errors.record("walker", e)
                continue
            ids = [id(v) for _, v in got]
            if kind in dedup and len(ids) != len(set(ids)):
                dup.append(f"{kind}: {[k for k, _ in got]}")
            found.extend((kind, k, id(v)) for k, v in got)

    errors = Errors({"walker": ITERATION_CHANGED})
    stop = threading.Event()
    steps = [0]
    deadline = time.monotonic() + seconds
    watch = GcWatch(errors)
    threads = [spawn("mutator", mutate, errors)] + [
        spawn("walker", lambda w=w: walker(w), errors) for w in range(2)
    ]
    join_all(threads, deadline, report)
    watch.finish(time.monotonic(), report)
    errors.into(report)
    report.stats.update(steps=steps[0], yielded=len(found), state_dicts=len(sd_values))
    if report.hung:
        return
    report.check(not dup, f"walks yielded an object twice: {dup[:3]}")

    ever = {id(o) for o in keep}
    memo: dict[str, set[int]] = {"": {id(root)}}

    def reachable(path: str) -> set[int]:
        """Ids reachable from the root through recorded edges along ``path``."""
        if path not in memo:
            parent, _, key = path.rpartition(".")
            memo[path] = {c for p in reachable(parent) for c in edges.get((p, key), ())}
        return memo[path]

    bad = [(w, k) for w, k, i in found if (i not in ever if k == "" else i not in reachable(k))]
    report.check(not bad, f"walks yielded (name, obj) never registered under that name: {bad[:5]}")
    ptrs = {t.data_ptr(): i for i, t in tensors.items()}
    bad_sd = [k for k, v in sd_values if ptrs.get(v.data_ptr()) not in reachable(k)]
    report.check(
        not bad_sd, f"state_dict() values not a registered tensor of that key: {bad_sd[:5]}"
    )

    def walked() -> list[Any]:
        return [
            [(k, id(v)) for k, v in root.named_parameters()],
            [(k, id(v)) for k, v in root.named_buffers()],
            [(k, id(v), v.training) for k, v in root.named_modules()],
            [(k, id(v)) for k, v in root.state_dict(keep_vars=True).items()],
        ]

    got = walked()
    with fastmodule.disabled():
        want = walked()
    report.check(
        got == want, f"after the race, fastmodule's walks {got} differ from stock's {want}"
    )


# --------------------------------------------------------------------------- serial orders


def relation_root(side: str) -> nn.Module:
    """A root whose first child holds 100 parameters: a whole-tree call spends most of
    its time there, releasing the GIL in each kernel, before it reaches ``m1``/``m2``.
    (Small tensors: what counts is how often the GIL is released, and each round is
    cheap, so a short run has many rounds.)"""
    root = base_of(side)()
    root.m0 = base_of(side)()
    for j in range(100):
        root.m0.register_parameter(f"p{j}", nn.Parameter(torch.zeros(4, 4)))
    return root


def scenario_state_dict_order(side: str, seconds: float, report: Report) -> None:
    """``state_dict()`` consistent with a serial order. The mutator runs, for i = 1..K:
    (a) ``m2.weight = P_i``, then (b) makes ``m1``'s buffer ``b_i`` non-persistent.
    torch's walk reads ``m1`` (each buffer's persistence) before ``m2``'s
    parameters, so a state dict that leaves out ``m1.b_i`` saw (b) of step i, hence
    (a) of step i before it, and must hold ``m2.weight = P_j`` with j >= i (a replay
    holding tensors from its start and reading the set live breaks this). The
    ``keep_vars=True`` dict must hold ``P_j`` itself."""
    k_max = 30

    class Bufs(base_of(side)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            for i in range(k_max + 1):
                self.register_buffer(f"b{i}", torch.zeros(1))

    errors = Errors({})
    runs = useful = 0
    bad: list[str] = []
    deadline = time.monotonic() + seconds
    for r in until(deadline, 120):
        root = relation_root(side)
        root.m1 = Bufs()
        root.m2 = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            root.m2.weight.fill_(0)
        fast_if(side, root)
        params = [root.m2.weight] + [
            nn.Parameter(torch.full((1, 1), float(i))) for i in range(1, k_max + 1)
        ]
        keep_vars = r % 2 == 1
        root.state_dict(keep_vars=keep_vars)
        root.state_dict(keep_vars=keep_vars)  # recorded, then replayed
        go = StartLine()

        def mutate(
            root: nn.Module = root, params: list[nn.Parameter] = params, go: StartLine = go
        ) -> None:
            go.wait_in_mutator()
            for i in range(1, k_max + 1):
                root.m2.weight = params[i]
                root.m1.register_buffer(f"b{i}", root.m1._buffers[f"b{i}"], persistent=False)

        t = spawn("mutator", mutate, errors)
        go.start(t)
        sd = root.state_dict(keep_vars=keep_vars)
        join_all([t], time.monotonic(), report)  # each round's own grace
        if report.hung:
            break
        runs += 1
        excluded = [i for i in range(1, k_max + 1) if f"m1.b{i}" not in sd]
        w = sd["m2.weight"]
        j = int(w.item())
        if keep_vars and w is not params[j]:
            bad.append(f"keep_vars=True: m2.weight is not P_{j} itself")
        if excluded:
            useful += 1
            if max(excluded) > j:
                bad.append(f"m1.b{max(excluded)} left out, yet m2.weight = P_{j}")
    errors.into(report)
    report.stats.update(runs=runs, with_exclusions=useful)
    report.check(not bad, f"{len(bad)} of {runs} state dicts no serial order gives: {bad[:3]}")


def scenario_load_order(side: str, seconds: float, report: Report) -> None:
    """``load_state_dict()`` consistent with a serial order. While a load of all fives
    runs, the mutator waits until it is under way (``m0.p10`` copied), then (a) rebinds
    ``m2.weight`` to a new zero ``P``, then (b) sees whether ``m1.weight``'s copy has
    returned. torch's load copies ``m1`` before it reads ``m2``'s parameters, so if (b)
    saw ``m1`` not yet copied, the load read ``m2`` after (a) and must load into ``P``
    (a replay copying into the tensors found at its start leaves ``P`` at zero)."""

    def build() -> nn.Module:
        root = relation_root(side)
        root.m1 = nn.Linear(1, 1, bias=False)
        root.m2 = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            for p in root.parameters():
                p.zero_()
        return fast_if(side, root)

    template = build().state_dict()
    fives = {k: torch.full_like(v, 5.0) for k, v in template.items()}
    zeros = {k: torch.zeros_like(v) for k, v in template.items()}
    errors = Errors({})
    runs = useful = 0
    bad: list[str] = []
    deadline = time.monotonic() + seconds
    for _ in until(deadline, 120):
        root = build()
        root.load_state_dict(zeros)
        root.load_state_dict(zeros)  # recorded, then replayed
        fresh = nn.Parameter(torch.zeros(1, 1))
        seen: list[bool] = []
        go = StartLine()
        done = threading.Event()

        def mutate(
            root: nn.Module = root,
            fresh: nn.Parameter = fresh,
            seen: list[bool] = seen,
            go: StartLine = go,
            done: threading.Event = done,
        ) -> None:
            # Progress is read from version counters (copy_ bumps its target's before
            # it returns): reading one releases no GIL, so this thread keeps up.
            probe, m1 = root.m0.p10, root.m1.weight
            v_probe, v_m1 = probe._version, m1._version
            go.wait_in_mutator()
            while probe._version == v_probe:
                if done.is_set():
                    return
            root.m2.weight = fresh  # (a)
            seen.append(m1._version == v_m1)  # (b): m1's copy_ has not returned

        t = spawn("mutator", mutate, errors)
        go.start(t)
        try:
            root.load_state_dict(fives)
        finally:
            done.set()
        join_all([t], time.monotonic(), report)  # each round's own grace
        if report.hung:
            break
        runs += 1
        if seen and seen[0]:
            useful += 1
            if fresh.item() != 5.0:
                bad.append(
                    "m1 unloaded after m2.weight was rebound, yet the new m2.weight not loaded"
                )
    errors.into(report)
    report.stats.update(runs=runs, useful=useful)
    report.check(not bad, f"{len(bad)} of {runs} loads no serial order gives: {bad[:1]}")


def scenario_gc_state(side: str, seconds: float, report: Report) -> None:
    """The GC's state is the process's, not a native path's. One thread runs
    ``state_dict``, ``load_state_dict``, ``zero_grad``, ``train``/``eval`` and
    ``to(float32)`` on a 200-layer Sequential (each replayed natively, each releasing
    the GIL in torch's kernels); the watcher polls ``gc.isenabled()`` (never False on
    stock); a third thread disables the GC, lets others run, and must find it still
    disabled (a replay that saved and restored the GC state would turn it back on)."""
    model = fast_if(side, nn.Sequential(*[nn.Linear(8, 8) for _ in range(200)]))
    sd = model.state_dict()
    errors = Errors({})
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    undone = [0, 0]

    def work() -> None:
        # Each call repeated: the first after a change records, the next ones replay.
        try:
            for i in until(deadline, 2):
                for _ in range(3):
                    model.state_dict()
                for _ in range(3):
                    model.load_state_dict(sd)
                for p in model.parameters():
                    p.grad = torch.ones_like(p)
                for _ in range(2):
                    model.zero_grad(set_to_none=False)
                model.zero_grad()
                for _ in range(2):
                    model.train(i % 2 == 0)
                for _ in range(2):
                    model.to(torch.float32)
        finally:
            stop.set()

    def own_disable() -> None:
        while not stop.is_set():
            gc.disable()
            try:
                time.sleep(0)
                for _ in range(100):
                    pass
                undone[1] += 1
                if gc.isenabled():
                    undone[0] += 1
            finally:
                gc.enable()
            # Leave the GC enabled for a while: the watcher only polls meanwhile.
            time.sleep(0.001)

    watch = GcWatch(errors)
    threads = [spawn("worker", work, errors)]
    join_all(threads, deadline, report)
    watch.finish(time.monotonic(), report)
    # The own-disable check runs after the watcher stopped (its gc.disable() is seen
    # by no poll), against a second round of work.
    stop.clear()
    deadline = time.monotonic() + seconds
    threads = [spawn("worker", work, errors), spawn("disabler", own_disable, errors)]
    join_all(threads, deadline, report)
    errors.into(report)
    report.stats.update(own_disables=undone[1])
    report.check(
        undone[0] == 0,
        f"a thread's gc.disable() was undone by another thread {undone[0]} of {undone[1]} times",
    )
    report.check(gc.isenabled(), "the GC was left disabled")


def scenario_bn_order(side: str, seconds: float, report: Report) -> None:
    """BatchNorm reads its attributes after ``num_batches_tracked.add_(1)`` (which
    releases the GIL). Once a training-mode call has entered the layer (its pre-hook
    ran), the mutator sets ``momentum = None`` and then reads ``num_batches_tracked``:
    if that is still 0, the add had not finished, so torch reads ``momentum`` after
    the change and uses the cumulative average (factor 1/1): the new running mean is
    the batch mean, not 0.1 of it."""
    x = seeded((6, 3), torch.float32, 9) * 3 + 5
    batch_mean = x.mean(0)
    errors = Errors({})
    runs = useful = 0
    bad = []
    deadline = time.monotonic() + seconds
    for _ in until(deadline, 100):
        bn = fast_if(side, nn.BatchNorm1d(3))
        entered = threading.Event()
        bn.register_forward_pre_hook(lambda m, a, entered=entered: entered.set())
        seen: list[int] = []

        def mutate(
            bn: nn.Module = bn, entered: threading.Event = entered, seen: list[int] = seen
        ) -> None:
            entered.wait()
            bn.momentum = None
            seen.append(int(bn.num_batches_tracked))

        t = spawn("mutator", mutate, errors)
        with torch.no_grad():
            bn(x)
        join_all([t], time.monotonic(), report)  # each round's own grace
        if report.hung:
            break
        runs += 1
        if seen and seen[0] == 0:
            useful += 1
            if not torch.allclose(bn.running_mean, batch_mean, rtol=1e-4):
                bad.append(
                    f"running_mean {bn.running_mean.tolist()} vs batch mean {batch_mean.tolist()}"
                )
    errors.into(report)
    report.stats.update(runs=runs, useful=useful)
    report.check(
        not bad,
        f"{len(bad)} calls read momentum before num_batches_tracked.add_ returned "
        f"(after it was set to None): {bad[:1]}",
    )


def scenario_apply_flag(side: str, seconds: float, report: Report) -> None:
    """``_apply`` reads ``torch.__future__``'s overwrite flag for each parameter, after
    converting it (which releases the GIL). The mutator waits until ``.double()`` is
    under way, sets the flag, then sees ``m1.weight`` still float32: ``m2`` (converted
    after ``m1``) must then read the flag as set and get a new Parameter object. The
    flag is restored after each round."""
    fut = torch.__future__
    was = fut.get_overwrite_module_params_on_conversion()
    errors = Errors({})
    runs = useful = 0
    bad = 0
    deadline = time.monotonic() + seconds
    try:
        for _ in until(deadline, 25):
            root = relation_root(side)
            root.m1 = nn.Linear(1, 1, bias=False)
            root.m2 = nn.Linear(1, 1, bias=False)
            fast_if(side, root)
            root.float()
            root.float()
            orig = root.m2.weight
            seen: list[torch.dtype] = []
            go = StartLine()
            done = threading.Event()

            def mutate(
                root: nn.Module = root,
                seen: list[torch.dtype] = seen,
                go: StartLine = go,
                done: threading.Event = done,
            ) -> None:
                go.wait_in_mutator()
                while root.m0.p10.dtype != torch.float64:
                    if done.is_set():
                        return
                fut.set_overwrite_module_params_on_conversion(True)
                seen.append(root.m1.weight.dtype)

            t = spawn("mutator", mutate, errors)
            go.start(t)
            try:
                root.double()
            finally:
                done.set()
            join_all([t], time.monotonic(), report)  # each round's own grace
            fut.set_overwrite_module_params_on_conversion(was)
            if report.hung:
                break
            runs += 1
            if seen and seen[0] == torch.float32:
                useful += 1
                bad += root.m2.weight is orig
    finally:
        fut.set_overwrite_module_params_on_conversion(was)
    errors.into(report)
    report.stats.update(runs=runs, useful=useful)
    report.check(
        bad == 0,
        f"{bad} conversions kept m2.weight's Parameter although the overwrite flag was set "
        "before m1 was converted",
    )


SCENARIOS: dict[str, Callable[[str, float, Report], None]] = {
    "mlp": scenario_mlp,
    "hf_bert": scenario_hf_bert,
    "layers": scenario_layers,
    "hooks": scenario_hooks,
    "walks": scenario_walks,
    "state_dict_order": scenario_state_dict_order,
    "load_order": scenario_load_order,
    "gc_state": scenario_gc_state,
    "bn_order": scenario_bn_order,
    "apply_flag": scenario_apply_flag,
}


def run_scenario(name: str, side: str, seconds: float) -> Report:
    """One scenario under forced interleaving; an exception from the scenario's own
    thread is a violation."""
    report = Report()
    gc.enable()
    with forced_interleaving():
        try:
            SCENARIOS[name](side, seconds, report)
        except Exception:  # noqa: BLE001 - reported as the scenario's result
            report.violations.append(f"the scenario raised:\n{traceback.format_exc()[-2000:]}")
    return report


def main(argv: list[str]) -> int:
    """``SECONDS SIDE:SCENARIO...``: run each in order, printing ``START side:scenario``
    and ``RESULT {json}`` lines. Acceleration is per class and for good, so every
    ``stock:`` item must come before the first ``fast:`` one."""
    seconds, items = float(argv[0]), [tuple(a.split(":")) for a in argv[1:]]
    sides = [side for side, _ in items]
    assert all(side in SIDES for side in sides), sides
    assert sides == sorted(sides, key=lambda x: x == "fast"), "stock items must come first"
    # As CI's cells: a warning attributed to fastmodule's own code is an error.
    warnings.filterwarnings("error", module="fastmodule")
    faulthandler.enable()
    for side, name in items:
        print(f"START {side}:{name}", flush=True)
        t0 = time.monotonic()
        report = run_scenario(name, side, seconds)
        report.stats["seconds"] = round(time.monotonic() - t0, 2)
        result = {"item": f"{side}:{name}", "violations": report.violations, "stats": report.stats}
        print("RESULT " + json.dumps(result), flush=True)
        if report.hung:
            # The hung thread cannot be joined: show where every thread is, and leave.
            faulthandler.dump_traceback(all_threads=True)
            sys.stderr.flush()
            os._exit(3)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
