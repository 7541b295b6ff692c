"""What keeps every test independent of the tests run before it (the suite runs in a
random order, pytest-randomly).

- ``at_fixed_depth``: a recursion-limit scenario runs in a fresh thread (recursion depth
  0, a stack of a fixed size) under a limit it names, whatever pytest's own depth or the
  limit some earlier code left (torch's inductor raises it to 2000 for good).
- ``process_state_kept`` (autouse, through conftest): each test starts from the same
  process-wide state. What torch, libraries and Python change for good by themselves
  (the recursion limit, Dynamo's patch of ``Module.__init__``, cached slot names) is
  put back quietly; what only a test can have left behind (global hooks, a patched
  class attribute, ``install()``, accelerated classes, a trace function, GC or thread
  settings, the default dtype, grad mode) is put back and fails the test that left
  it. torch's global RNG is seeded per test from its node id, so a test draws the
  same numbers in any order. The module classes' type-version budget is a fresh
  process's (``type_versions``: the suite modifies ``nn.Module`` far more often than
  a program does).
"""

from __future__ import annotations

import gc
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.modules.module as torch_module

import fastmodule
from fastmodule import _core
from tests.type_versions import reset_module_classes

T = TypeVar("T")

# Ample for any scenario in the suite (Python frames take no C stack on 3.11; native
# walks and generator chains do), and the same on every machine, whatever `ulimit -s`.
SCENARIO_STACK_BYTES = 64 * 1024 * 1024


def at_fixed_depth(call: Callable[[], T], limit: int = 1000) -> T:
    """``call()`` in a fresh thread under recursion limit ``limit``: its recursion depth
    starts at 0 there (plus the thread's few bootstrap frames), on a stack of
    ``SCENARIO_STACK_BYTES``. The caller's limit and thread stack size are restored.
    ``call``'s exception, if any, is raised here."""
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            error.append(e)

    old_limit = sys.getrecursionlimit()
    old_stack = threading.stack_size(SCENARIO_STACK_BYTES)
    try:
        sys.setrecursionlimit(limit)
        t = threading.Thread(target=run, name="fixed-depth scenario")
        t.start()
        t.join()
    finally:
        threading.stack_size(old_stack)
        sys.setrecursionlimit(old_limit)
    if error:
        raise error[0]
    return result[0]


# --------------------------------------------------------------------------- process state

# Classes and module namespaces whose attributes a test may patch (and must put back).
PATCHABLE: list[Any] = [torch.nn.Module, torch.Tensor, torch.nn.Parameter, torch_module]
# What libraries patch for good by themselves, put back quietly (each patches again
# when it next needs to, and every other test sees torch as a fresh process has it):
# torch.compile's Dynamo wraps Module.__init__/__setstate__ (generation tags) on first
# use; transformers adds Module.smart_apply when it first initialises weights.
LIBRARY_PATCHES = {
    (torch.nn.Module, "__init__"),
    (torch.nn.Module, "__setstate__"),
    (torch.nn.Module, "___has_generation_tag_patch"),
    # The same flag under its older name (torch 2.11).
    (torch.nn.Module, "___needs_generation_tag_patch"),
    (torch.nn.Module, "smart_apply"),
}
# Python's own caches, also put back quietly: copyreg's slot names (first pickle, copy
# or swap of an instance) and the warnings module's once-per-location registry.
# (3.14 keeps a class's evaluated annotations in its dict as ``__annotations_cache__``,
# PEP 649/749: written by the first ``__annotations__`` read, not by the test.)
PYTHON_CACHES = {"__slotnames__", "__warningregistry__", "__annotations_cache__"}


def stock_module_classes() -> Iterator[type]:
    """Every subclass of ``torch.nn.Module`` alive now, fastmodule's own excluded."""
    stack, seen = [torch.nn.Module], {torch.nn.Module}
    while stack:
        cls = stack.pop()
        if not issubclass(cls, fastmodule.Module):
            yield cls
        for sub in type.__subclasses__(cls):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)


def accelerated_leftovers() -> list[type]:
    """Stock module classes (fastmodule's own excluded) accelerated in place or carrying
    native slots right now (none where no native path is on: ``slots_of`` answers
    without asking the core, which was never initialised there)."""
    return [
        cls
        for cls in stock_module_classes()
        if _core.is_accelerated_class(cls) or fastmodule.slots_of(cls)[:2] != (False, False)
    ]


def global_hook_dicts() -> dict[str, dict[Any, Any]]:
    """torch's module-global hook registries, by name."""
    return {
        k: v
        for k, v in vars(torch_module).items()
        if k.startswith("_global_") and isinstance(v, dict)
    }


class Snapshot:
    """Process-wide state a test could change, taken before it runs."""

    def __init__(self) -> None:
        self.recursion_limit = sys.getrecursionlimit()
        self.stack_size = threading.stack_size()
        self.trace = (sys.gettrace(), sys.getprofile())
        self.gc = (gc.isenabled(), gc.get_threshold())
        self.torch = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
        self.hooks = {k: dict(v) for k, v in global_hook_dicts().items()}
        self.attrs = [dict(vars(obj)) for obj in PATCHABLE]
        # Imports at collection may accelerate classes for good: only new ones count.
        self.installed = fastmodule.installed()
        self.accelerated = set(accelerated_leftovers())
        # Whether caches and plans are on (and how) is process-wide and cannot be
        # switched back: a test must never switch them off.
        self.validity = _core.cache_validity().split(" (")[0]

    def restore(self) -> list[str]:
        """Put everything back; what a test left behind (not torch's own changes)."""
        left: list[str] = []
        # torch.compile's inductor raises the limit on purpose: not the test's doing.
        sys.setrecursionlimit(self.recursion_limit)
        if threading.stack_size() != self.stack_size:
            left.append("threading.stack_size")
            threading.stack_size(self.stack_size)
        if (sys.gettrace(), sys.getprofile()) != self.trace:
            left.append("sys.settrace/setprofile")
            sys.settrace(self.trace[0])
            sys.setprofile(self.trace[1])
        if (gc.isenabled(), gc.get_threshold()) != self.gc:
            left.append("gc enabled/threshold")
            (gc.enable if self.gc[0] else gc.disable)()
            gc.set_threshold(*self.gc[1])
        if (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()) != (
            self.torch
        ):
            left.append("torch default dtype/grad mode/num threads")
            torch.set_default_dtype(self.torch[0])
            torch.set_grad_enabled(self.torch[1])
            torch.set_num_threads(self.torch[2])
        if fastmodule.installed() and not self.installed:
            left.append("fastmodule.install()")
            fastmodule.uninstall()
        if _core.cache_validity().split(" (")[0] != self.validity:
            left.append(f"cache validity now {_core.cache_validity()!r}")
        classes = [c for c in accelerated_leftovers() if c not in self.accelerated]
        if classes:
            left.append(f"accelerated classes {[c.__qualname__ for c in classes][:10]}")
            for cls in classes:
                _core.restore_class(cls)
        for name, hooks in global_hook_dicts().items():
            before = self.hooks.get(name, {})
            if hooks != before:
                left.append(f"torch.nn.modules.module.{name}")
                hooks.clear()
                hooks.update(before)
        for obj, before in zip(PATCHABLE, self.attrs, strict=True):
            now = vars(obj)
            changed = [k for k in now.keys() | before.keys() if now.get(k) is not before.get(k)]
            for k in changed:
                if (obj, k) not in LIBRARY_PATCHES and k not in PYTHON_CACHES:
                    left.append(f"{getattr(obj, '__qualname__', obj.__name__)}.{k}")
                if k in before:
                    setattr(obj, k, before[k])
                else:
                    delattr(obj, k)
        return left


def seed_for(nodeid: str) -> int:
    """torch's global seed for one test: its node id's, the same in any order."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def process_state_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """The same process-wide state before every test, and a failure for any test that
    changes it without putting it back."""
    reset_module_classes()
    snap = Snapshot()
    torch.manual_seed(seed_for(request.node.nodeid))
    yield
    left = snap.restore()
    if left:
        pytest.fail(f"test left process-wide state changed (now restored): {left}")
