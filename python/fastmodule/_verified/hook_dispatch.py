"""The native dispatch of forward hooks: what it needs from torch, checked first.

A module call with forward pre-hooks or forward hooks (the module's own or global
ones, ``register_module_forward_hook`` & co.) and no backward hook runs torch's
``_call_impl`` hook logic step by step in the native core, without its frames.
That core reproduces ``_call_impl`` and the two functions it calls on the way
(``torch.compiler.is_compiling`` and ``torch.jit.is_scripting``), so it is
switched on only when all of them are the verified versions
(``fastmodule._verified.verification``); otherwise a hooked call runs torch's code as on
stock, and ``fastmodule.diagnostics()`` says why.
"""

from __future__ import annotations

import dis
import sys
import warnings
from collections import OrderedDict
from typing import Any

import torch
import torch._jit_internal as jit_internal
import torch.compiler
import torch.jit
import torch.nn.modules.module as module_py

from fastmodule import _core
from fastmodule._verified import verification

__all__ = ["HOOKS", "star_call", "unpack_pair"]


def star_call(forward: Any, args: Any, kwargs: Any) -> Any:
    """``forward(*args, **kwargs)`` for arguments a hook replaced with something
    other than an exact tuple and dict (Python's own unpacking and its errors)."""
    return forward(*args, **kwargs)


def unpack_pair(pair: Any) -> tuple[Any, Any]:
    """``first, second = pair`` as the statement does it (errors included)."""
    first, second = pair
    return first, second


def _call_line() -> int | None:
    """The line of ``_wrapped_call_impl`` that calls ``_call_impl``: where
    ``_call_impl``'s ``warnings.warn(..., stacklevel=2)`` points."""
    for ins in dis.get_instructions(torch.nn.Module._wrapped_call_impl):
        if ins.argval == "_call_impl" and ins.positions is not None:
            return ins.positions.lineno
    return None


def _is_compiling_known() -> bool:
    """Is ``torch.compiler.is_compiling`` ``return False if
    torch.jit.is_scripting() else _is_compiling_flag`` with ``is_scripting``
    returning False? (Then the native core reads the flag; else it calls it.)"""
    f = torch.compiler.is_compiling
    s = jit_internal.is_scripting
    return (
        f.__code__.co_names == ("torch", "jit", "is_scripting", "_is_compiling_flag")
        and f.__code__.co_argcount == 0
        and f.__globals__ is torch.compiler.__dict__
        and s.__code__.co_names == ()
        and s.__code__.co_argcount == 0
        and s() is False
        and torch.jit.is_scripting is s
    )


def _hooks_problem() -> str | None:
    """Why hooked module calls run torch's ``_call_impl``, or None."""
    problem = verification.native_problem()
    problem = problem or verification.path_problem(
        verification.CORE_PATHS["call"] + verification.HOOK_FUNCTIONS
    )
    if problem is None and _call_line() is None:
        problem = "nn.Module._wrapped_call_impl does not call _call_impl as expected"
    return problem


#: Why forward hooks are not dispatched natively (None: they are, within the
#: call path; see ``fastmodule.diagnostics()``).
HOOKS = _hooks_problem()


def install() -> None:
    """Switch the native hook dispatch on where it was verified (at start-up)."""
    if HOOKS is None:
        _core.init_hooks(
            {
                "module_globals": module_py.__dict__,
                "torch": torch,
                "torch_dict": torch.__dict__,
                "compiler": torch.compiler,
                "compiler_dict": torch.compiler.__dict__,
                "jit": torch.jit,
                "jit_dict": torch.jit.__dict__,
                "is_compiling": torch.compiler.is_compiling,
                "is_scripting": jit_internal.is_scripting,
                "is_compiling_known": _is_compiling_known(),
                "star_call": star_call,
                "unpack_pair": unpack_pair,
                "warn_filename": torch.nn.Module._wrapped_call_impl.__code__.co_filename,
                "warn_lineno": _call_line(),
                # CPython's own warn: a warnings.warn patched before this import is
                # still called as torch calls it.
                "warnings_warn": getattr(sys.modules.get("_warnings"), "warn", warnings.warn),
                "odict": OrderedDict,
            }
        )
