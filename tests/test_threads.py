"""Fastmodule objects used from several threads behave as stock ones do."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

from tests.conftest import BASES, outcome


def make(base: type[nn.Module]) -> nn.Module:
    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    return Net()


def test_generator_resumed_in_another_thread() -> None:
    results = []
    for base in BASES:
        m = make(base)
        it = m.named_parameters()
        first = next(it)[0]
        rest: list[Any] = []

        def finish(it: Any = it, rest: list[Any] = rest) -> None:
            rest.append(outcome(lambda: [n for n, _ in it]))

        t = threading.Thread(target=finish)
        t.start()
        t.join()
        results.append((first, rest))
    assert results[0] == results[1]


def test_concurrent_forward_matches_single_thread(base: type[nn.Module]) -> None:
    m = make(base)
    x = torch.randn(2, 4)
    with torch.inference_mode():
        expected = m(x)
    outputs: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with torch.inference_mode():
                for _ in range(200):
                    outputs.append(m(x))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(outputs) == 1600
    assert all(torch.equal(o, expected) for o in outputs)


def test_walks_while_another_thread_calls(base: type[nn.Module]) -> None:
    m = make(base)
    x = torch.randn(2, 4)
    stop = threading.Event()

    def call() -> None:
        with torch.inference_mode():
            while not stop.is_set():
                m(x)

    t = threading.Thread(target=call)
    t.start()
    try:
        names = [[n for n, _ in m.named_parameters()] for _ in range(200)]
        sds = [list(m.state_dict()) for _ in range(50)]
    finally:
        stop.set()
        t.join()
    assert all(n == names[0] for n in names)
    assert all(s == sds[0] for s in sds)


def test_recorded_walks_while_another_thread_rebuilds_the_tree() -> None:
    """state_dict (whose replay releases the GIL in each ``detach``), train/eval and
    no-op conversions replayed in one thread while another keeps replacing parameters
    and blocks: no crash, and every state dict is one the tree had at some point
    (its keys are always a whole tree's keys). A live walk may meet a registry the
    other thread changed and raise, as stock's does."""
    import fastmodule

    net = make(fastmodule.Module)
    stop = threading.Event()
    errors: list[BaseException] = []

    def rebuild() -> None:
        try:
            while not stop.is_set():
                i = torch.randint(0, 3, ()).item()
                net.blocks[i] = type(net.blocks[0])()
                net.blocks[(i + 1) % 3].lin.weight = nn.Parameter(torch.randn(4, 4))
                net.extra = nn.Linear(1, 1) if not hasattr(net, "extra") else None
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    t = threading.Thread(target=rebuild)
    t.start()
    try:
        for _ in range(300):
            try:
                sd = net.state_dict()
                net.state_dict(keep_vars=True)
            except RuntimeError as e:
                # A live walk meeting the other thread's change, as stock's does.
                assert "changed size during iteration" in str(e)
                continue
            keys = [k for k in sd if not k.startswith("extra.")]
            assert keys == [f"blocks.{i}.lin.{n}" for i in range(3) for n in ("weight", "bias")]
            try:
                net.eval()
                net.train()
                net.float()
            except RuntimeError as e:
                # The same for train/eval and `_apply`'s live walks (stock's iterate
                # `_modules` while the other thread assigns into it).
                assert "changed size during iteration" in str(e)
    finally:
        stop.set()
        t.join()
    assert not errors
