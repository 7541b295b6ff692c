"""One scenario that exercises every cache and plan (calls, attribute reads,
walks, ``state_dict``, ``load_state_dict``, ``train``/``eval``, no-op ``_apply``,
``zero_grad``) with changes in between; its observable results, for comparing
stock with fast in a process whose caches may be off."""

from __future__ import annotations

from typing import Any

import torch


def scenario(base: type[torch.nn.Module]) -> list[Any]:
    """Results of the same steps on a tree of ``base`` modules."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    m = Net()
    x = torch.ones(2, 3)
    out: list[Any] = []
    for step in range(3):
        out.append(m(x).tolist())
        out.append([n for n, _ in m.named_parameters()])
        out.append(sorted(m.state_dict()))
        m.train(step % 2 == 0)
        out.append([b.training for b in m.modules()])
        m.float()
        m.zero_grad()
        sd = m.state_dict()
        out.append(str(m.load_state_dict(sd)))
        m.blocks[1].extra = torch.nn.Linear(3, 3)
        m.blocks[0].forward = lambda x: x + 1
        m.blocks[2].register_buffer("count", torch.ones(1) * step)
    out.append(m(x).tolist())
    return out
