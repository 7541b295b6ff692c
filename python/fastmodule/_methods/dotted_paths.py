"""Dotted-path access of ``fastmodule.Module``: ``get_submodule``,
``set_submodule``, ``get_parameter``, ``get_buffer``, run natively.

Each native body follows torch's code step by step (the same attribute reads,
``isinstance`` checks and messages), and defers to torch as every other
``fastmodule.Module`` method does (see :mod:`fastmodule._methods.dispatch`).
"""

from __future__ import annotations

import torch

from fastmodule import _core
from fastmodule._methods.dispatch import torch_method

# The name torch's module globals give the walk too: the bodies run with them
# (see fastmodule._methods.dispatch).
_fastmodule_walk = _core.walk

__all__ = ["get_buffer", "get_parameter", "get_submodule", "set_submodule"]


def _get_submodule(self: torch.nn.Module, target: str) -> torch.nn.Module:
    return _fastmodule_walk("get_submodule", self, target)


def _set_submodule(
    self: torch.nn.Module, target: str, module: torch.nn.Module, strict: bool = False
) -> None:
    return _fastmodule_walk("set_submodule", self, target, module, strict)


def _get_parameter(self: torch.nn.Module, target: str) -> torch.nn.Parameter:
    return _fastmodule_walk("get_parameter", self, target)


def _get_buffer(self: torch.nn.Module, target: str) -> torch.Tensor:
    return _fastmodule_walk("get_buffer", self, target)


get_submodule = torch_method("get_submodule", _get_submodule, walked=True)
set_submodule = torch_method("set_submodule", _set_submodule, walked=True)
get_parameter = torch_method("get_parameter", _get_parameter, walked=True)
get_buffer = torch_method("get_buffer", _get_buffer, walked=True)
