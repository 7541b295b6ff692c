"""The one mechanism by which ``fastmodule.Module``'s own methods defer to torch.

Every method that ``fastmodule.Module`` defines in place of a
``torch.nn.Module`` method is built by :func:`torch_method`: it runs the native
body, except under ``torch.compile`` tracing (Dynamo must inline torch's
Python) or while ``torch.compiler.is_compiling()`` (non-strict export), while
a PEP 523 frame evaluator (Dynamo running compiled code) is installed, for an
instance that is not fast, or when ``torch.nn.Module.<name>`` has been replaced
(the patch must run); then it calls what is installed on ``torch.nn.Module``
with the caller's exact arguments. The first three are the question torch's
prefixed code asks too (``inline_routes.ROUTE``). The body carries torch's
name and qualified name, so argument errors read exactly as torch's.

Both functions stand in for torch's method, and their frames say so: their
code carries torch's file, the line of torch's ``def``, its name and qualified
name (every instruction at that line), and they run with torch's module
globals wherever every global they read is the same object there (else with a
copy of their own module's globals under torch's module identity). So a
traceback or a ``stacklevel`` warning through them reads torch's
``module.py`` (and a warning filter keyed on torch's module name matches), and
Dynamo treats them as torch's own methods: inlined when called from traced
code, skipped (run eagerly, no frame of their own) at the top level.
"""

from __future__ import annotations

import builtins
import dis
import inspect
import sys
import types
import warnings
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import torch

from fastmodule import _core
from fastmodule._verified import verification
from fastmodule._verified.inline_routes import ROUTE, original_code

__all__ = [
    "BODIES",
    "REPRODUCED",
    "STOCK",
    "WALKED",
    "caller_stacklevel",
    "torch_code",
    "torch_constant",
    "torch_method",
]

#: name -> native body of every usable method built by :func:`torch_method`;
#: torch's own ``nn.Module.<name>`` is routed to it for fast instances.
BODIES: dict[str, Callable[..., Any]] = {}

#: name -> why torch's own ``nn.Module.<name>`` serves ``fastmodule.Module`` too
#: (its native body is off: see :func:`torch_method`).
STOCK: dict[str, str] = {}

#: torch's ``nn.Module`` functions the native whole-tree bodies reproduce at each
#: module beside those in :data:`BODIES` (each module's own step of a walk).
REPRODUCED: tuple[str, ...] = (
    "_named_members",
    "named_modules",
    "named_children",
    "children",
    "_save_to_state_dict",
    "get_extra_state",
    "_load_from_state_dict",
    "set_extra_state",
    "load_state_dict",
)

#: The methods whose body is exactly ``return _fastmodule_walk(name, self,
#: <torch's parameters>)`` (``yield from`` for iterators): torch's prefixed code
#: calls the walk itself for them.
WALKED: set[str] = set()

# torch's module namespace. ``_fastmodule_walk`` is there for the bodies (and
# torch's prefixed code) to call, given at start-up (:func:`install`).
_TORCH_GLOBALS = sys.modules[torch.nn.Module.__module__].__dict__
_GIVEN: dict[str, Any] = (
    {"_fastmodule_walk": _core.walk}
    if verification.native_problem() is None
    else {}  # torch's module stays untouched
)


def install() -> None:
    """Give torch's module namespace ``_fastmodule_walk`` (at start-up)."""
    _TORCH_GLOBALS.update(_GIVEN)


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
    method. The body is called by ``fastmodule.Module``'s method or by torch's
    prefixed function (both frames of torch's file named ``name``), or straight
    from the caller through torch's routed vectorcall entry point (3.11, calls
    made from C)."""
    try:
        caller = sys._getframe(2).f_code
    except ValueError:  # called with no Python frame above the body
        return 2
    torch_file = original_code(name).co_filename
    between = caller.co_filename == torch_file and caller.co_name == name
    return 3 if between else 2


def _one_line_table(units: int) -> bytes:
    """A location table putting ``units`` code units at the code's first line,
    without columns (entries of up to 8 units, "no column" form, line delta 0:
    CPython's Objects/locations.md)."""
    table = bytearray()
    for start in range(0, units, 8):
        table += bytes((0x80 | (13 << 3) | (min(8, units - start) - 1), 0))
    return bytes(table)


def _as_torch_frame(code: types.CodeType, name: str) -> types.CodeType:
    """``code`` as a frame of torch's ``nn.Module.<name>``: torch's file, the line
    of its ``def`` for every instruction, its name and qualified name."""
    torch_code_ = original_code(name)
    consts = tuple(
        _as_torch_frame(c, name).replace(co_name=c.co_name, co_qualname=c.co_qualname)
        if isinstance(c, types.CodeType)
        else c
        for c in code.co_consts
    )
    new = code.replace(
        co_filename=torch_code_.co_filename,
        co_name=name,
        co_qualname=torch_code_.co_qualname,
        co_firstlineno=torch_code_.co_firstlineno,
        co_linetable=_one_line_table(len(code.co_code) // 2),
        co_consts=consts,
    )
    line = torch_code_.co_firstlineno
    if any(p[0] != line for p in new.co_positions()):  # pragma: no cover - format changed
        return code.replace(co_name=name, co_qualname=torch_code_.co_qualname)
    return new


# What makes a globals dict a module's as warnings and tracebacks read it.
_IDENTITY = ("__name__", "__spec__", "__loader__", "__file__", "__package__", "__cached__")

# id(a module's globals) -> its copy under torch's module identity.
_COPIES: dict[int, dict[str, Any]] = {}


def _same_in_torch(func: types.FunctionType) -> bool:
    """Is every global ``func`` (or a function nested in it) reads the same object
    in torch's module globals (as start-up leaves them: the bodies run after it)?"""
    mine, torch_ns = func.__globals__, ChainMap(_GIVEN, _TORCH_GLOBALS)
    missing = object()
    codes = [func.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        for name in _global_names(code):
            builtin = getattr(builtins, name, missing)
            if mine.get(name, builtin) is not torch_ns.get(name, builtin):
                return False
    return True


_LOAD_GLOBAL = dis.opmap["LOAD_GLOBAL"]
#: The versions whose bytecode :func:`_global_names` reads itself (checked against
#: ``dis`` for every code object of torch on each).
_BYTECODE_KNOWN = (3, 11) <= sys.version_info[:2] <= (3, 14)


def _global_names(code: types.CodeType) -> list[str]:
    """The names ``code``'s ``LOAD_GLOBAL`` instructions read, in order: what
    ``dis.get_instructions`` reports as their ``argval`` (on CPython 3.11-3.14 the
    argument's upper bits index ``co_names``), read from the bytecode without
    building ``dis``'s instruction objects, which took half of ``import fastmodule``.
    Another CPython may lay its bytecode out otherwise: there ``dis`` answers."""
    if not _BYTECODE_KNOWN:
        return [ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"]
    raw, names, out = code.co_code, code.co_names, []
    arg = 0
    for i in range(0, len(raw), 2):
        op = raw[i]
        if op == dis.EXTENDED_ARG:
            arg = (arg | raw[i + 1]) << 8
            continue
        if op == _LOAD_GLOBAL:
            out.append(names[(arg | raw[i + 1]) >> 1])
        arg = 0
    return out


def _globals_for(func: types.FunctionType) -> dict[str, Any]:
    """Globals for ``func`` that are torch's module's as warnings and tracebacks read
    them (its name, spec, loader, file): torch's module globals themselves if every
    global ``func`` reads is the same object there, else a copy of ``func``'s own
    under torch's module identity, taken when its module has bound everything
    (``torch_method`` runs last in it; nothing rebinds those names later)."""
    mine, torch_ns = func.__globals__, _TORCH_GLOBALS
    if _same_in_torch(func):
        return torch_ns
    copy = _COPIES.get(id(mine))
    if copy is None:
        copy = _COPIES[id(mine)] = {}
    copy.update({k: v for k, v in mine.items() if k not in _IDENTITY})
    copy.update({k: torch_ns[k] for k in _IDENTITY if k in torch_ns})
    return copy


def _as_torch_function(func: types.FunctionType, name: str) -> types.FunctionType:
    """A copy of ``func`` whose frames are attributed to torch's ``nn.Module.<name>``
    (see the module documentation); its attributes are ``func``'s."""
    out = types.FunctionType(
        _as_torch_frame(func.__code__, name),
        _globals_for(func),
        name,
        func.__defaults__,
        func.__closure__,
    )
    out.__kwdefaults__ = func.__kwdefaults__
    out.__annotations__ = func.__annotations__
    out.__module__ = func.__module__
    out.__qualname__ = f"Module.{name}"
    out.__doc__ = func.__doc__
    return out


def _method(
    name: str,
    body: Callable[..., Any],
    usable: bool,
    original: Any,
    route: Callable[[Any], bool],
    positional: str | None,
) -> Callable[..., Any]:
    """``fastmodule.Module.<name>`` (every name it reads is a closure variable or a
    builtin, so it runs with torch's module globals). ``route(self)``: eagerly, is
    ``self`` fast, no PEP 523 frame evaluator installed and
    ``torch.compiler.is_compiling()`` false; traced by Dynamo, ``False``."""
    nn_module = torch.nn.Module
    nn_dict = torch.nn.Module.__dict__

    intact = _core.torch_method_intact
    warnings_ = warnings
    keys = ("destination", "prefix", "keep_vars")

    def method(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        torchs = nn_dict.get(name) is original
        native = usable and route(self) and torchs
        if positional is not None and args and (native or (torchs and intact(name))):
            if len(args) <= 3 and kwargs.keys() <= set(keys):
                # state_dict's deprecated positional arguments: torch warns first
                # thing, from the method's frame, which this frame stands for;
                # then its code goes on as if they had come as keywords.
                warnings_.warn(positional, FutureWarning, stacklevel=2)
                bound = dict(zip(keys, (None, "", False), strict=True))
                bound.update(kwargs)
                if bound["destination"] is None:
                    bound["destination"] = args[0]
                if len(args) > 1 and bound["prefix"] == "":
                    bound["prefix"] = args[1]
                if len(args) > 2 and bound["keep_vars"] is False:
                    bound["keep_vars"] = args[2]
                args, kwargs = (), bound
        if not native:
            return getattr(nn_module, name)(self, *args, **kwargs)
        return body(self, *args, **kwargs)

    return method


def torch_method(
    name: str,
    body: Callable[..., Any],
    *,
    usable: bool = True,
    walked: bool = False,
    positional: str | None = None,
) -> Callable[..., Any]:
    """``torch.nn.Module.<name>`` served by ``body`` while torch's is unpatched.

    ``usable=False`` (the installed torch lacks a text ``body`` needs), an
    interpreter or a torch function that ``fastmodule._verified.verification`` could not
    verify put ``name`` in :data:`STOCK`: ``fastmodule.Module`` then inherits
    torch's own method, and torch's is not routed. ``walked``: ``body`` is
    exactly ``return _fastmodule_walk(name, self, <its parameters>)`` (see
    :data:`WALKED`). ``positional``: torch's warning text for deprecated
    positional arguments (``state_dict``), given from this method's frame, which
    stands where torch's is, whichever code then runs the call.
    """
    off = verification.native_problem() or verification.method_problem(name)
    if off is None and not usable:
        off = "a message text it needs is not in torch's code"
    if off is not None:
        STOCK[name] = off
        usable = False
    original = torch.nn.Module.__dict__[name]
    body = _as_torch_function(body, name)  # type: ignore[arg-type]
    if usable:
        BODIES[name] = body
        if walked:
            WALKED.add(name)
    method = _as_torch_function(
        _method(name, body, usable, original, ROUTE, positional),  # type: ignore[arg-type]
        name,
    )
    method.__doc__ = original.__doc__
    method.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    method.__module__ = body.__module__
    return method
