"""One side of the stateful differential fuzzer (tests/test_fuzz_state_machine.py).

A ``World`` holds a module tree built from one class family: stock ``torch.nn.Module``
subclasses, ``fastmodule.Module`` subclasses, or stock subclasses accelerated in place
(each side has its own classes, since acceleration is per class). The machine applies
the same step to the three worlds and compares what each one observed: the step's
value or exception (type and text), the warnings, a log of every hook, finalizer,
colliding-key comparison and dict-subclass access, and a snapshot of the tree.

Objects a world creates get a serial number in creation order, so the stock object
and its counterparts in the other worlds carry the same label; nothing is compared
by ``id()`` across worlds.

Beside the tree, a world keeps a layer block (``World.layer``): one of torch's layers per
kind, made on first use, which the machine calls on inputs of several ranks and hooks
with pre-hooks that change the layer's attributes (``LAYER_CHANGES``), fail, or patch torch
for the rest of the call (tests/fuzz_patches.py).
"""

from __future__ import annotations

import collections
import contextlib
import queue
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize, prune

import fastmodule
from tests import fuzz_patches
from tests.conftest import NATIVE, LogFunctions, LogOps

SIDES = ("stock", "fast", "accel")

# Names the steps use: the sample tree's own names first (so most steps hit
# something that exists), then names torch treats specially or refuses.
NAMES = [
    "w",
    "b",
    "nb",
    "a",
    "seq",
    "inner",
    "deep",
    "weight",
    "bias",
    "running_mean",
    "0",
    "1",
    "x",
    "training",
    "forward",
    "a.b",
    "",
]
# Registry names as attribute names: the machine adds them to NAMES unless switched off.
REGISTRY_NAMES = ["_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"]

MODULE_KINDS = [
    "Node",
    "Leaf",
    "Leaf2",
    "Lin",
    "Seq",
    "List",
    "Dict",
    "BN",
    "Extra",
    "Mortal",
    "Base",
    # torch's layers fastmodule runs without frames (beside Lin, Seq and BN above).
    "Relu",
    "LN",
    "Softmax",
    "Drop",
    "GELU",
    "Conv",
]
SWAP_KINDS = ["Node", "Leaf", "Leaf2", "Extra", "Mortal", "Base", "Relu", "Lin", "Softmax"]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# An action: a small tree mutation that runs from inside something else (a hook, a
# finalizer, a colliding key's __eq__, between two items of a walk), on this thread
# or on the world's second thread.
ACTION_KINDS = [
    "add_buffer",
    "add_param",
    "add_child",
    "del_child",
    "del_param",
    "del_buffer",
    "replace_registry",
    "replace_dict",
    "set_training",
    "swap_class",
    "noop",
]
Action = tuple[str, int, int, bool]  # kind, module index, name index, on the second thread

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")

# The world whose step or snapshot is running: global hooks log into it.
CURRENT: list[World | None] = [None]


def clean(text: str) -> str:
    """An exception or warning text without object addresses (they differ per world),
    and with the fast side's base class named as stock's (the "Base" kind)."""
    text = text.replace("fastmodule.module.Module", "torch.nn.modules.module.Module")
    return _ADDRESS.sub("0x?", text)


# --------------------------------------------------------------------------- registries


class LoggingDict(dict):  # type: ignore[type-arg]
    """A registry whose Python-level methods log each call (torch's Python code calls
    them; code that reads the dict through C does not, which the log shows)."""

    log: list[Any] | None = None

    def _note(self, what: str, key: Any = None) -> None:
        log = self.__dict__.get("log")
        if log is not None:
            log.append(("dict", what, key if isinstance(key, str) else type(key).__name__))

    def __getitem__(self, k: Any) -> Any:
        self._note("getitem", k)
        return super().__getitem__(k)

    def __setitem__(self, k: Any, v: Any) -> None:
        self._note("setitem", k)
        super().__setitem__(k, v)

    def __delitem__(self, k: Any) -> None:
        self._note("delitem", k)
        super().__delitem__(k)

    def __contains__(self, k: Any) -> bool:
        self._note("contains", k)
        return super().__contains__(k)

    def get(self, k: Any, default: Any = None) -> Any:
        self._note("get", k)
        return super().get(k, default)

    def pop(self, k: Any, *default: Any) -> Any:
        self._note("pop", k)
        return super().pop(k, *default)

    def items(self) -> Any:
        self._note("items")
        return super().items()

    def values(self) -> Any:
        self._note("values")
        return super().values()

    def keys(self) -> Any:
        self._note("keys")
        return super().keys()


class PlainSubDict(dict):  # type: ignore[type-arg]
    """A dict subclass that overrides nothing."""


class SubSet(set):  # type: ignore[type-arg]
    """A set subclass for ``_non_persistent_buffers_set``."""


REGISTRY_KINDS = ["dict", "OrderedDict", "LoggingDict", "PlainSubDict"]
REGISTRIES = ["_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"]


class CollidingKey:
    """A non-str key whose hash equals ``hash(name)``: every lookup of ``name`` in a
    dict or set holding it compares with it. Its ``__eq__`` logs, runs ``action``
    once, and answers ``alias`` (equal to ``name``) or not equal."""

    def __init__(self, world: World, serial: int, name: str, alias: bool, action: Action) -> None:
        self.world, self.serial, self.name, self.alias = world, serial, name, alias
        self.action: Action | None = action

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        w = self.world
        if w.dead:
            return other is self
        w.log.append(("eq", self.serial, other if isinstance(other, str) else "?"))
        action, self.action = self.action, None
        if action is not None:
            w.act(action)
        if other is self:
            return True
        return self.alias and other == self.name

    def __repr__(self) -> str:
        return f"CollidingKey({self.name!r})"


class Dropper:
    """A plain attribute value whose finalizer runs an action."""

    def __init__(self, world: World, serial: int, action: Action) -> None:
        self.world, self.serial, self.action = world, serial, action

    def __del__(self) -> None:
        w = self.world
        if not w.dead:
            w.log.append(("del", self.serial))
            w.act(self.action)


# --------------------------------------------------------------------------- classes


def generic_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Adds every registered tensor (read as an attribute), then calls every child."""
    if id(self) in _ACTIVE:  # a cycle made by a swap or a finalizer: once per call
        return x
    _ACTIVE.add(id(self))
    try:
        for name in [*self._parameters, *self._buffers]:
            v = getattr(self, name) if type(name) is str else None
            if isinstance(v, torch.Tensor):
                x = x + v
        for c in list(self._modules.values()):
            if c is not None:
                x = c(x)
        return x
    finally:
        _ACTIVE.discard(id(self))


_ACTIVE: set[int] = set()


def leaf2_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * 2 + getattr(self, "w", 0)


def make_family(side: str) -> dict[str, type[nn.Module]]:
    """The module classes of one side, with the same names (error texts name them)."""
    base: type[nn.Module] = fastmodule.Module if side == "fast" else nn.Module
    # On the fast side torch's layers are mixed under fastmodule.Module.
    mix: tuple[type, ...] = (fastmodule.Module,) if side == "fast" else ()

    class Node(base):  # type: ignore[misc, valid-type]
        forward = generic_forward

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))
            self.register_buffer("nb", torch.randn(2), persistent=False)

        forward = generic_forward

    class Leaf2(base):  # type: ignore[misc, valid-type]
        forward = leaf2_forward

    class Lin(*mix, nn.Linear):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(2, 2)

    class Seq(*mix, nn.Sequential):  # type: ignore[misc]
        pass

    class List(*mix, nn.ModuleList):  # type: ignore[misc]
        forward = generic_forward

    class Dict(*mix, nn.ModuleDict):  # type: ignore[misc]
        forward = generic_forward

    class BN(*mix, nn.BatchNorm1d):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(2)

    class Extra(base):  # type: ignore[misc, valid-type]
        """Extra state, and its own _save_to_state_dict/_load_from_state_dict."""

        forward = generic_forward

        def get_extra_state(self) -> Any:
            return {"n": len(self._parameters)}

        def set_extra_state(self, state: Any) -> None:
            self.__dict__["loaded_extra"] = state

        def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
            super()._save_to_state_dict(destination, prefix, keep_vars)
            destination[prefix + "own"] = torch.ones(1)

        def _load_from_state_dict(  # type: ignore[override]
            self, state_dict: Any, prefix: str, *args: Any
        ) -> None:
            state_dict.pop(prefix + "own", None)
            super()._load_from_state_dict(state_dict, prefix, *args)

    class Mortal(base):  # type: ignore[misc, valid-type]
        """Runs its world's action when freed."""

        forward = generic_forward

        def __del__(self) -> None:
            spec = self.__dict__.get("_fz")
            if spec is not None and not spec[0].dead:
                spec[0].log.append(("module del", spec[2]))
                spec[0].act(spec[1])

    class Scale(base):  # type: ignore[misc, valid-type]
        """A parametrization."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    # torch's layers, shaped for the tree's (3, 2) input: Conv1d reads it unbatched.
    class Relu(*mix, nn.ReLU):  # type: ignore[misc]
        pass

    class LN(*mix, nn.LayerNorm):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(2)

    class Softmax(*mix, nn.Softmax):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(dim=1)

    class Drop(*mix, nn.Dropout):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(p=0.0)

    class GELU(*mix, nn.GELU):  # type: ignore[misc]
        pass

    class Conv(*mix, nn.Conv1d):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(3, 3, 1)

    return {
        "Node": Node,
        "Leaf": Leaf,
        "Leaf2": Leaf2,
        "Lin": Lin,
        "Seq": Seq,
        "List": List,
        "Dict": Dict,
        "BN": BN,
        "Extra": Extra,
        "Mortal": Mortal,
        "Scale": Scale,
        "Base": base,
        "Relu": Relu,
        "LN": LN,
        "Softmax": Softmax,
        "Drop": Drop,
        "GELU": GELU,
        "Conv": Conv,
    }


_FAMILIES: dict[str, dict[str, type[nn.Module]]] = {}


def family(side: str) -> dict[str, type[nn.Module]]:
    """Each side's classes, made once per process; the accelerated side's are
    accelerated in place (through a tree holding one instance of each)."""
    if side not in _FAMILIES:
        fam = make_family(side)
        if side == "accel":
            holder = nn.Module()
            for k, cls in fam.items():
                if k != "Base":
                    holder.add_module(k, cls())
            holder.__class__ = fam["Node"]
            fastmodule.accelerate(holder)
            # `holder` itself is a Node; the plain nn.Module base stays stock. (Where no
            # native path is on, nothing is accelerated: the side runs stock.)
            assert all(fastmodule.is_accelerated(m) for m in nn.Module.modules(holder)) is NATIVE
        _FAMILIES[side] = fam
    return _FAMILIES[side]


def restore_families() -> None:
    """Undo the accelerated side's acceleration (and of classes parametrize derived)."""
    from fastmodule import _core

    fam = _FAMILIES.get("accel")
    if not fam or not NATIVE:
        return
    stack = [c for k, c in fam.items() if k != "Base"]
    seen: set[type] = set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        _core.restore_class(cls)
        stack.extend(type.__subclasses__(cls))


# --------------------------------------------------------------------------- worker thread


class Worker:
    """A second thread that runs one function at a time while the caller waits on an
    event: the mutation happens on another thread at an exact point of this one."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()

    def run(self, fn: Callable[[], None]) -> None:
        if threading.current_thread() is self.thread:  # (a finalizer run by this thread)
            fn()
            return
        done = threading.Event()

        def job() -> None:
            try:
                fn()
            finally:
                done.set()

        self.jobs.put(job)
        done.wait()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join()


# --------------------------------------------------------------------------- the world


class World:
    """One side's tree, its labels, logs, hooks and open walks."""

    def __init__(self, side: str, worker: Worker) -> None:
        self.side = side
        self.fam = family(side)
        self.worker = worker
        self.log: list[Any] = []
        self.dead = False
        self.acting = False
        self._serial = 0
        self._labels: dict[int, tuple[weakref.ref[Any], int]] = {}
        self.handles: dict[int, Any] = {}
        self.iters: list[Iterator[Any] | None] = []
        self.finalizers: list[weakref.finalize] = []
        self.modes: list[str] = []
        # The layer block: one torch layer per kind, outside the tree (made on first use).
        self.layers: dict[str, nn.Module] = {}
        self.root = self.build()

    # ------------------------------------------------------------------ labels

    def serial(self) -> int:
        self._serial += 1
        return self._serial

    def new(self, obj: Any) -> Any:
        """Label a created object with the next serial number."""
        self._labels[id(obj)] = (weakref.ref(obj), self.serial())
        return obj

    def label(self, obj: Any) -> int | None:
        entry = self._labels.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None

    def make(self, kind: str) -> nn.Module:
        # Seeded by the serial, so every world draws the same initial values (the CPU
        # generator itself: torch.manual_seed takes a lock a GC finalizer may re-enter).
        torch.default_generator.manual_seed(self._serial)
        m = self.new(self.fam[kind]())
        for t in list(m.__dict__["_parameters"].values()) + list(m.__dict__["_buffers"].values()):
            if t is not None:
                self.new(t)
        return m

    def tensor(self, seed: int, shape: int = 2, param: bool = False) -> torch.Tensor:
        t = torch.arange(float(shape)) + seed / 4
        return self.new(nn.Parameter(t) if param else t)

    def build(self) -> nn.Module:
        root = self.make("Node")
        root.a = self.make("Leaf")
        root.seq = self.make("Seq")
        root.seq.append(self.make("Lin"))
        root.seq.append(self.make("BN"))
        root.a.inner = self.make("Node")
        root.a.inner.deep = self.make("Leaf")
        root.e = self.make("Extra")
        root.shared = root.a.inner
        root.register_parameter("tied", root.a.w)
        root.register_buffer("top", self.tensor(1), persistent=False)
        return root

    def layer(self, kind: str) -> nn.Module:
        """The layer block's layer of ``kind`` (``Seq``: a Lin and a Relu in a Seq)."""
        m = self.layers.get(kind)
        if m is None:
            m = self.make(kind)
            if kind == "Seq":
                m.append(self.make("Lin"))
                m.append(self.make("Relu"))
            self.layers[kind] = m
        return m

    # ------------------------------------------------------------------ raw tree

    def raw(self, m: Any) -> dict[str, Any]:
        """``m``'s instance dict, read without any module code."""
        try:
            d = object.__getattribute__(m, "__dict__")
        except Exception:  # noqa: BLE001 - not a module any more
            return {}
        return d if isinstance(d, dict) else {}

    def registry(self, m: Any, name: str) -> Any:
        for k, v in list(self.raw(m).items()):
            # Identity comparison only: the walk of the observer runs no key's __eq__.
            if type(k) is str and k == name:
                return v
        return None

    def modules(self) -> list[tuple[tuple[Any, ...], nn.Module]]:
        """Every module reachable through ``_modules`` registries (first path wins)."""
        out: list[tuple[tuple[Any, ...], nn.Module]] = []
        seen: set[int] = set()
        stack: list[tuple[tuple[Any, ...], Any]] = [((), self.root)]
        while stack:
            path, m = stack.pop()
            if id(m) in seen or not isinstance(m, nn.Module):
                continue
            seen.add(id(m))
            out.append((path, m))
            mods = self.registry(m, "_modules")
            if isinstance(mods, dict):
                kids = [(path + (k if type(k) is str else "?",), c) for k, c in mods.items()]
                stack.extend(reversed(kids))
        return out

    def reaches(self, start: nn.Module, target: nn.Module) -> bool:
        """Is ``target`` reachable from ``start`` through ``_modules`` registries?"""
        stack, seen = [start], set()
        while stack:
            m = stack.pop()
            if m is target:
                return True
            if id(m) in seen:
                continue
            seen.add(id(m))
            mods = self.registry(m, "_modules")
            if isinstance(mods, dict):
                stack.extend(c for c in mods.values() if isinstance(c, nn.Module))
        return False

    def at(self, i: int, having: str | None = None) -> nn.Module:
        """The ``i``-th module; with ``having``, among those whose registry of that
        name holds str keys (when any does)."""
        mods = [m for _, m in self.modules()]
        if having is not None:
            full = [m for m in mods if self.str_keys(self.registry(m, having))]
            mods = full or mods
        return mods[i % len(mods)]

    @staticmethod
    def str_keys(reg: Any) -> list[str]:
        return [k for k in reg if type(k) is str] if isinstance(reg, dict | set) else []

    def fill(self, start: nn.Module) -> None:
        """Every tensor and grad under ``start`` set to known values (raw registries)."""
        for _, m in self.modules():
            if m is not start and not self.reaches(start, m):
                continue
            for reg in ("_parameters", "_buffers"):
                r = self.registry(m, reg)
                for t in r.values() if isinstance(r, dict) else ():
                    for x in (t, getattr(t, "grad", None)):
                        if isinstance(x, torch.Tensor):
                            with torch.no_grad():
                                x.fill_(1)

    def key_at(self, m: nn.Module, registry: str, i: int) -> Any:
        """The ``i``-th key of one of ``m``'s registries, or a name from NAMES."""
        keys = self.str_keys(self.registry(m, registry))
        if keys and i % 4:
            return keys[i % len(keys)]
        return NAMES[i % len(NAMES)]

    # ------------------------------------------------------------------ actions

    def act(self, action: Action) -> None:
        """Run ``action`` (once at a time; an action started inside one is logged only)."""
        if self.dead:
            return
        if self.acting:
            self.log.append(("nested", action[0]))
            return
        self.acting = True
        try:
            # (Not in chaos mode: a finalizer the GC runs inside the queue's own lock
            # would wait for itself.)
            if action[3] and CHAOS[0] is None:
                box: list[Any] = []
                self.worker.run(lambda: box.append(self._act(action)))
                r = box[0]
            else:
                r = self._act(action)
            self.log.append(("act", action, r))
        finally:
            self.acting = False

    def _act(self, action: Action) -> Any:
        kind, mi, ni, _ = action
        if CHAOS[0] is not None and kind not in CHAOS[1]:
            return "off"  # chaos mode with a chosen set of actions
        try:
            m = self.at(mi)
            if kind == "add_buffer":
                m.register_buffer(NAMES[ni % 4], self.tensor(ni))
            elif kind == "add_param":
                setattr(m, NAMES[ni % 4], self.tensor(ni, param=True))
            elif kind == "add_child":
                setattr(m, NAMES[3 + ni % 4], self.make("Leaf"))
            elif kind == "del_child":
                delattr(m, self.key_at(m, "_modules", ni))
            elif kind == "del_param":
                delattr(m, self.key_at(m, "_parameters", ni))
            elif kind == "del_buffer":
                delattr(m, self.key_at(m, "_buffers", ni))
            elif kind == "replace_registry":
                which = REGISTRIES[ni % 3]
                m.__dict__[which] = dict(m.__dict__[which])
            elif kind == "replace_dict":
                m.__dict__ = dict(m.__dict__)
            elif kind == "set_training":
                m.training = bool(ni % 2)
            elif kind == "swap_class":
                m.__class__ = self.fam[SWAP_KINDS[ni % len(SWAP_KINDS)]]
            return "done"
        except Exception as e:  # noqa: BLE001 - the error is part of what is compared
            return (type(e).__name__, clean(str(e)))

    # ------------------------------------------------------------------ hooks

    def hook(self, hid: int, kind: str, behaviour: str, action: Action) -> Callable[..., Any]:
        """A hook of ``kind`` that logs its call, then does ``behaviour``."""

        def run(m: Any, *rest: Any) -> Any:
            if self.dead:
                return None
            self.log.append(("hook", hid, kind, self.label(m)))
            if behaviour == "raise":
                raise RuntimeError(f"hook {hid} failed")
            if behaviour == "act":
                self.act(action)
            if behaviour == "change":
                return change(kind, rest)
            if behaviour == "return1":
                return 1
            return None

        return run

    # ------------------------------------------------------------------ finalizers

    def on_free(self, obj: Any, action: Action) -> None:
        """Run ``action`` when ``obj`` is freed (a weakref finalizer)."""
        s = self.serial()

        def fire() -> None:
            if not self.dead:
                self.log.append(("freed", s))
                self.act(action)

        self.finalizers.append(weakref.finalize(obj, fire))

    # ------------------------------------------------------------------ description

    def describe(self, v: Any, depth: int = 0) -> Any:
        """``v`` as comparable data: created objects by label, tensors by value."""
        if depth > 6:
            return "..."
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, torch.Tensor):
            return self.tensor_info(v)
        if isinstance(v, nn.Module):
            return ("module", type(v).__name__, self.label(v))
        if isinstance(v, dict):
            items = [
                (self.describe(k, depth + 1), self.describe(x, depth + 1)) for k, x in v.items()
            ]
            meta = getattr(v, "_metadata", None)
            meta_d = self.describe(dict(meta), depth + 1) if isinstance(meta, dict) else None
            return (type(v).__name__, items, meta_d)
        if isinstance(v, list | tuple):
            return (type(v).__name__, [self.describe(x, depth + 1) for x in v])
        if isinstance(v, set | frozenset):
            return ("set", sorted(repr(self.describe(x, depth + 1)) for x in v))
        if isinstance(v, CollidingKey):
            return ("key", v.serial)
        if isinstance(v, Dropper):
            return ("dropper", v.serial)
        return ("other", type(v).__name__)

    def tensor_info(self, t: torch.Tensor) -> Any:
        try:
            values = ["nan" if x != x else x for x in t.detach().float().flatten().tolist()]
        except Exception as e:  # noqa: BLE001 - meta tensors and the like
            values = ("no values", type(e).__name__)
        grad_fn = t.grad_fn
        return (
            type(t).__name__,
            self.label(t),
            str(t.dtype),
            tuple(t.shape),
            t.requires_grad,
            type(grad_fn).__name__ if grad_fn is not None else None,
            values,
        )

    # ------------------------------------------------------------------ modes

    @contextlib.contextmanager
    def mode(self) -> Iterator[None]:
        """The grad and torch-function/dispatch modes the machine switched on."""
        with contextlib.ExitStack() as stack:
            for m in self.modes:
                if m == "no_grad":
                    stack.enter_context(torch.no_grad())
                elif m == "functions":
                    stack.enter_context(LogFunctions(self.log))
                elif m == "ops":
                    stack.enter_context(LogOps(self.log))
            yield

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Silence every hook, key, finalizer and action of this world and drop it."""
        self.dead = True
        for f in self.finalizers:
            f.detach()
        for it in self.iters:
            if it is not None and hasattr(it, "close"):
                try:
                    it.close()
                except Exception:  # noqa: BLE001 - a walk may fail to close
                    pass
        self.iters.clear()
        self.handles.clear()


def change(kind: str, rest: tuple[Any, ...]) -> Any:
    """What a hook of ``kind`` with behaviour "change" returns (or changes in place)."""
    if kind in ("forward", "forward_always"):
        out = rest[-1]
        return out * 2 if isinstance(out, torch.Tensor) else None
    if kind == "forward_kwargs":
        out = rest[-1]
        return out + 1 if isinstance(out, torch.Tensor) else None
    if kind in ("forward_pre", "forward_pre_prepend"):
        (args,) = rest
        return tuple(a * 3 if isinstance(a, torch.Tensor) else a for a in args)
    if kind == "state_dict_private":
        sd = rest[0]
        sd["hooked"] = torch.zeros(1)
        return None
    if kind == "load_pre":
        sd, prefix = rest[0], rest[1]
        sd.pop(prefix + "w", None)
        return None
    if kind == "load_post":
        incompatible = rest[0]
        incompatible.missing_keys.clear()
        return None
    return None


def global_hook(hid: int, kind: str, behaviour: str) -> Callable[..., Any]:
    """A process-wide hook: logs into the world whose step is running."""

    def run(m: Any, *rest: Any) -> Any:
        w = CURRENT[0]
        if w is None or w.dead:
            return None
        w.log.append(
            (
                "global hook",
                hid,
                kind,
                w.label(m),
                rest[0] if kind.endswith("registration") else None,
            )
        )
        if behaviour == "raise":
            raise RuntimeError(f"global hook {hid} failed")
        if behaviour == "change" and kind.startswith("forward"):
            return change(kind, rest)
        return None

    return run


GLOBAL_HOOK_KINDS = [
    "forward",
    "forward_pre",
    "forward_always",
    "parameter_registration",
    "buffer_registration",
    "module_registration",
]


def register_global_hook(kind: str, fn: Callable[..., Any]) -> Any:
    from torch.nn.modules import module as mm

    if kind == "forward":
        return mm.register_module_forward_hook(fn)
    if kind == "forward_pre":
        return mm.register_module_forward_pre_hook(fn)
    if kind == "forward_always":
        return mm.register_module_forward_hook(fn, always_call=True)
    if kind == "parameter_registration":
        return mm.register_module_parameter_registration_hook(lambda m, n, v: fn(m, n))
    if kind == "buffer_registration":
        return mm.register_module_buffer_registration_hook(lambda m, n, v: fn(m, n))
    return mm.register_module_module_registration_hook(lambda m, n, v: fn(m, n))


HOOK_KINDS = [
    "forward",
    "forward_pre",
    "forward_pre_prepend",
    "forward_kwargs",
    "forward_always",
    "backward",
    "state_dict_pre",
    "state_dict_post",
    "state_dict_private",
    "load_pre",
    "load_post",
]
HOOK_BEHAVIOURS = ["log", "log", "change", "raise", "act", "return1"]

# Methods an instance attribute may shadow, and torch methods a library may patch.
SHADOWED = [
    "forward",
    "train",
    "children",
    "named_children",
    "named_modules",
    "named_parameters",
    "state_dict",
    "_save_to_state_dict",
    "_load_from_state_dict",
    "_apply",
    "zero_grad",
    "requires_grad_",
    "get_extra_state",
    "_named_members",
]
PATCHED = [
    "named_modules",
    "named_children",
    "named_parameters",
    "named_buffers",
    "state_dict",
    "_save_to_state_dict",
    "load_state_dict",
    "_load_from_state_dict",
    "_apply",
    "train",
    "zero_grad",
    "register_parameter",
    "register_buffer",
    "get_submodule",
]


def shadow(world: World, m: nn.Module, name: str, weird: bool) -> Callable[..., Any]:
    """An instance attribute shadowing method ``name`` of ``m``: it logs, then calls the
    class's method (or, ``weird``, returns something of another kind). The method is
    looked up at each call: one taken before a patch of torch.nn.Module would run
    torch's original on stock and the patch on fastmodule.Module, whose methods are
    its own (README; found/10)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if world.dead:
            return None
        world.log.append(("shadow", name, world.label(m)))
        method = getattr(type(m), name, None)
        if weird or method is None:
            if name.startswith("named"):
                return iter([("weird", 17)])
            return iter([17]) if name == "children" else 17
        return method(m, *args, **kwargs)

    return run


def patch_torch(name: str) -> Callable[[], None]:
    """Replace ``torch.nn.Module.<name>`` with a wrapper that logs into the running
    world and calls torch's function; returns the undo."""
    original = nn.Module.__dict__[name]

    def patched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        w = CURRENT[0]
        if w is not None and not w.dead:
            w.log.append(("patched", name, w.label(self)))
        return original(self, *args, **kwargs)

    setattr(nn.Module, name, patched)
    return lambda: setattr(nn.Module, name, original)


def register_hook(m: nn.Module, kind: str, fn: Callable[..., Any]) -> Any:
    """Register ``fn`` on ``m`` as a hook of ``kind``; returns the handle."""
    if kind == "forward":
        return m.register_forward_hook(fn)
    if kind == "forward_pre":
        return m.register_forward_pre_hook(fn)
    if kind == "forward_pre_prepend":
        return m.register_forward_pre_hook(fn, prepend=True)
    if kind == "forward_kwargs":
        return m.register_forward_hook(lambda m, a, k, o: fn(m, a, o), with_kwargs=True)
    if kind == "forward_always":
        return m.register_forward_hook(fn, always_call=True)
    if kind == "backward":
        return m.register_full_backward_hook(lambda m, gi, go: fn(m) and None)
    if kind == "state_dict_pre":
        return m.register_state_dict_pre_hook(lambda m, p, k: fn(m) and None)
    if kind == "state_dict_post":
        return m.register_state_dict_post_hook(lambda m, sd, p, md: fn(m) and None)
    if kind == "state_dict_private":
        return m._register_state_dict_hook(lambda m, sd, p, md: fn(m, sd, p))
    if kind == "load_pre":
        return m.register_load_state_dict_pre_hook(lambda m, sd, p, *a: fn(m, sd, p))
    if kind == "load_post":
        return m.register_load_state_dict_post_hook(lambda m, inc: fn(m, inc))
    raise ValueError(kind)


class Gremlin:
    """Cyclic garbage whose finalizer runs an action on the running world whenever the
    cyclic GC happens to collect it: in chaos mode, in the middle of anything."""

    def __init__(self, action: Action) -> None:
        self.me, self.action = self, action

    def __del__(self) -> None:
        w = CURRENT[0]
        if w is not None and not w.dead:
            w.act(self.action)


# Chaos mode (crash hunting, nothing compared): a GC threshold this low and a few
# gremlins before each step.
CHAOS: list[Any] = [None, ACTION_KINDS]


def release_gremlins(n: int) -> None:
    rng, kinds = CHAOS[0], CHAOS[1]
    for _ in range(n):
        kind = kinds[rng.randrange(len(kinds))]
        Gremlin((kind, rng.randrange(64), rng.randrange(64), False))


def record(world: World, fn: Callable[[], Any]) -> tuple[Any, ...]:
    """Run ``fn`` in ``world``: its value or exception, warnings (with the file and line
    they point at), and the world's log (with the calls of torch's patched functions)."""
    CURRENT[0] = world
    if CHAOS[0] is not None:
        release_gremlins(3)
    # Dropout draws random numbers: each world's step starts from the same state.
    torch.default_generator.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught, world.mode():
        warnings.simplefilter("always")
        try:
            fuzz_patches.SINK[0] = world.log
            try:
                value = fn()
            finally:
                fuzz_patches.SINK[0] = None
                fuzz_patches.unwind()  # what hooks patched during a call they left
            r: Any = ("ok", world.describe(value))
        except RecursionError:
            # Where the limit is met, hence the text's suffix, depends on the frames
            # below (README, Known differences).
            r = ("raised", "RecursionError")
        except Exception as e:  # noqa: BLE001 - the exception *is* the result under test
            r = ("raised", type(e).__name__, clean(str(e)))
    warned = [(w.category.__name__, clean(str(w.message)), w.filename, w.lineno) for w in caught]
    log, world.log = world.log, []
    return r, warned, log


def snapshot(world: World, x_seed: int) -> dict[str, Any]:
    """Everything observable about the tree (each read through the module methods
    under test, except the raw listing used for identities)."""
    w, root = world, world.root
    out: dict[str, Any] = {}
    mods = w.modules()
    raw: list[Any] = []
    for path, m in mods:
        d = w.raw(m)
        entry: list[Any] = [
            path,
            type(m).__name__,
            w.label(m),
            w.describe(w.registry(m, "training")),
        ]
        for reg in ("_parameters", "_buffers"):
            r = w.registry(m, reg)
            entry.append(
                [
                    (
                        k if type(k) is str else "?",
                        w.describe(v),
                        w.describe(getattr(v, "grad", None)),
                    )
                    for k, v in r.items()
                ]
                if isinstance(r, dict)
                else type(r).__name__
            )
        nps = w.registry(m, "_non_persistent_buffers_set")
        entry.append(sorted(k for k in nps if type(k) is str) if isinstance(nps, set) else None)
        entry.append(sorted(repr(k) for k in d if type(k) is str and not k.startswith("_fz")))
        raw.append(entry)
    out["raw"] = raw
    out["layers"] = [
        (
            kind,
            w.label(m),
            type(m).__name__,
            [(a, w.describe(v)) for a, v in sorted(w.raw(m).items()) if a in LAYER_ATTRS],
            [
                (k, w.describe(v))
                for reg in ("_parameters", "_buffers")
                for k, v in (w.registry(m, reg) or {}).items()
            ],
            len(w.registry(m, "_modules") or ()),
        )
        for kind, m in w.layers.items()
    ]
    out["named_modules"] = record(w, lambda: [(n, w.label(m)) for n, m in root.named_modules()])
    out["named_parameters"] = record(w, lambda: list(root.named_parameters()))
    out["named_buffers"] = record(w, lambda: list(root.named_buffers()))
    out["state_dict"] = record(w, lambda: root.state_dict())
    x = torch.ones(3, 2) + x_seed
    out["forward"] = record(w, lambda: root(x))
    return out


# --------------------------------------------------------------------------- the layer block

# The layer block's kinds, and the inputs a step calls them with: the tree's own shape
# first, then ranks and sizes some layers refuse or hand over to torch (BatchNorm1d on
# 3-d input; Conv1d batched).
LAYER_BLOCK = ["Lin", "Relu", "Seq", "LN", "Softmax", "Drop", "BN", "GELU", "Conv"]
LAYER_INPUTS = [(3, 2), (3, 2), (2,), (1, 2), (3, 2, 4), (2, 3, 2), (2, 2, 2, 2)]
# What a step, or a forward pre-hook during the call, changes on a layer, by kind:
# (attribute, value). Seq's "append" appends a Relu (its restore deletes it).
LAYER_CHANGES: dict[str, list[tuple[str, Any]]] = {
    "Lin": [("bias", None), ("training", False), ("weight", None), ("in_features", 5)],
    "Relu": [("inplace", True), ("training", False), ("inplace", 1), ("inplace", "yes")],
    "Seq": [("append", None), ("training", False)],
    "LN": [
        ("eps", 10.0),
        ("normalized_shape", (3,)),
        ("weight", None),
        ("bias", None),
        ("eps", torch.tensor(2.0)),
        ("normalized_shape", [2]),
    ],
    "Softmax": [("dim", None), ("dim", 0), ("dim", -1), ("dim", 3), ("dim", None), ("dim", True)],
    "Drop": [
        ("p", 1.0),
        ("p", 0.5),
        ("p", 1.5),
        ("inplace", True),
        ("training", False),
        ("p", torch.tensor(1.0)),
        ("p", 1),
    ],
    "BN": [
        ("eps", 10.0),
        ("momentum", None),
        ("training", False),
        ("track_running_stats", False),
        ("running_mean", None),
        ("momentum", torch.tensor(0.5)),
        ("num_batches_tracked", None),
    ],
    "GELU": [("approximate", "tanh"), ("approximate", "bad"), ("approximate", None)],
    "Conv": [
        ("padding", (1,)),
        ("padding", "same"),
        ("stride", (2,)),
        ("padding_mode", "reflect"),
        ("groups", 3),
        ("padding", 1),
    ],
}
# The plain attributes the snapshot shows of the layer block.
LAYER_ATTRS = {
    "training",
    "dim",
    "p",
    "inplace",
    "eps",
    "momentum",
    "normalized_shape",
    "track_running_stats",
    "padding",
    "stride",
    "padding_mode",
    "approximate",
}
# Hooks on a layer: "attr" sets the change in a forward pre-hook and an always_call
# forward hook restores it, "attr_keep" leaves it set; "raise_pre" raises in a pre-hook,
# "always_raise" in an always_call forward hook (after a failed call torch warns that
# it silenced that error), "both_raise" does both; "always_log" only logs; "patch"
# applies a process-wide patch (fuzz_patches.DURING_CALL) in the pre-hook and takes it
# back in an always_call forward hook (and at the end of the step, whatever happened).
LAYER_HOOKS = [
    "attr",
    "attr",
    "attr",
    "attr_keep",
    "raise_pre",
    "always_raise",
    "both_raise",
    "always_log",
    "patch",
]


class LoggedTensor(torch.Tensor):
    """An input with ``__torch_function__``: logs each torch function it meets into the
    running world (torch's layers then take their Python path for that step)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        w = CURRENT[0]
        if w is not None and not w.dead:
            w.log.append(("torch function", getattr(func, "__name__", "?")))
        return super().__torch_function__(func, types, args, kwargs or {})


def layer_input(shape: int, seed: int, how: str) -> torch.Tensor:
    """A LAYER_INPUTS input: "plain", "grad" (requires grad) or "sub" (a LoggedTensor)."""
    dims = LAYER_INPUTS[shape % len(LAYER_INPUTS)]
    n = 1
    for d in dims:
        n *= d
    x = ((torch.arange(float(n)) - n / 2 + seed / 4) / 2).reshape(dims)
    if how == "sub":
        return x.as_subclass(LoggedTensor)
    return x.requires_grad_(how == "grad")


def change_layer(
    m: nn.Module, attr: str, value: Any, child: Callable[[], nn.Module] | None = None
) -> Any:
    """Apply a LAYER_CHANGES change to ``m`` ("append": a ``child()``); returns what
    undoes it."""
    if attr == "append":
        m.append(child() if child is not None else nn.ReLU())  # type: ignore[operator]
        return None
    old = getattr(m, attr, None)
    setattr(m, attr, value)
    return old


def undo_layer_change(m: nn.Module, attr: str, old: Any) -> None:
    if attr == "append":
        del m[len(m) - 1]  # type: ignore[arg-type]
    else:
        setattr(m, attr, old)


class Handles:
    """Several hook handles removed as one."""

    def __init__(self, *handles: Any) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def layer_change(kind: str, change: int) -> tuple[str, Any]:
    changes = LAYER_CHANGES[kind]
    return changes[change % len(changes)]


def layer_hooks(
    world: World, hid: int, m: nn.Module, what: str, change: tuple[str, Any], prepend: bool
) -> Any:
    """Register the hooks of a LAYER_HOOKS entry on ``m``; their handle. ``change`` is a
    LAYER_CHANGES entry, for "patch" ("patch", one of fuzz_patches.DURING_CALL)."""
    attr, value = change
    saved: list[Any] = []

    def pre(mod: Any, args: Any) -> None:
        if world.dead:
            return
        world.log.append(("hook", hid, what, world.label(mod)))
        if what in ("raise_pre", "both_raise"):
            raise RuntimeError(f"pre-hook {hid} failed")
        if what.startswith("attr"):
            saved.append(change_layer(mod, attr, value, lambda: world.make("Relu")))
        if what == "patch":
            saved.append(fuzz_patches.push(value))

    def post(mod: Any, args: Any, out: Any) -> None:
        if world.dead:
            return
        world.log.append(("hook", hid, what + " after", world.label(mod)))
        if what in ("always_raise", "both_raise"):
            raise ValueError(f"always_call hook {hid} failed")
        if what == "attr" and saved:
            undo_layer_change(mod, attr, saved.pop())
        if what == "patch" and saved:
            fuzz_patches.pop(saved.pop())

    if what in ("attr_keep", "raise_pre"):
        return m.register_forward_pre_hook(pre, prepend=prepend)
    post_h = m.register_forward_hook(post, prepend=prepend, always_call=True)
    if what in ("attr", "both_raise", "patch"):
        return Handles(m.register_forward_pre_hook(pre, prepend=prepend), post_h)
    return post_h


def walk_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A WALKS entry's arguments, with a fresh set for "memo"."""
    return tuple(set() if a == "memo" else a for a in args)


def iterate(it: Iterator[Any], n: int) -> list[Any]:
    """Up to ``n`` items of ``it`` (fewer if it ends)."""
    got = []
    for _ in range(n):
        try:
            got.append(next(it))
        except StopIteration:
            got.append("end")
            break
    return got


# The iterators and their argument forms the walks step draws from.
WALKS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("named_modules", (), {}),
    ("named_modules", (), {"remove_duplicate": False}),
    ("named_modules", (None, "p"), {}),
    ("named_modules", ("memo", "m"), {}),  # "memo": a fresh caller-supplied set
    ("modules", (), {}),
    ("named_children", (), {}),
    ("children", (), {}),
    ("named_parameters", (), {}),
    ("named_parameters", (), {"recurse": False}),
    ("named_parameters", ("p",), {"remove_duplicate": False}),
    ("parameters", (), {}),
    ("named_buffers", (), {}),
    ("named_buffers", (), {"remove_duplicate": False}),
    ("buffers", (), {}),
]


def load_source(world: World, target: nn.Module, edit: int, k: int) -> Any:
    """A state dict for ``target``: its own, then one edit (missing, unexpected,
    mis-shaped, other dtype, non-tensor, no metadata, plain dict)."""
    sd = target.state_dict()
    keys = [k2 for k2 in sd if isinstance(k2, str)]
    key = keys[k % len(keys)] if keys else "w"
    if edit == 1 and keys:
        del sd[key]
    elif edit == 2:
        sd[NAMES[k % len(NAMES)] + ".zz"] = torch.zeros(2)
    elif edit == 3 and keys:
        sd[key] = torch.zeros(k % 4 + 3)
    elif edit == 4 and keys:
        sd[key] = (
            torch.ones_like(sd[key], dtype=torch.float64)
            if isinstance(sd[key], torch.Tensor)
            else sd[key]
        )
    elif edit == 5 and keys:
        sd[key] = 3
    elif edit == 6:
        sd = collections.OrderedDict(sd)  # no _metadata
    elif edit == 7:
        sd = dict(sd)
    return sd


LOAD_EDITS = 8


def register_parametrization(m: nn.Module, name: str, scale: type[nn.Module]) -> Any:
    return parametrize.register_parametrization(m, name, scale())


def remove_parametrization(m: nn.Module, name: str, keep: bool) -> Any:
    return parametrize.remove_parametrizations(m, name, leave_parametrized=keep)


def prune_l1(m: nn.Module, name: str) -> Any:
    return prune.l1_unstructured(m, name, amount=1)


def prune_remove(m: nn.Module, name: str) -> Any:
    return prune.remove(m, name)


def outcome_of(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """``fn()``'s value, or its exception's type name and text (addresses removed)."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the exception *is* the result under test
        return ("raised", type(e).__name__, clean(str(e)))
