"""The one mechanism by which ``fastmodule.Module``'s own methods defer to torch.

Every method that ``fastmodule.Module`` defines in place of a
``torch.nn.Module`` method is built by :func:`torch_method`: it runs the native
body, except under ``torch.compile`` tracing (Dynamo must inline torch's
Python) or when ``torch.nn.Module.<name>`` has been replaced (the patch must
run), where it calls what is installed on ``torch.nn.Module`` with the caller's
exact arguments. The body carries torch's name and qualified name, so argument
errors read exactly as torch's.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.compiler import is_compiling

from fastmodule.inline_routes import original_code

__all__ = ["BODIES", "caller_stacklevel", "torch_code", "torch_constant", "torch_method"]

#: name -> native body of every usable method built by :func:`torch_method`;
#: torch's own ``nn.Module.<name>`` is routed to it for fast instances.
BODIES: dict[str, Callable[..., Any]] = {}


def torch_code(name: str) -> Callable[..., Any]:
    """A private copy of torch's ``nn.Module.<name>`` function: the same code,
    globals, defaults and closure, but not routed to fastmodule's bodies (see
    ``_core.route_torch_methods``), for fastmodule's own calls of torch's code."""
    f = torch.nn.Module.__dict__[name]
    copy = types.FunctionType(
        original_code(name), f.__globals__, f.__name__, f.__defaults__, f.__closure__
    )
    copy.__kwdefaults__ = f.__kwdefaults__
    copy.__qualname__ = f.__qualname__
    copy.__doc__ = f.__doc__
    copy.__module__ = f.__module__
    copy.__dict__.update(f.__dict__)
    return copy


def torch_constant(name: str, start: str) -> str | None:
    """A string constant of torch's ``nn.Module.<name>`` (or of a function nested
    in it) that begins with ``start``: torch's own message texts, read at import
    so they always match the installed torch. None if torch has no such text."""
    codes = [original_code(name)]
    while codes:
        code = codes.pop()
        for const in code.co_consts:
            if isinstance(const, str) and const.startswith(start):
                return const
            if hasattr(const, "co_consts"):
                codes.append(const)
    return None


def caller_stacklevel(name: str) -> int:
    """The ``stacklevel`` at which the body of ``nn.Module.<name>``, calling this,
    warns where torch's ``stacklevel=2`` warning points: at whoever called the
    method. The body is called by ``fastmodule.Module``'s method or (CPython 3.11)
    by torch's prefixed function, each one frame in between, or straight from the
    caller through torch's routed vectorcall entry point."""
    try:
        caller = sys._getframe(2).f_code
    except ValueError:  # called with no Python frame above the body
        return 2
    torch_file = original_code(name).co_filename
    between = caller is _METHOD_CODE or (
        caller.co_filename == torch_file and caller.co_name == name
    )
    return 3 if between else 2


def torch_method(name: str, body: Callable[..., Any], *, usable: bool = True) -> Callable[..., Any]:
    """``torch.nn.Module.<name>`` served by ``body`` while torch's is unpatched.

    ``usable=False`` (the installed torch is not the one ``body`` reproduces)
    always runs torch's code.
    """
    original = torch.nn.Module.__dict__[name]
    body.__code__ = body.__code__.replace(co_name=name, co_qualname=f"Module.{name}")
    body.__name__ = name
    body.__qualname__ = f"Module.{name}"
    if usable:
        BODIES[name] = body

    def method(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not usable or is_compiling() or torch.nn.Module.__dict__.get(name) is not original:
            return getattr(torch.nn.Module, name)(self, *args, **kwargs)
        return body(self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"Module.{name}"
    method.__doc__ = original.__doc__
    method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    method.__module__ = body.__module__
    return method


# The code of every method torch_method builds (one nested code object).
_METHOD_CODE = next(
    c
    for c in torch_method.__code__.co_consts
    if isinstance(c, types.CodeType) and c.co_name == "method"
)
