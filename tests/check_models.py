"""Models for ``fastmodule.check``'s tests and ``python -m fastmodule check`` factories:
one that agrees with stock, one made to differ when accelerated, one that differs from
itself, one with running statistics, and one whose inputs are keyword arguments."""

from __future__ import annotations

import itertools

import torch
from torch import nn

import fastmodule


class Small(nn.Module):
    """Linear -> ReLU -> Linear with a BatchNorm (running statistics in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Differs(Small):
    """Adds 1 to its output when accelerated: a parity failure made on purpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 1 if fastmodule.is_accelerated(self) else out


_calls = itertools.count()


class Nondeterministic(Small):
    """Each call adds a different number: two stock runs differ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + next(_calls)


class Keywords(Small):
    """Takes its input as a keyword argument and returns a dict."""

    def forward(self, *, x: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"out": super().forward(x) * scale}


def small() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(4, 8),)


def differs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Differs().eval(), (torch.randn(4, 8),)


def nondeterministic() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Nondeterministic().eval(), torch.randn(4, 8)


def keywords() -> tuple[nn.Module, dict[str, object]]:
    torch.manual_seed(0)
    return Keywords().eval(), {"x": torch.randn(4, 8), "scale": 2.0}


def without_inputs() -> nn.Module:
    return Small().eval()
