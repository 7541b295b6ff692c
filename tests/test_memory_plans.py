"""What recorded walks (plans) cost in memory, and that it is given back.

A fresh interpreter (so that nothing another test left behind counts) builds a
tree of 4,001 modules, accelerates it and runs every whole-tree method that
records a plan, twice: that must add at most 1 KiB per module. What it adds is
measured with glibc's ``mallinfo2`` (the native side: plans live in Rust
allocations; CPython's small objects live in its own arenas, which
``mallinfo2`` does not see) and, in a second tree, with ``tracemalloc`` (the
Python side: the names and keys plans hold). Then ``fastmodule.restore`` must
give it all back, and so must the tree's death without a restore: once the
tree is gone, memory is back where it was before the tree was built.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from fastmodule import _core

BLOCKS = 1000
MODULES = 4 * BLOCKS + 1

SCRIPT = r"""
import ctypes, gc, json, sys, tracemalloc
import torch
from torch import nn
import fastmodule
from fastmodule import _core

torch.set_num_threads(1)
libc = ctypes.CDLL("libc.so.6")


class Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


libc.mallinfo2.restype = Mallinfo2


def malloced():
    i = libc.mallinfo2()
    return i.uordblks + i.hblkhd


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.ReLU()
        self.c = nn.LayerNorm(4)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def tree(blocks):
    m = nn.Sequential(*[Block() for _ in range(blocks)])
    sd = m.state_dict()
    fastmodule.accelerate(m)
    return m, sd


def ops(m, sd):
    list(m.named_parameters())
    list(m.parameters())
    list(m.named_modules())
    list(m.named_buffers())
    m.state_dict()
    m.load_state_dict(sd)
    m.train()
    m.eval()
    m.zero_grad()
    m.to(torch.float32)
    m.requires_grad_(True)


def scenario(blocks, measure, end):
    gc.collect()
    base = measure()
    m, sd = tree(blocks)
    # Nothing kept for the tree yet (classes accelerated by an earlier scenario
    # made its state_dict() native, and recorded).
    _core.forget_tree(list(torch.nn.Module.modules(m)))
    gc.collect()
    start = measure()
    ops(m, sd)
    ops(m, sd)
    gc.collect()
    out = {"added": measure() - start}
    if end == "restore":
        fastmodule.restore(m)
        gc.collect()
        out["restored"] = measure() - start
        out["names_after_restore"] = _core.plan_memory()[1]
    del m, sd
    gc.collect()
    # Against the start before the tree was built.
    out["freed"] = measure() - base
    out["roots_after_death"] = _core.plan_memory()[0]
    return out


blocks = int(sys.argv[1])
# Whatever a first use allocates once (interned names, lazily made tables), at
# the measured size: tables that grow to fit the largest tree seen (the interned
# names "0".."999", a hash table's capacity) are a one-time cost, not a leak; a
# leak would show again in each measured scenario below.
scenario(blocks, malloced, "restore")
scenario(2, malloced, "die")
result = {
    "malloc_restore": scenario(blocks, malloced, "restore"),
    "malloc_die": scenario(blocks, malloced, "die"),
}
tracemalloc.start()
traced = lambda: tracemalloc.get_traced_memory()[0]
result["traced_restore"] = scenario(blocks, traced, "restore")
result["traced_die"] = scenario(blocks, traced, "die")
print(json.dumps(result))
"""

glibc = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="mallinfo2 is glibc's",
)
_plans_kept = pytest.mark.skipif(
    not _core.recorded_walks(), reason="plans are off on this interpreter"
)
_native = pytest.mark.requires_native("what the native walks' recorded plans keep")


def plans_on(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` only where native walks record plans."""
    return _native(_plans_kept(test))


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    # Measured under CPython's own allocator: the debug allocator (the CI cells'
    # PYTHONMALLOC=debug) routes every Python object through malloc with padding,
    # so malloc's counts would be Python's, not the plans'.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "PYTHONDEVMODE")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(BLOCKS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# Allocator noise around a measurement (free lists, a Python list's growth).
SLACK = 128 * 1024
# What the plans of a tree may add per module, native and Python side together
# (measured: about 500 + 330 bytes on CPython 3.11; was 1,800 + 770).
PER_MODULE = 1024


@glibc
@plans_on
def test_plans_cost_little(measured: dict[str, Any]) -> None:
    """Two rounds of every whole-tree method that records a plan add at most
    ``PER_MODULE`` bytes per module: the plans, their snapshots of the modules, and
    the names and keys they hold (with the remembered names)."""
    for end in ("restore", "die"):
        native = measured[f"malloc_{end}"]["added"]
        python = measured[f"traced_{end}"]["added"]
        assert native > 0 and python > 0, measured
        per_module = (native + python) / MODULES
        assert per_module <= PER_MODULE, (end, native / MODULES, python / MODULES)


@glibc
@plans_on
def test_restore_gives_plans_back(measured: dict[str, Any]) -> None:
    """``restore(model)`` drops the tree's plans and every name only they held."""
    for kind in ("malloc_restore", "traced_restore"):
        r = measured[kind]
        assert r["added"] > 0, (kind, r)
        assert r["restored"] <= SLACK, (kind, r)
        assert r["freed"] <= SLACK, (kind, r)
        assert r["roots_after_death"] == 0, (kind, r)


@glibc
@plans_on
def test_tree_death_gives_plans_back(measured: dict[str, Any]) -> None:
    """A tree that dies without ``restore`` takes its plans and their names with it."""
    for kind in ("malloc_die", "traced_die"):
        r = measured[kind]
        assert r["added"] > 0, (kind, r)
        assert r["freed"] <= SLACK, (kind, r)
        assert r["roots_after_death"] == 0, (kind, r)


# ----------------------------------------------------------------- in this process


def _tree() -> Any:
    import torch
    from torch import nn

    return nn.Sequential(*[nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(3)]), torch


def _walk_all(m: Any, sd: Any, torch: Any) -> None:
    list(m.named_parameters())
    list(m.parameters())
    list(m.named_modules())
    m.state_dict()
    m.load_state_dict(sd)
    m.train()
    m.to(torch.float32)


@plans_on
def test_plans_hold_their_root_weakly_and_go_with_it() -> None:
    """A root with plans is watched by one weak reference to its ``_forward_hooks``
    (never a strong one, and none to the module: ``m.__weakref__`` is None, as in
    stock): the tree dies as in stock, and its plans with it."""
    import gc
    import weakref

    import fastmodule

    m, torch = _tree()
    sd = m.state_dict()
    fastmodule.accelerate(m)
    try:
        _walk_all(m, sd, torch)
        assert weakref.getweakrefcount(m) == 0
        assert m.__weakref__ is None
        assert weakref.getweakrefcount(m._forward_hooks) == 1
        watched = _core.plan_memory()[0]
        alive = weakref.ref(m)
        del m
        gc.collect()
        assert alive() is None
        assert _core.plan_memory()[0] <= watched - 1
    finally:
        fastmodule.restore(_tree()[0])


@plans_on
def test_every_root_with_a_plan_is_watched_past_the_release_threshold() -> None:
    """Watching a new root first releases the roots no plan uses any more (there are
    more than 32): released after the push, the new root itself went too (its plan is
    stored once it is watched), so a plan was kept with nothing watching its root."""
    import weakref

    from torch import nn

    import fastmodule

    roots = []
    try:
        for _ in range(40):
            m = nn.Sequential(nn.Linear(2, 2))
            roots.append(m)
            # accelerate() walks the tree; walk on until a walk of m was recorded
            # (a plan stored for m), then look at once.
            recorded = _core.plan_stats()[0]
            fastmodule.accelerate(m)
            for _ in range(20):
                if _core.plan_stats()[0] > recorded:
                    break
                list(m.named_modules())
            else:
                pytest.fail("no walk of the tree was recorded")
            watched = weakref.getweakrefcount(m._forward_hooks)
            assert watched == 1, f"root {len(roots)} not watched"
    finally:
        for m in roots:
            fastmodule.restore(m)


@plans_on
def test_restore_and_accelerated_exit_drop_the_tree_plans() -> None:
    """``restore`` and the exit of ``accelerated`` (when it restores) stop watching the
    tree's roots, and the tree walks as before afterwards."""
    import weakref

    import fastmodule

    m, torch = _tree()
    sd = m.state_dict()
    expected = [n for n, _ in m.named_parameters()]
    fastmodule.accelerate(m)
    _walk_all(m, sd, torch)
    list(m[1].parameters())
    assert weakref.getweakrefcount(m._forward_hooks) == 1
    assert weakref.getweakrefcount(m[1]._forward_hooks) == 1
    fastmodule.restore(m)
    assert weakref.getweakrefcount(m._forward_hooks) == 0
    assert weakref.getweakrefcount(m[1]._forward_hooks) == 0
    with fastmodule.accelerated(m):
        _walk_all(m, sd, torch)
        assert [n for n, _ in m.named_parameters()] == expected
        assert weakref.getweakrefcount(m._forward_hooks) == 1
    assert weakref.getweakrefcount(m._forward_hooks) == 0
    assert [n for n, _ in m.named_parameters()] == expected


@plans_on
def test_uninstall_drops_every_plan() -> None:
    import weakref

    import fastmodule

    fastmodule.install()
    try:
        m, torch = _tree()
        sd = m.state_dict()
        _walk_all(m, sd, torch)
        assert weakref.getweakrefcount(m) == 0
        assert m.__weakref__ is None
        assert weakref.getweakrefcount(m._forward_hooks) == 1
    finally:
        fastmodule.uninstall()
    assert weakref.getweakrefcount(m) == 0
    assert _core.plan_memory() == (0, 0)


@pytest.mark.parametrize("breakage", ["delete _modules", "_modules = None", "raise in block"])
def test_accelerated_exit_after_the_block_broke_the_tree(breakage: str) -> None:
    """The exit of ``accelerated`` gives back what was kept without walking the tree:
    a block that left a module without its ``_modules`` (or raised) ends exactly as the
    same block ends on stock, with nothing raised by the exit and the classes restored."""
    from torch import nn

    import fastmodule

    class Node(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

    class Marker(Exception):
        pass

    def block(m: nn.Module) -> None:
        list(m.parameters())
        m.state_dict()
        m.train()
        if breakage == "delete _modules":
            del m[0]._modules
        elif breakage == "_modules = None":
            m[0]._modules = None
        else:
            raise Marker("from the block")

    def run(accelerate: bool) -> tuple[Any, ...]:
        m = nn.Sequential(Node(), nn.ReLU())
        try:
            if accelerate:
                with fastmodule.accelerated(m):
                    block(m)
            else:
                block(m)
        except Exception as e:  # noqa: BLE001 - the outcome is what is compared
            return ("raised", type(e).__name__, str(e), e.__context__ is None)
        return ("ok",)

    stock = run(accelerate=False)
    assert run(accelerate=True) == stock
    assert not fastmodule.is_accelerated(Node())
    # No root is watched for plans: the exit gave everything back.
    assert _core.plan_memory()[0] == 0


@plans_on
@pytest.mark.parametrize("how", ["accelerated", "fastmodule.Module"])
def test_a_watched_root_shows_no_weak_reference(how: str) -> None:
    """Plans watch a root through its ``_forward_hooks``: the module itself shows the
    weak references stock shows (none, or the caller's own), whatever was recorded;
    a rebound ``_forward_hooks`` is watched anew, and the plans still go with the
    tree."""
    import gc
    import weakref

    import torch
    from torch import nn

    import fastmodule

    def tree() -> nn.Module:
        base = fastmodule.Module if how == "fastmodule.Module" else nn.Module
        root = type("Root", (base,), {})()
        root.a = nn.Linear(2, 2)
        root.b = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        return root

    def every_walk(m: nn.Module) -> None:
        for _ in range(3):
            sd = m.state_dict()
            m.load_state_dict(sd)
            list(m.named_parameters())
            list(m.named_modules())
            m.train()
            m.float()
            m.zero_grad()

    with fastmodule.disabled():
        stock = tree()
        every_walk(stock)
    m = tree()
    if how == "accelerated":
        fastmodule.accelerate(m)
    try:
        every_walk(m)
        assert _core.plan_stats()[0] > 0
        assert (m.__weakref__, weakref.getweakrefcount(m)) == (None, 0)
        assert (stock.__weakref__, weakref.getweakrefcount(stock)) == (None, 0)
        mine = weakref.ref(m)
        assert weakref.getweakrefs(m) == [mine]
        assert weakref.getweakrefcount(m._forward_hooks) == 1
        # Rebound: the old dict no longer watched, the new one is after the next walk.
        old = m._forward_hooks
        m._forward_hooks = type(old)()
        every_walk(m)
        assert weakref.getweakrefcount(m._forward_hooks) == 1
        assert weakref.getweakrefcount(old) == 0
        del old, mine
        watched = _core.plan_memory()[0]
        alive = weakref.ref(m)
        del m
        gc.collect()
        assert alive() is None
        assert _core.plan_memory()[0] <= watched - 1
        torch.zeros(1)  # keep torch imported for the stock walk above
    finally:
        fastmodule.restore(tree())
