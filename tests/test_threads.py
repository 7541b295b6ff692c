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
