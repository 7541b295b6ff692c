"""torch's whole-tree methods routed to the native bodies by a statement in front of their code.

CPython 3.11 runs a Python function called from Python code without its
vectorcall entry point, and from 3.12 on a function whose vectorcall is not
CPython's own is called as a C function (no inlined frame: C recursion,
``sys.monitoring`` C_RETURN/C_RAISE events), so a vectorcall route would
either miss those calls or change how stock modules run. Instead each routed
function of torch (``_dispatch.BODIES``) gets torch's own code with one
statement put in front of its body,

    if _fastmodule_accelerated and _fastmodule_route(self):
        return _fastmodule_walk(<name>, self, <its arguments>)

(``return (yield from ...)`` for the iterators, which stay generators;
``_fastmodule_bodies[<name>](self, ...)`` for the methods whose body does more
than the walk). ``_fastmodule_accelerated`` is a global of torch's module that
fastmodule keeps equal to "some class is accelerated in place", so while none
is, torch's modules pay one global read per call; while one is, about 70 ns
(``fastmodule.Module`` subclasses define these methods themselves and do not
need the prefix). The function object, its signature, defaults, docstring,
file and line numbers stay torch's; ``inspect.getsource`` still shows torch's
source. The statement's check has no line number (its instructions carry no
location), so a tracer (``sys.settrace``, pdb, ``sys.monitoring``'s LINE
events) sees exactly torch's line events; the route itself, taken only for a
fast instance, is located at the ``def`` line, which is what a traceback
through the native walk shows for torch's frame.

``_fastmodule_route`` answers the router's own question (a fast instance, no
PEP 523 frame evaluator installed, ``torch.compiler.is_compiling()`` false)
when called eagerly. What a tracer that
reads bytecode (Dynamo) sees instead is the body of :func:`_route`, which
returns ``False``: the call goes through ``functools.partial``, which CPython
calls through the function's vectorcall, and that entry point is fastmodule's
check. So ``torch.compile`` inlines torch's own code exactly as before; it
guards the flag, so a compiled function that inlines one of these methods is
compiled once more the first time the flag changes after compiling.

The new code comes from compiling torch's source file with those statements
added, and only for functions whose code compiling the file unchanged
reproduces, and whose new code keeps every location of torch's; any other
function keeps torch's code (accelerated instances then run torch's Python
for it, as stock).

Compiling and checking takes most of ``import fastmodule``'s time, so its result
is kept on disk (:func:`_cache_dir`; ``FASTMODULE_CACHE_DIR`` names another
folder, an empty value turns the cache off) under a key of everything it
depends on: the interpreter's version and bytecode tag, the SHA-256 of torch's
source file and of this file, and which functions are prefixed how. A later
import reuses it only when, in addition, each function's running bytecode is
the one it was made from; anything else compiles and checks again.
"""

from __future__ import annotations

import ast
import dis
import functools
import hashlib
import inspect
import marshal
import os
import sys
import tempfile
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fastmodule import _core
from fastmodule._verified import verification

__all__ = ["NEEDED", "ROUTE", "install", "original_code", "prefixed"]

#: Whether this interpreter needs the prefixed code: every supported one (3.11
#: inlines Python calls past the vectorcall; 3.12+ must keep CPython's own
#: vectorcall on torch's functions so that stock modules run as before).
NEEDED = sys.version_info >= (3, 11)

# Names the prefixed code reads from torch's module globals.
_FLAG = "_fastmodule_accelerated"
_ROUTE = "_fastmodule_route"
_WALK = "_fastmodule_walk"
_BODIES = "_fastmodule_bodies"

# Column markers of the statement's two parts while it is compiled (no
# source line of torch's is that long); see _relocated.
_CHECK_COLUMN = 1 << 20
_TAKEN_COLUMN = _CHECK_COLUMN + 1

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


def _make_route() -> Callable[[Any], bool]:
    """``_fastmodule_route``: called eagerly (once :func:`install_route_check` made
    it the native check), is ``self`` a fast instance (no PEP 523 frame evaluator
    installed, ``torch.compiler.is_compiling()`` false)? Traced, :func:`_route`."""
    check = types.FunctionType(_route.__code__, _route.__globals__, _ROUTE)
    return functools.partial(check)


#: The route check (see :func:`_make_route`); fastmodule's own methods ask it too.
#: Where no native path is on, :func:`_route` itself (torch's module untouched).
ROUTE = _make_route() if verification.native_problem() is None else _route


def install_route_check() -> None:
    """Make :data:`ROUTE` the native check and keep torch's module's
    ``_fastmodule_accelerated`` flag (at start-up, where a native path is on)."""
    if isinstance(ROUTE, functools.partial):
        namespace = sys.modules[torch.nn.Module.__module__].__dict__
        _core.install_route_check(ROUTE.func, namespace, _FLAG)


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


def _locate(node: ast.AST, line: int, column: int) -> None:
    for sub in ast.walk(node):
        sub.lineno = sub.end_lineno = line  # type: ignore[attr-defined]
        sub.col_offset = sub.end_col_offset = column  # type: ignore[attr-defined]


def _prefix(fn: ast.FunctionDef, name: str, walked: bool, generator: bool) -> ast.stmt:
    """``if _fastmodule_accelerated and _fastmodule_route(self): return ...`` for
    method ``name``; the check and the taken branch carry the column markers."""
    self_name = [*fn.args.posonlyargs, *fn.args.args][0].arg
    call_args, keywords = _forwarded(fn.args)
    self_arg = ast.Name(self_name, ast.Load())
    target: ast.expr
    if walked:
        target = ast.Call(
            ast.Name(_WALK, ast.Load()), [ast.Constant(name), self_arg, *call_args], keywords
        )
        if generator:
            target = ast.YieldFrom(target)
    else:
        body = ast.Subscript(ast.Name(_BODIES, ast.Load()), ast.Constant(name), ast.Load())
        target = ast.Call(body, [self_arg, *call_args], keywords)
    check = ast.BoolOp(
        ast.And(),
        [
            ast.Name(_FLAG, ast.Load()),
            ast.Call(ast.Name(_ROUTE, ast.Load()), [ast.Name(self_name, ast.Load())], []),
        ],
    )
    taken = ast.Return(target)
    stmt = ast.If(check, [taken], [])
    _locate(stmt, fn.lineno, _CHECK_COLUMN)
    _locate(taken, fn.lineno, _TAKEN_COLUMN)
    return stmt


def _entries(table: bytes) -> list[tuple[int, int]]:
    """The location table's entries: (first code unit, code units). Each entry
    starts with a byte whose top bit is set (CPython's Objects/locations.md)."""
    out = []
    unit = start = 0
    for i in range(1, len(table) + 1):
        if i == len(table) or table[i] & 0x80:
            length = (table[start] & 7) + 1
            out.append((unit, length))
            unit += length
            start = i
    return out


def _varint(out: bytearray, value: int) -> None:
    while value >= 64:
        out.append(0x40 | (value & 63))
        value >>= 6
    out.append(value)


def _encode(code: types.CodeType, positions: list[Any]) -> bytes:
    """A location table for ``code`` giving each entry of its own table the
    position in ``positions`` (one per code unit): "no location" entries, the
    others in the long form (line delta, end line delta, columns + 1)."""
    table = bytearray()
    line = code.co_firstlineno
    for unit, length in _entries(code.co_linetable):
        start, end, column, end_column = positions[unit]
        if start is None:
            table.append(0x80 | (15 << 3) | (length - 1))
            continue
        table.append(0x80 | (14 << 3) | (length - 1))
        delta = start - line
        _varint(table, (-delta << 1) | 1 if delta < 0 else delta << 1)
        _varint(table, (start if end is None else end) - start)
        _varint(table, 0 if column is None else column + 1)
        _varint(table, 0 if end_column is None else end_column + 1)
        line = start
    return bytes(table)


_NO_LINE_START = frozenset({"RESUME", "END_FOR", "END_SEND", "END_ASYNC_FOR"})


def _line_starts(code: types.CodeType, ours: set[int]) -> list[tuple[Any, bool]]:
    """For each located instruction of ``code`` whose offset is not in ``ours``:
    its position and whether CPython 3.12+ instruments it as the start of a line
    (its line differs from the previous instruction's in the code, or a jump or
    an exception handler lands on it); 3.11 reports a line when it differs from
    the previously *executed* instruction's, which this implies here."""
    bytecode = dis.Bytecode(code)
    instructions = list(bytecode)
    targets = {i.argval for i in instructions if i.opcode in dis.hasjrel or i.opcode in dis.hasjabs}
    targets |= {e.target for e in bytecode.exception_entries}
    out = []
    current = None
    for ins in instructions:
        line = ins.positions.lineno if ins.positions is not None else None
        special = ins.opname in _NO_LINE_START
        start = not special and line is not None and (line != current or ins.offset in targets)
        if not special:
            current = line
        if line is not None and ins.offset not in ours:
            out.append((tuple(ins.positions), start))
    return out


def _relocated(new: types.CodeType, torch_code: types.CodeType) -> types.CodeType | None:
    """``new`` with the check's instructions unlocated and the taken branch at the
    ``def`` line without columns, or None unless every other located instruction
    keeps its position, in order, and whether it starts a line (so tracers see
    torch's line events)."""
    positions = list(new.co_positions())
    line = new.co_firstlineno
    wanted = list(positions)
    ours: set[int] = set()
    for unit, p in enumerate(positions):
        if p[2] == _CHECK_COLUMN:
            wanted[unit] = (None, None, None, None)
        elif p[2] == _TAKEN_COLUMN:
            wanted[unit] = (line, line, None, None)
        else:
            continue
        if p[0] != line:
            return None
        ours.add(2 * unit)
    if not ours:
        return None
    out = new.replace(co_linetable=_encode(new, wanted))
    if list(out.co_positions()) != wanted:
        return None
    if _line_starts(out, ours) != _line_starts(torch_code, set()):
        return None
    return out


def _prefixed(funcs: dict[str, types.FunctionType], walked: set[str]) -> dict[str, types.CodeType]:
    """torch's code for each of ``funcs`` with the route statement in front.

    What is compiled is torch's source file with its top-level functions and
    classes left out except class ``Module`` holding just these methods: the
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
        generator = bool(funcs[name].__code__.co_flags & inspect.CO_GENERATOR)
        fn.body.insert(1 if has_doc else 0, _prefix(fn, name, name in walked, generator))
    prefixed = compile(tree, filename, "exec", dont_inherit=True)
    out: dict[str, types.CodeType] = {}
    for name in found:
        code = funcs[name].__code__
        new = _code_of(prefixed, code.co_qualname, code.co_firstlineno)
        if new is None:
            continue
        is_gen = bool(new.co_flags & inspect.CO_GENERATOR)
        if is_gen != bool(code.co_flags & inspect.CO_GENERATOR):
            continue
        new = _relocated(new, code)
        if new is not None:
            out[name] = new
    return out


def _cache_dir() -> str | None:
    """Where :func:`_prefixed`'s results are kept: ``FASTMODULE_CACHE_DIR`` if set
    (empty: nowhere), else ``$XDG_CACHE_HOME/fastmodule`` or ``~/.cache/fastmodule``."""
    chosen = os.environ.get("FASTMODULE_CACHE_DIR")
    if chosen is not None:
        return chosen or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastmodule")


def _running(funcs: dict[str, types.FunctionType]) -> dict[str, bytes]:
    """What the prefixed code was made from, per function: its running bytecode,
    first line and qualified name."""
    return {
        name: hashlib.sha256(
            f.__code__.co_code
            + f"{f.__code__.co_firstlineno}:{f.__code__.co_qualname}:".encode()
            + f.__code__.co_filename.encode("utf-8", "surrogatepass")
        ).digest()
        for name, f in funcs.items()
    }


def _cache_file(funcs: dict[str, types.FunctionType], walked: set[str]) -> str | None:
    """The cache file for this interpreter, torch source, this file and request."""
    folder = _cache_dir()
    torch_file = next(iter(funcs.values())).__code__.co_filename
    torch_hash = verification.source_hash(torch_file)
    own_hash = verification.source_hash(__file__)
    if folder is None or torch_hash is None or own_hash is None:
        return None
    names = ",".join(f"{n}{'*' if n in walked else ''}" for n in sorted(funcs))
    # The file's path too: the code objects carry it (tracebacks, warnings), and
    # the same torch installed in two places has the same hash.
    parts = (sys.implementation.cache_tag or "", sys.version, torch_file, torch_hash, own_hash)
    key = "|".join((*parts, names))
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return os.path.join(folder, f"routes-{digest}.bin")


def _load(path: str, funcs: dict[str, types.FunctionType]) -> dict[str, types.CodeType] | None:
    try:
        with open(path, "rb") as f:
            made_from, codes = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if made_from != _running(funcs) or not isinstance(codes, dict):
        return None
    if not all(
        isinstance(c, types.CodeType)
        and name in funcs
        and c.co_filename == funcs[name].__code__.co_filename
        for name, c in codes.items()
    ):
        return None
    return codes


def _store(path: str, funcs: dict[str, types.FunctionType], codes: dict[str, Any]) -> None:
    """Written whole or not at all (another process may read it meanwhile)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".routes-")
        try:
            with os.fdopen(fd, "wb") as f:
                marshal.dump((_running(funcs), codes), f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only home: compile again next time


def _prefixed_cached(
    funcs: dict[str, types.FunctionType], walked: set[str]
) -> dict[str, types.CodeType]:
    """:func:`_prefixed`, from the cache when it was made from exactly this."""
    path = _cache_file(funcs, walked)
    if path is not None:
        codes = _load(path, funcs)
        if codes is not None:
            return codes
    codes = _prefixed(funcs, walked)
    if path is not None:
        _store(path, funcs, codes)
    return codes


def _parameters(func: Callable[..., Any]) -> list[tuple[str, Any]]:
    """``func``'s parameters: names and kinds."""
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values()]


def install(bodies: dict[str, Callable[..., Any]], walked: Iterable[str]) -> None:
    """Prefix torch's ``nn.Module.<name>`` for each name in ``bodies`` (once;
    :func:`prefixed` says which were). ``walked``: the methods whose body is
    exactly ``return _core.walk(name, self, <torch's parameters>)`` (``yield
    from`` for the generators): the prefix calls the walk itself for them."""
    if not NEEDED or _ORIGINAL:
        return
    namespace = sys.modules[torch.nn.Module.__module__].__dict__
    funcs: dict[str, types.FunctionType] = {}
    # The walk is called with torch's parameters: only where they are the body's.
    walked = {
        name
        for name in walked
        if name in bodies
        and isinstance(torch.nn.Module.__dict__.get(name), types.FunctionType)
        and _parameters(bodies[name]) == _parameters(torch.nn.Module.__dict__[name])
    }
    for name in bodies:
        func = torch.nn.Module.__dict__.get(name)
        if not isinstance(func, types.FunctionType) or func.__globals__ is not namespace:
            continue
        if bool(func.__code__.co_flags & inspect.CO_GENERATOR) and name not in walked:
            continue
        funcs[name] = func
    new_codes = _prefixed_cached(funcs, walked) if funcs else {}
    if not new_codes:
        return
    namespace[_ROUTE] = ROUTE
    namespace[_WALK] = _core.walk
    namespace[_BODIES] = dict(bodies)
    for name, new in new_codes.items():
        _ORIGINAL[name] = funcs[name].__code__
        funcs[name].__code__ = new
