"""Reference counts and memory stay flat over many native operations."""

from __future__ import annotations

import gc
import sys
import tracemalloc
import warnings
import weakref
from typing import Any

import torch
from torch import nn

import fastmodule


class Net(fastmodule.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.w = nn.Parameter(torch.zeros(2))

    def forward(self, x: Any, k: int = 0) -> Any:
        return x


def test_refcounts_flat_over_many_calls() -> None:
    m = Net()
    x = object()
    p = nn.Parameter(torch.zeros(1))
    sub = nn.Identity()
    before = (sys.getrefcount(m), sys.getrefcount(x), sys.getrefcount(p), sys.getrefcount(sub))
    for _ in range(20000):
        m(x)
        m(x, k=1)
        m.forward(x)
        m.lin
        m.w
        try:
            m.missing
        except AttributeError:
            pass
        m.p = p
        del m.p
        m.s = sub
        del m.s
        m.plain = x
        del m.plain
        m.register_buffer("b", None)
        del m.b
    after = (sys.getrefcount(m), sys.getrefcount(x), sys.getrefcount(p), sys.getrefcount(sub))
    assert before == after


def test_no_memory_growth() -> None:
    m = Net()
    x = torch.zeros(1)
    for _ in range(1000):
        m(x)
        m.lin
    gc.collect()
    tracemalloc.start()
    snap1 = tracemalloc.take_snapshot()
    for _ in range(50000):
        m(x)
        m.lin
        m.w = m.w
        try:
            m.missing
        except AttributeError:
            pass
    gc.collect()
    snap2 = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in snap2.compare_to(snap1, "filename"))
    assert growth < 64 * 1024, growth


def test_cycles_are_collected() -> None:
    class Cyc(fastmodule.Module):
        def forward(self) -> Any:
            return self

    m = Cyc()
    m.child = Cyc()
    m.child.back = [m]
    m()
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None


def test_classes_are_collected() -> None:
    def make() -> type:
        class Temp(fastmodule.Module):
            def forward(self) -> int:
                return 1

        Temp()()
        return Temp

    ref = weakref.ref(make())
    gc.collect()
    assert ref() is None


def test_tree_walks_keep_refcounts_flat() -> None:
    class Block(fastmodule.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("b", torch.zeros(1))

    class Root(fastmodule.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(5))
            self.shared = self.blocks[0]

    m = Root()
    tracked = [m, m.blocks, m.blocks[0].lin.weight, m.blocks[1].b]
    before = [sys.getrefcount(o) for o in tracked]
    for _ in range(2000):
        list(m.named_modules())
        list(m.modules())
        list(m.named_parameters())
        list(m.parameters(recurse=False))
        list(m.named_buffers(prefix="p"))
        list(m.children())
        it = m.named_parameters()
        next(it)
        del it
        m.train()
        m.eval()
        m.requires_grad_(True)
        m.zero_grad()
        m.apply(lambda mod: None)
    gc.collect()
    assert [sys.getrefcount(o) for o in tracked] == before


def test_abandoned_walk_iterators_are_collected() -> None:
    m = Net()
    it = m.named_modules()
    next(it)
    ref = weakref.ref(m)
    cycle: list[Any] = [it]
    cycle.append(cycle)
    del it, m, cycle
    gc.collect()
    assert ref() is None


def test_refcounts_flat_over_native_layers() -> None:
    """The native layer forwards (``src/call/layers/``), on their own route and on
    each hand-over, leave every object they touch as they found it."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.SiLU(),
        nn.MaxPool2d(2),
        nn.Dropout2d(0.1),
        nn.AdaptiveAvgPool2d((None, 1)),
        nn.Flatten(),
        nn.LayerNorm(12),
        nn.GELU(),
        nn.Dropout(0.2),
        nn.Identity(),
        nn.Tanh(),
        nn.Softmax(-1),
    )
    emb = nn.Embedding(10, 3, padding_idx=-1)
    reflect = nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")
    x = torch.randn(2, 2, 6, 6)
    idx = torch.tensor([1, 2, 9])
    watched = [x, idx, *model.parameters(), *model.buffers(), *emb.parameters()]
    watched += [model[1].momentum, model[1].eps, model[9].p, model[7].normalized_shape]
    with (
        fastmodule.accelerated(model),
        fastmodule.accelerated(emb),
        fastmodule.accelerated(reflect),
    ):
        for train in (True, False, True):
            model.train(train)
            for _ in range(3):
                model(x)
                emb(idx)
                reflect(x)
            before = [sys.getrefcount(o) for o in watched]
            with torch.no_grad():
                for _ in range(2000):
                    model(x)
                    emb(idx)
                    reflect(x)
            gc.collect()
            assert [sys.getrefcount(o) for o in watched] == before


def test_refcounts_flat_over_frame_counting_handovers() -> None:
    """Calls that keep torch's call frames (``src/call/frames.rs``): handed over
    from the call slot, from ``nn.Module.__call__`` and from a hooked call, each
    decided from the call cache after the first."""
    softmax = nn.Softmax()
    norm = nn.InstanceNorm1d(3)
    hooked = nn.Softmax()
    hooked.register_forward_hook(lambda mod, args, out: None)
    x = torch.randn(2, 3, 4)
    watched = [x, softmax, norm, hooked, nn.Softmax.forward.__code__]
    with (
        warnings.catch_warnings(),
        fastmodule.accelerated(softmax),
        fastmodule.accelerated(norm),
        fastmodule.accelerated(hooked),
    ):
        warnings.simplefilter("ignore")
        for _ in range(3):
            softmax(x), norm(x), hooked(x), nn.Module.__call__(softmax, x)
        before = [sys.getrefcount(o) for o in watched]
        for _ in range(2000):
            softmax(x), norm(x), hooked(x), nn.Module.__call__(softmax, x)
        gc.collect()
        assert [sys.getrefcount(o) for o in watched] == before
