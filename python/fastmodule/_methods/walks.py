"""Whole-tree methods of ``fastmodule.Module``, run natively by ``fastmodule._core``.

Each public function here replaces the ``torch.nn.Module`` method of the same
name on ``fastmodule.Module``. The tree walk runs in Rust and follows torch's
dynamic dispatch at every module: a submodule whose class overrides
``named_modules``, ``train``, ... has its override called where torch would
call it. torch's own code runs instead, called with the caller's exact
arguments at the moment torch would call it:

- under ``torch.compile`` tracing, so Dynamo inlines torch's Python as it does
  for stock modules;
- when ``torch.nn.Module.<method>`` was replaced (patched) — the patch runs.

Each native body is a function with torch's signature and qualified name, so
argument errors read exactly as torch's, and iterators stay lazy generators.
The bodies read only ``_fastmodule_walk`` (``_core.walk``, also a global of
torch's module), builtins and closure variables, so they run with torch's
module globals (see :mod:`fastmodule._methods.dispatch`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastmodule import _core
from fastmodule._methods.dispatch import caller_stacklevel, torch_constant, torch_method

# The name torch's module globals give the walk too (see the module documentation).
_fastmodule_walk = _core.walk

__all__ = [
    "WALKED",
    "apply",
    "buffers",
    "children",
    "eval",
    "modules",
    "named_buffers",
    "named_children",
    "named_modules",
    "named_parameters",
    "parameters",
    "requires_grad_",
    "train",
    "zero_grad",
]

# Native bodies, with torch's parameters (torch_method gives them torch's names).


def _named_modules(
    self: torch.nn.Module,
    memo: set[torch.nn.Module] | None = None,
    prefix: str = "",
    remove_duplicate: bool = True,
) -> Iterator[tuple[str, torch.nn.Module]]:
    return (yield from _fastmodule_walk("named_modules", self, memo, prefix, remove_duplicate))


def _modules(self: torch.nn.Module, remove_duplicate: bool = True) -> Iterator[torch.nn.Module]:
    return (yield from _fastmodule_walk("modules", self, remove_duplicate))


def _named_children(self: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    return (yield from _fastmodule_walk("named_children", self))


def _children(self: torch.nn.Module) -> Iterator[torch.nn.Module]:
    return (yield from _fastmodule_walk("children", self))


def _named_parameters(
    self: torch.nn.Module, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
) -> Iterator[tuple[str, torch.nn.Parameter]]:
    walk = _fastmodule_walk("named_parameters", self, prefix, recurse, remove_duplicate)
    return (yield from walk)


def _parameters(self: torch.nn.Module, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
    return (yield from _fastmodule_walk("parameters", self, recurse))


def _named_buffers(
    self: torch.nn.Module, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    return (yield from _fastmodule_walk("named_buffers", self, prefix, recurse, remove_duplicate))


def _buffers(self: torch.nn.Module, recurse: bool = True) -> Iterator[torch.Tensor]:
    return (yield from _fastmodule_walk("buffers", self, recurse))


def _train(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
    return _fastmodule_walk("train", self, mode)


def _eval(self: torch.nn.Module) -> torch.nn.Module:
    return _fastmodule_walk("eval", self)


def _requires_grad_(self: torch.nn.Module, requires_grad: bool = True) -> torch.nn.Module:
    return _fastmodule_walk("requires_grad_", self, requires_grad)


_REPLICA_WARNING = torch_constant("zero_grad", "Calling .zero_grad()")


def _zero_grad_body(
    replica_warning: str, stacklevel: Callable[[str], int]
) -> Callable[[torch.nn.Module, bool], None]:
    def _zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
        if getattr(self, "_is_replica", False):
            warnings.warn(replica_warning, stacklevel=stacklevel("zero_grad"))
        _fastmodule_walk("zero_grad", self, set_to_none)

    return _zero_grad


def _apply(self: torch.nn.Module, fn: Callable[[torch.nn.Module], Any]) -> torch.nn.Module:
    return _fastmodule_walk("apply", self, fn)


#: The methods whose body is exactly ``return _fastmodule_walk(name, self, <torch's
#: parameters>)`` (``yield from`` for the iterators): torch's prefixed code calls
#: the walk directly for them.
WALKED = frozenset(
    {
        "named_modules",
        "modules",
        "named_children",
        "children",
        "named_parameters",
        "parameters",
        "named_buffers",
        "buffers",
        "train",
        "eval",
        "requires_grad_",
        "apply",
    }
)

named_modules = torch_method("named_modules", _named_modules, walked=True)
modules = torch_method("modules", _modules, walked=True)
named_children = torch_method("named_children", _named_children, walked=True)
children = torch_method("children", _children, walked=True)
named_parameters = torch_method("named_parameters", _named_parameters, walked=True)
parameters = torch_method("parameters", _parameters, walked=True)
named_buffers = torch_method("named_buffers", _named_buffers, walked=True)
buffers = torch_method("buffers", _buffers, walked=True)
train = torch_method("train", _train, walked=True)
eval = torch_method("eval", _eval, walked=True)  # noqa: A001 - torch's method name
requires_grad_ = torch_method("requires_grad_", _requires_grad_, walked=True)
zero_grad = torch_method(
    "zero_grad",
    _zero_grad_body(_REPLICA_WARNING or "", caller_stacklevel),
    usable=_REPLICA_WARNING is not None,
)
apply = torch_method("apply", _apply, walked=True)
