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
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.compiler import is_compiling

from fastmodule import _core

__all__ = [
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

_Torch = torch.nn.Module
#: torch's functions as imported; a different entry on ``nn.Module`` is a patch.
_ORIGINAL = {name: _Torch.__dict__[name] for name in __all__}


def _torch_runs(name: str) -> bool:
    return is_compiling() or _Torch.__dict__.get(name) is not _ORIGINAL[name]


# Native bodies, with torch's parameters (renamed to torch's qualified names below).


def _named_modules(
    self: torch.nn.Module,
    memo: set[torch.nn.Module] | None = None,
    prefix: str = "",
    remove_duplicate: bool = True,
) -> Iterator[tuple[str, torch.nn.Module]]:
    return (yield from _core.walk("named_modules", self, memo, prefix, remove_duplicate))


def _modules(self: torch.nn.Module, remove_duplicate: bool = True) -> Iterator[torch.nn.Module]:
    return (yield from _core.walk("modules", self, remove_duplicate))


def _named_children(self: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    return (yield from _core.walk("named_children", self))


def _children(self: torch.nn.Module) -> Iterator[torch.nn.Module]:
    return (yield from _core.walk("children", self))


def _named_parameters(
    self: torch.nn.Module, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
) -> Iterator[tuple[str, torch.nn.Parameter]]:
    return (yield from _core.walk("named_parameters", self, prefix, recurse, remove_duplicate))


def _parameters(self: torch.nn.Module, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
    return (yield from _core.walk("parameters", self, recurse))


def _named_buffers(
    self: torch.nn.Module, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    return (yield from _core.walk("named_buffers", self, prefix, recurse, remove_duplicate))


def _buffers(self: torch.nn.Module, recurse: bool = True) -> Iterator[torch.Tensor]:
    return (yield from _core.walk("buffers", self, recurse))


def _train(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
    return _core.walk("train", self, mode)


def _eval(self: torch.nn.Module) -> torch.nn.Module:
    return _core.walk("eval", self)


def _requires_grad_(self: torch.nn.Module, requires_grad: bool = True) -> torch.nn.Module:
    return _core.walk("requires_grad_", self, requires_grad)


def _replica_warning() -> str | None:
    """torch's own text of the DataParallel-replica warning (read, not copied)."""
    for const in _ORIGINAL["zero_grad"].__code__.co_consts:
        if isinstance(const, str) and const.startswith("Calling .zero_grad()"):
            return const
    return None


_REPLICA_WARNING = _replica_warning()


def _zero_grad(self: torch.nn.Module, set_to_none: bool = True) -> None:
    _core.walk("zero_grad", self, set_to_none)


def _apply(self: torch.nn.Module, fn: Callable[[torch.nn.Module], Any]) -> torch.nn.Module:
    return _core.walk("apply", self, fn)


_BODIES: dict[str, Callable[..., Any]] = {
    "named_modules": _named_modules,
    "modules": _modules,
    "named_children": _named_children,
    "children": _children,
    "named_parameters": _named_parameters,
    "parameters": _parameters,
    "named_buffers": _named_buffers,
    "buffers": _buffers,
    "train": _train,
    "eval": _eval,
    "requires_grad_": _requires_grad_,
    "zero_grad": _zero_grad,
    "apply": _apply,
}


def _as_torch_named(body: Callable[..., Any], name: str) -> None:
    """Give a body torch's name and qualified name (used in TypeError texts)."""
    body.__code__ = body.__code__.replace(co_name=name, co_qualname=f"Module.{name}")
    body.__name__ = name
    body.__qualname__ = f"Module.{name}"


for _name, _body in _BODIES.items():
    _as_torch_named(_body, _name)


def _dispatcher(name: str) -> Callable[..., Any]:
    body = _BODIES[name]

    def method(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _torch_runs(name):
            return getattr(_Torch, name)(self, *args, **kwargs)
        if name == "zero_grad" and _REPLICA_WARNING is not None:
            if getattr(self, "_is_replica", False):
                # Issued here so stacklevel=2 names the caller, as torch's does.
                warnings.warn(_REPLICA_WARNING, stacklevel=2)
        return body(self, *args, **kwargs)

    original = _ORIGINAL[name]
    method.__name__ = name
    method.__qualname__ = f"Module.{name}"
    method.__doc__ = original.__doc__
    method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    method.__module__ = __name__
    return method


named_modules = _dispatcher("named_modules")
modules = _dispatcher("modules")
named_children = _dispatcher("named_children")
children = _dispatcher("children")
named_parameters = _dispatcher("named_parameters")
parameters = _dispatcher("parameters")
named_buffers = _dispatcher("named_buffers")
buffers = _dispatcher("buffers")
train = _dispatcher("train")
eval = _dispatcher("eval")  # noqa: A001 - torch's method name
requires_grad_ = _dispatcher("requires_grad_")
zero_grad = _dispatcher("zero_grad")
apply = _dispatcher("apply")
