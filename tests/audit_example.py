"""The model a new user wrote (fastmodule issue 18), and the same model written
correctly: factories for ``python -m fastmodule audit tests.audit_example:buggy``."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Three layers in a plain list and a plain tensor mask: neither is registered."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(16, 16) for _ in range(3)]
        self.mask = torch.ones(16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) * self.mask
        return self.head(x)


class FixedNet(nn.Module):
    """The same model, registered: nn.ModuleList and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.register_buffer("mask", torch.ones(16))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) * self.mask
        return self.head(x)


def buggy() -> tuple[nn.Module, torch.Tensor]:
    """The buggy model and an example input."""
    return Net(), torch.randn(8, 16)


def fixed() -> nn.Module:
    """The correct model."""
    return FixedNet()


def broken() -> nn.Module:
    """A factory that fails."""
    raise RuntimeError("no weights here")


def not_a_model() -> int:
    """A factory that returns something else."""
    return 3


#: A module instance (a spec may name one: it is used, not called).
INSTANCE = FixedNet()
