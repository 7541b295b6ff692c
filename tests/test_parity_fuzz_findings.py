"""Differences the state-machine fuzzer found (tests/test_fuzz_state_machine.py), each as
a small scenario run on stock ``torch.nn.Module`` and on ``fastmodule.Module``.

Most are about code that runs during a dict or set lookup: a non-str key whose hash
equals a name's has its ``__eq__`` called by every lookup of that name, so how many
lookups torch's code makes (and where) is observable. The fuzzer switches these
features off while they differ (its ``KNOWN`` table names these tests).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import BASES, NATIVE, outcome

Base = type[nn.Module]


class Colliding:
    """A key equal in hash to ``name``; ``__eq__`` logs and answers ``equal``."""

    def __init__(self, name: str, log: list[Any], equal: bool = False) -> None:
        self.name, self.log, self.equal = name, log, equal

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        self.log.append(other)
        return self.equal and other == self.name


# From 3.12 on, CPython's specialising interpreter makes lookups of its own when it
# tries to specialise an attribute read in torch's code, and when it tries depends on
# what ran before in the process (stock against stock differs by run order). The
# number of `__eq__` calls is compared where it is stock's behaviour (3.11); from 3.12
# on, which names were compared.
EQ_COUNTS_ARE_STOCK_BEHAVIOUR = sys.version_info < (3, 12)


def seen(log: list[Any]) -> list[Any]:
    """What a scenario records of ``log``: see ``EQ_COUNTS_ARE_STOCK_BEHAVIOUR``."""
    return log[:] if EQ_COUNTS_ARE_STOCK_BEHAVIOUR else sorted({repr(o) for o in log})


def same_on_both(scenario: Any) -> None:
    stock, fast = (outcome(lambda b=b: scenario(b)) for b in BASES)
    assert fast == stock


def node_class(base: Base) -> type[nn.Module]:
    class Node(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for c in self._modules.values():
                if c is not None:
                    x = c(x)
            return x

    return Node


def test_call_looks_forward_up_in_the_instance_dict_every_time() -> None:
    """``m(x)`` reads ``self.forward``: one instance-dict lookup per call, even when
    the previous call found nothing there. (found/01)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        node = node_class(b)
        root = node()
        root.leaf = node()
        root.leaf.__dict__[Colliding("forward", log)] = 5
        out = []
        for _ in range(3):
            root(torch.zeros(1))
            root.leaf(torch.zeros(1))
            out.append(seen(log))
            log.clear()
        return out

    same_on_both(sc)


def test_walk_reads_a_colliding_registry_name_once() -> None:
    """A module whose ``_buffers`` name is found through a non-str key: each
    named_buffers walk looks it up once. (found/02)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        node = node_class(b)
        root = node()
        root.e = node()
        root.e._buffers = node()  # a submodule named "_buffers": the registry leaves __dict__
        root.e.__dict__[Colliding("_buffers", log, equal=True)] = 5
        out = []
        for _ in range(3):
            out.append((outcome(lambda: [n for n, _ in root.named_buffers()]), seen(log)))
            log.clear()
        return out

    same_on_both(sc)


def test_linear_reads_weight_through_the_instance_dict_every_call() -> None:
    """torch's ``Linear.forward`` reads ``self.weight``: one instance-dict lookup per
    call, so a colliding key's ``__eq__`` runs once per call. (found/04)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        lin_cls = type("Lin", (b, nn.Linear) if b is not nn.Module else (nn.Linear,), {})
        root = node_class(b)()
        torch.manual_seed(0)
        root.lin = lin_cls(2, 2)
        root.lin.__dict__[Colliding("weight", log)] = 5
        out = []
        for _ in range(3):
            root(torch.ones(3, 2))
            out.append(seen(log))
            log.clear()
        return out

    same_on_both(sc)


@pytest.mark.parametrize("registry", ["_parameters", "_buffers", "_modules"])
@pytest.mark.parametrize("equal", [True, False], ids=["key_equal", "key_before_entry"])
def test_getattr_tests_then_reads_the_registry(registry: str, equal: bool) -> None:
    """torch's ``__getattr__`` tests ``name in registry`` and then reads
    ``registry[name]``: two lookups, so a colliding key met on the way (equal to the
    name, or unequal but inserted before the name's entry) has its ``__eq__`` run
    twice per read; fast runs it once. (found/05)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        node = node_class(b)
        m = node()
        value: Any = {
            "_parameters": nn.Parameter(torch.ones(1)),
            "_buffers": torch.ones(1),
            "_modules": node(),
        }[registry]
        m.__dict__[registry][Colliding("x", log, equal=equal)] = None if not equal else value
        if not equal:
            m.__dict__[registry]["x"] = value
        log.clear()
        out = []
        for _ in range(2):
            out.append((type(m.x).__name__, seen(log)))
            log.clear()
            out.append((hasattr(m, "x"), seen(log)))
            log.clear()
        return out

    same_on_both(sc)


@pytest.mark.parametrize("registry", ["_parameters", "_buffers", "_modules"])
def test_train_tests_training_against_each_registry_every_call(registry: str) -> None:
    """``train()`` sets ``training`` through torch's ``__setattr__``, which tests the
    name against the registries on every call (recorded replays included). (found/07)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []
        node = node_class(b)
        root = node()
        root.a = node()
        root.seq = node()
        root.seq.__dict__[registry][Colliding("training", log)] = None
        out = []
        for i in range(4):
            root.train(i % 2 == 0)
            out.append(seen(log))
            log.clear()
        return out

    same_on_both(sc)


def test_load_tests_every_buffer_key_against_the_non_persistent_set() -> None:
    """torch's ``_load_from_state_dict`` tests every buffer key, None entries
    included, against ``_non_persistent_buffers_set``. (found/08)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []

        class Leaf(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.w = nn.Parameter(torch.zeros(2))
                self.register_buffer("nb", torch.zeros(2), persistent=False)

        root = node_class(b)()
        root.leaf = Leaf()
        root.leaf._buffers[Colliding("nb", log)] = None
        sd = root.state_dict()
        out = []
        for _ in range(3):
            out.append((str(root.load_state_dict(sd)), seen(log)))
            log.clear()
        return out

    same_on_both(sc)


@pytest.mark.parametrize("strict", [True, False])
def test_load_tests_the_non_persistent_set_once_per_buffer(strict: bool) -> None:
    """A non-str element equal to the buffer name "b" in
    ``_non_persistent_buffers_set``: torch's load tests each buffer key against the set
    once per load (unexpected keys present); fast twice. (found/11)"""

    def sc(b: Base) -> Any:
        log: list[Any] = []

        class Leaf(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.w = nn.Parameter(torch.zeros(2))
                self.register_buffer("b", torch.zeros(2))

        root = node_class(b)()
        root.leaf = Leaf()
        sd = {"leaf.w": torch.ones(2), "leaf.b": torch.ones(2), "leaf.zz": torch.ones(2)}
        root.leaf._non_persistent_buffers_set.add(Colliding("b", log, equal=True))
        out = []
        for _ in range(2):
            out.append((outcome(lambda: str(root.load_state_dict(sd, strict=strict))), seen(log)))
            log.clear()
            out.append((list(root.state_dict()), seen(log)))
            log.clear()
        return out

    same_on_both(sc)


def test_accelerated_stock_tree_matches_too() -> None:
    """The first scenario above on stock classes accelerated in place."""
    from fastmodule import _core

    def run(accelerate: bool) -> Any:
        log: list[Any] = []
        node = node_class(nn.Module)
        root = node()
        root.leaf = node()
        root.leaf.__dict__[Colliding("forward", log)] = 5
        if accelerate:
            fastmodule.accelerate(root)
        try:
            out = []
            for _ in range(3):
                root(torch.zeros(1))
                out.append(seen(log))
                log.clear()
            return out
        finally:
            if NATIVE:  # (else accelerate() changed no class)
                _core.restore_class(node)

    assert run(True) == run(False)


SETATTR_UNDER_REGISTRY_NAME = """
import sys, torch, torch.nn as nn, fastmodule
Base = fastmodule.Module if sys.argv[1] == "fast" else nn.Module

class M(Base):
    def forward(self, x):
        return x

for name in ("_buffers", "_parameters", "_non_persistent_buffers_set", "_modules"):
    for value in (M(), nn.Parameter(torch.ones(1)), 5):
        m = M()
        try:
            setattr(m, name, value)
            r = "ok"
        except Exception as e:
            r = f"{type(e).__name__}: {e}"
        d = m.__dict__
        print(name, type(value).__name__, r, sorted(k for k in d if "hooks" not in k), flush=True)
        mods = d.get("_modules")
        if isinstance(mods, dict):
            mods = {k: type(v).__name__ for k, v in mods.items()}
        print("  ", type(mods).__name__, mods if isinstance(mods, dict) else "", flush=True)
"""


def run_script(script: str, side: str) -> tuple[int, str]:
    """``script`` run with argument ``side`` in a fresh interpreter under the debug
    allocator (a use-after-free crashes there): exit status and output."""
    from tests.fresh_sides import run_python

    rc, out, _ = run_python(["-c", script, side])
    return rc, out


def test_setattr_under_a_registry_name() -> None:
    """``m._buffers = Module()`` (and the other registries, other values): torch's
    ``__setattr__`` deletes the registry from ``__dict__`` while ``remove_from``'s
    arguments still hold it. Run in a subprocess under the debug allocator: fast used
    the freed registry (a crash). (found/09)"""
    stock = run_script(SETATTR_UNDER_REGISTRY_NAME, "stock")
    assert stock[0] == 0
    assert run_script(SETATTR_UNDER_REGISTRY_NAME, "fast") == stock


GETATTR_DICT_REPLACED = """
import sys, torch, torch.nn as nn, fastmodule
Base = fastmodule.Module if sys.argv[1] == "fast" else nn.Module

class M(Base):
    def forward(self, x):
        return x

m = M()
m.register_buffer("running_mean", torch.zeros(2))

class Key:
    armed = True
    def __hash__(self):
        return hash("running_mean")
    def __eq__(self, other):
        if Key.armed:
            Key.armed = False
            junk = [{} for _ in range(100)]
            m.__dict__ = dict(m.__dict__)
            del junk
        return False

m._parameters[Key()] = None
print(m.running_mean, flush=True)
print(m.running_mean, flush=True)
"""


def test_getattr_survives_the_instance_dict_replaced() -> None:
    """Reading a buffer whose lookup in ``_parameters`` meets a colliding key whose
    ``__eq__`` replaces the module's ``__dict__`` (the old one freed): torch's
    ``__getattr__`` goes on with the registries it holds; fast read the freed
    instance dict (a crash). (found/12; repro 10 frees the registry instead)"""
    stock = run_script(GETATTR_DICT_REPLACED, "stock")
    assert stock[0] == 0
    assert run_script(GETATTR_DICT_REPLACED, "fast") == stock


# --- what a native path rests on, changed at run time (fuzz_patches; issue 31) -------------


def layer(b: Base, cls: type[nn.Module], *args: Any) -> nn.Module:
    """A torch layer on stock, or with fastmodule.Module mixed in (native paths)."""
    return (type(cls.__name__, (b, cls), {}) if b is not nn.Module else cls)(*args)


def test_container_builtins_shadowed() -> None:
    """``iter`` and ``len``, which Sequential/ModuleList/ModuleDict's ``__iter__`` and
    ``__len__`` find in ``builtins``, shadowed by globals of
    ``torch.nn.modules.container``: stock calls the shadowing functions, the native
    container methods and Sequential's forward did not. (fuzz: patch global
    container.iter / container.len)"""
    import torch.nn.modules.container as container

    def sc(b: Base) -> Any:
        calls: list[str] = []
        seq = layer(b, nn.Sequential, layer(b, nn.ReLU))
        ml = layer(b, nn.ModuleList, [layer(b, nn.ReLU)])

        def counting_iter(x: Any) -> Any:
            calls.append("iter")
            return iter(x)

        def counting_len(x: Any) -> int:
            calls.append("len")
            return len(x)

        container.iter, container.len = counting_iter, counting_len  # type: ignore[attr-defined]
        try:
            seq(torch.ones(2))
            out = [calls[:]]
            calls.clear()
            list(ml), len(ml), list(seq), len(seq)
            return [*out, calls[:]]
        finally:
            del container.iter, container.len  # type: ignore[attr-defined]

    same_on_both(sc)


def test_module_globals_torch_replaced() -> None:
    """``torch`` in ``torch.nn.modules.module``'s globals replaced by a proxy:
    stock's ``_call_impl`` reads ``torch._C`` on every call (and ``torch.compiler``
    with an always_call hook); fast read neither through that global. (fuzz: patch
    global module.torch)"""
    import types

    import torch.nn.modules.module as module_py

    def sc(b: Base) -> Any:
        reads: list[str] = []

        class Proxy(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                reads.append(name)
                return getattr(torch, name)

        lin = layer(b, nn.Linear, 2, 2)
        module_py.torch = Proxy("torch")  # type: ignore[attr-defined]
        try:
            lin(torch.ones(2))
            out = [reads[:]]
            reads.clear()
            lin.register_forward_hook(lambda *a: None, always_call=True)
            lin(torch.ones(2))
            return [*out, reads[:]]
        finally:
            module_py.torch = torch  # type: ignore[attr-defined]

    same_on_both(sc)


def warn_bridge(seen: list[Any]) -> Any:
    """A ``warnings.warn`` that records how and from where it was called and forwards
    with one ``stacklevel`` more (a logging bridge keeping the attribution)."""
    import os
    import warnings

    original = warnings.warn

    def bridge(message: Any, category: Any = None, stacklevel: int = 1, *a: Any, **k: Any) -> Any:
        f = sys._getframe(1).f_code
        seen.append((str(message)[:40], stacklevel, os.path.basename(f.co_filename), f.co_name))
        return original(message, category, stacklevel + 1, *a, **k)

    return bridge


def caught_warnings(fn: Any, bridge: Any = None) -> list[Any]:
    """``fn()``'s warnings (category, file, line), with ``warnings.warn`` replaced by
    ``bridge`` meanwhile."""
    import os
    import warnings

    original = warnings.warn
    if bridge is not None:
        warnings.warn = bridge
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
    finally:
        warnings.warn = original
    return [(x.category.__name__, os.path.basename(x.filename), x.lineno) for x in w]


def test_warn_bridge_sees_torchs_frames() -> None:
    """A failing always_call hook after a failed call: torch's ``_call_impl`` calls
    ``warnings.warn(..., stacklevel=2)``. A replaced ``warn`` that looks at its caller
    sees torch's ``_call_impl`` on stock, and forwarding with ``stacklevel + 1`` puts
    the warning at module.py; fast called it without torch's frames (its caller the
    user's line, the warning at ``sys:1``). (fuzz: patch global warnings.warn_bridge)"""

    def sc(b: Base) -> Any:
        seen: list[Any] = []
        m = layer(b, nn.Linear, 2, 2)
        m.register_forward_pre_hook(lambda *a: 1 / 0)

        def failing(*a: Any) -> None:
            raise ValueError("always hook failed")

        m.register_forward_hook(failing, always_call=True)
        got = caught_warnings(lambda: outcome(lambda: m(torch.ones(2))), warn_bridge(seen))
        return seen, got

    same_on_both(sc)


def test_state_dict_positional_warn_as_torch_calls_it() -> None:
    """``state_dict(None, "p.")`` warns that positional arguments are deprecated:
    torch calls ``warnings.warn(..., stacklevel=2)`` from ``state_dict``;
    fastmodule.Module's ``state_dict`` called it with ``stacklevel=3`` (a replaced
    ``warn`` sees other arguments). (fuzz: patch global warnings.warn_bridge)"""

    def sc(b: Base) -> Any:
        seen: list[Any] = []
        m = node_class(b)()
        m.lin = nn.Linear(2, 2)
        got = caught_warnings(lambda: m.state_dict(None, "p."), warn_bridge(seen))
        return seen, got

    same_on_both(sc)


@pytest.mark.parametrize("how", ["code_swap", "defaults", "settrace", "setprofile"])
def test_state_dict_positional_warning_after_a_code_swap(how: str) -> None:
    """``state_dict(None, "p.")``'s FutureWarning points at the caller's line. Once
    torch's code runs the call on fastmodule.Module (a whole-tree method's code or
    defaults replaced, as a hot reload does, even by equal ones; a trace or profile
    function set, as coverage and debuggers do) fast pointed it at torch's module.py.
    (fuzz: state_dict positional after a code swap; found under cProfile)"""

    def sc(b: Base) -> Any:
        m = node_class(b)()
        m.lin = nn.Linear(2, 2)
        f = nn.Module.named_children
        old, tracer, profiler = f.__code__, sys.gettrace(), sys.getprofile()
        g = nn.Module.named_parameters
        defaults = g.__defaults__
        if how == "code_swap":
            f.__code__ = old.replace()  # another code object, the same instructions
        elif how == "defaults":
            g.__defaults__ = tuple(list(defaults or ()))  # equal values, another tuple
        elif how == "settrace":
            sys.settrace(lambda *a: None)
        else:
            sys.setprofile(lambda *a: None)
        try:
            return caught_warnings(lambda: m.state_dict(None, "p."))
        finally:
            f.__code__ = old
            g.__defaults__ = defaults
            sys.settrace(tracer)
            sys.setprofile(profiler)

    same_on_both(sc)
