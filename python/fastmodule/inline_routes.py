"""torch's whole-tree methods routed to the native bodies on CPython 3.11.

From 3.12 on, a call of ``torch.nn.Module.state_dict`` (and the other methods
in ``_dispatch.BODIES``) goes through the function's vectorcall entry point,
which ``_core.route_torch_methods`` points at fastmodule's router. CPython 3.11
runs a Python function called from Python code without its vectorcall, so
there the router only sees calls made from C. This module closes that gap on
3.11: each routed function of torch gets torch's own code with one statement
put in front of its body,

    if _fastmodule_accelerated and _fastmodule_route(self):
        return <fastmodule's body>(self, <its arguments>)

(``return (yield from _fastmodule_walk(<name>, self, ...))`` for the iterators,
which stay generators). ``_fastmodule_accelerated`` is a global of torch's
module that fastmodule keeps equal to "some class is accelerated in place", so
while none is, torch's modules pay one global read per call; while one is,
about 70 ns (``fastmodule.Module`` subclasses define these methods themselves
and do not need the prefix). The function object, its signature, defaults,
docstring, file and line numbers stay torch's; ``inspect.getsource`` still
shows torch's source.

``_fastmodule_route`` answers the router's own question (a fast instance, no
PEP 523 frame evaluator installed) when called eagerly. What a tracer that
reads bytecode (Dynamo) sees instead is the body of :func:`_route`, which
returns ``False``: the call goes through ``functools.partial``, which CPython
calls through the function's vectorcall, and that entry point is fastmodule's
check. So ``torch.compile`` inlines torch's own code exactly as before; it
guards the flag, so a compiled function that inlines one of these methods is
compiled once more the first time the flag changes after compiling.

The new code comes from compiling torch's source file with those statements
added, and only for functions whose code compiling the file unchanged
reproduces; any other function keeps torch's code (and on 3.11 torch's
Python for it, as before).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fastmodule import _core

__all__ = ["NEEDED", "install", "original_code", "prefixed"]

#: Whether this interpreter needs the prefixed code (3.11 inlines Python calls).
NEEDED = sys.version_info[:2] == (3, 11)

# Names the prefixed code reads from torch's module globals.
_FLAG = "_fastmodule_accelerated"
_ROUTE = "_fastmodule_route"
_WALK = "_fastmodule_walk"
_BODIES = "_fastmodule_bodies"

# name -> torch's code object as it was before install() replaced it.
_ORIGINAL: dict[str, types.CodeType] = {}


def original_code(name: str) -> types.CodeType:
    """torch's own code for ``torch.nn.Module.<name>``, never the prefixed one."""
    return _ORIGINAL.get(name) or torch.nn.Module.__dict__[name].__code__


def prefixed() -> list[str]:
    """The names of torch's functions whose code :func:`install` prefixed."""
    return sorted(_ORIGINAL)


def _route(self: Any) -> bool:
    """What tracers see of the route check: torch's code runs."""
    return False


def _code_of(module_code: types.CodeType, qualname: str, line: int) -> types.CodeType | None:
    """The code object for ``qualname`` defined at ``line``, nested anywhere in ``module_code``."""
    stack = [module_code]
    while stack:
        for const in stack.pop().co_consts:
            if isinstance(const, types.CodeType):
                if const.co_qualname == qualname and const.co_firstlineno == line:
                    return const
                stack.append(const)
    return None


def _def_line(fn: ast.FunctionDef) -> int:
    """The line a function's code starts at (its first decorator's, if any)."""
    return min([fn.lineno, *(d.lineno for d in fn.decorator_list)])


def _forwarded(args: ast.arguments) -> tuple[list[ast.expr], list[ast.keyword]]:
    """The call arguments that pass a function's own parameters (after ``self``) on."""
    positional = [*args.posonlyargs, *args.args][1:]
    call_args: list[ast.expr] = [ast.Name(a.arg, ast.Load()) for a in positional]
    if args.vararg is not None:
        call_args.append(ast.Starred(ast.Name(args.vararg.arg, ast.Load()), ast.Load()))
    keywords = [ast.keyword(a.arg, ast.Name(a.arg, ast.Load())) for a in args.kwonlyargs]
    if args.kwarg is not None:
        keywords.append(ast.keyword(None, ast.Name(args.kwarg.arg, ast.Load())))
    return call_args, keywords


def _prefix(fn: ast.FunctionDef, name: str, walked: bool) -> ast.stmt:
    """``if _fastmodule_accelerated and _fastmodule_route(self): return ...`` for
    method ``name``."""
    self_name = [*fn.args.posonlyargs, *fn.args.args][0].arg
    call_args, keywords = _forwarded(fn.args)
    target: ast.expr
    if walked:
        call: ast.expr = ast.Call(
            ast.Name(_WALK, ast.Load()),
            [ast.Constant(name), ast.Name(self_name, ast.Load()), *call_args],
            keywords,
        )
        target = ast.YieldFrom(call)
    else:
        body = ast.Subscript(ast.Name(_BODIES, ast.Load()), ast.Constant(name), ast.Load())
        target = ast.Call(body, [ast.Name(self_name, ast.Load()), *call_args], keywords)
    check = ast.BoolOp(
        ast.And(),
        [
            ast.Name(_FLAG, ast.Load()),
            ast.Call(ast.Name(_ROUTE, ast.Load()), [ast.Name(self_name, ast.Load())], []),
        ],
    )
    stmt = ast.If(check, [ast.Return(target)], [])
    # The statement reads as the def line (where a call event points anyway).
    for node in ast.walk(stmt):
        node.lineno = node.end_lineno = fn.lineno  # type: ignore[attr-defined]
        node.col_offset = node.end_col_offset = 0  # type: ignore[attr-defined]
    return stmt


def _prefixed(funcs: dict[str, types.FunctionType], walked: set[str]) -> dict[str, types.CodeType]:
    """torch's code for each of ``funcs`` with the route statement in front.

    What is compiled is torch's source file with its top-level functions and
    classes left out except class ``Module`` holding just these methods: 3.11's
    code generation for a method depends on module-level names (whether one
    was bound by an import), which the rest keeps. A function whose source
    does not compile back to exactly its running code is left out."""
    module = sys.modules[torch.nn.Module.__module__]
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Module"]
    if len(classes) != 1:
        return {}
    defs: dict[str, ast.FunctionDef] = {}
    for fn in classes[0].body:
        if isinstance(fn, ast.FunctionDef) and fn.name in funcs:
            if _def_line(fn) == funcs[fn.name].__code__.co_firstlineno:
                defs[fn.name] = fn
    if not defs:
        return {}
    classes[0].body = list(defs.values())
    tree.body = [
        n
        for n in tree.body
        if not isinstance(n, (ast.FunctionDef, ast.ClassDef)) or n is classes[0]
    ]
    filename = next(iter(funcs.values())).__code__.co_filename
    original = compile(tree, filename, "exec", dont_inherit=True)
    found: dict[str, ast.FunctionDef] = {}
    for name, fn in defs.items():
        code = funcs[name].__code__
        same = _code_of(original, code.co_qualname, code.co_firstlineno)
        if same is not None and same.co_code == code.co_code:
            found[name] = fn
    for name, fn in found.items():
        has_doc = ast.get_docstring(fn, clean=False) is not None
        fn.body.insert(1 if has_doc else 0, _prefix(fn, name, name in walked))
    prefixed = compile(tree, filename, "exec", dont_inherit=True)
    out: dict[str, types.CodeType] = {}
    for name in found:
        code = funcs[name].__code__
        new = _code_of(prefixed, code.co_qualname, code.co_firstlineno)
        is_gen = new is not None and bool(new.co_flags & inspect.CO_GENERATOR)
        if new is not None and is_gen == (name in walked):
            out[name] = new
    return out


def install(bodies: dict[str, Callable[..., Any]], walked: Iterable[str]) -> None:
    """Prefix torch's ``nn.Module.<name>`` for each name in ``bodies`` (once, on
    3.11 only; :func:`prefixed` says which were). ``walked``: the generator
    methods whose body is exactly ``yield from _core.walk(name, self, <torch's
    parameters>)``."""
    if not NEEDED or _ORIGINAL:
        return
    walked = set(walked)
    namespace = sys.modules[torch.nn.Module.__module__].__dict__
    funcs: dict[str, types.FunctionType] = {}
    for name in bodies:
        func = torch.nn.Module.__dict__.get(name)
        if not isinstance(func, types.FunctionType) or func.__globals__ is not namespace:
            continue
        if bool(func.__code__.co_flags & inspect.CO_GENERATOR) and name not in walked:
            continue
        funcs[name] = func
    new_codes = _prefixed(funcs, walked) if funcs else {}
    if not new_codes:
        return
    check = types.FunctionType(_route.__code__, _route.__globals__, _ROUTE)
    _core.install_route_check(check, namespace, _FLAG)
    namespace[_ROUTE] = functools.partial(check)
    namespace[_WALK] = _core.walk
    namespace[_BODIES] = dict(bodies)
    for name, new in new_codes.items():
        _ORIGINAL[name] = funcs[name].__code__
        funcs[name].__code__ = new
