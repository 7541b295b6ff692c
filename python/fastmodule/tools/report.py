"""``fastmodule.report()`` and ``fastmodule.reporting()`` (``python -m fastmodule run
--report``): which module calls of a whole program ran torch's path, and why.

Every module call is counted by a global forward pre-hook
(``torch.nn.modules.module.register_module_forward_pre_hook``), registered only while
some count is on: nothing is registered, so nothing costs, until :func:`report` or
:func:`reporting` is used. fastmodule's native call dispatches forward hooks itself,
so the hook does not send a call to torch's path where the native hook dispatch is on
(``fastmodule doctor``); it costs a Python call per module call, so a counted run is
slower than one that is not. At each call the hook asks ``_core.call_handover`` (the
native call's own checks) what the call does. Where an answer is one only the hook
causes (the module has no forward hook of its own and no other global one, and the
native hook dispatch is off, or module.py's ``warnings.warn`` is replaced), the call is
asked again with the hook taken out for the question, so the report says what the
call does without it.

Calls are grouped by class (its module and qualified name: classes a library makes
anew for each call, with one name, are one row) and reason; a row counts its calls and
its distinct module instances. Code compiled by ``torch.compile`` makes no module calls
while it runs compiled, and none are counted there.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import sys
import textwrap
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.modules import module as _module_py

from fastmodule import _core
from fastmodule.module import NATIVE

__all__ = ["CallCounter", "CallReport", "CallRow", "REMEDIES", "SCHEMA", "report", "reporting"]

#: The JSON layout's version; bumped when a field changes meaning or goes away.
SCHEMA = 1

#: The reason given for every call where no native path is on in this interpreter.
NATIVE_OFF = "fastmodule's native paths are off here (fastmodule doctor says why)"
NOT_ACCELERATED = "its class is not accelerated"
OWN_CALL = "its class defines its own __call__"

#: What to do about a reason ``_core.call_handover`` gives (or that it is by design);
#: a reason not here gets no remedy.
REMEDIES: dict[str, str] = {
    NOT_ACCELERATED: "use fastmodule.install() or python -m fastmodule run (a class made "
    "after accelerate(model) ran, e.g. inside a library, is not accelerated by it)",
    OWN_CALL: "torch's path by design: the class defines its own __call__ (put that code "
    "in forward() for the native path)",
    "it has backward hooks": "backward hooks run on torch's path (by design)",
    "global backward hooks are registered": "backward hooks run on torch's path (by design)",
    "fastmodule is switched off (fastmodule.disabled() or FASTMODULE_DISABLE=1)": (
        "by request: calls inside fastmodule.disabled() or under FASTMODULE_DISABLE=1"
    ),
    "a PEP 523 frame evaluator (torch.compile) is active": "torch.compile runs these calls "
    "(by design)",
    "module.compile() was used on it": "torch.compile runs these calls (by design)",
    "a trace or profile function is set (debugger, profiler, coverage)": "run without the "
    "debugger, profiler or coverage tool for the native path",
    "torch.jit.trace is running": "torch.jit.trace records these calls (by design)",
    "its class overrides _call_impl": "torch's path by design: the class replaces "
    "torch's _call_impl",
    "its class overrides __getattribute__": "torch's path by design: the class replaces "
    "__getattribute__",
    "reading its `forward` may run code (a property or another descriptor, or no class "
    "attribute): torch's _call_impl reads it before it looks at the hooks, which that code "
    "may register": "define forward as a plain method of the class for the native path",
    NATIVE_OFF: "python -m fastmodule doctor says why",
    "the native module call is off for this torch (fastmodule doctor says why)": (
        "python -m fastmodule doctor says why"
    ),
}

#: The reasons only a forward hook causes: asked again without the report's hook.
_HOOK_REASONS = frozenset(
    {
        "it has forward hooks (its own or global ones) and the native hook dispatch is "
        "off: fastmodule.diagnostics() says why",
        "it has forward hooks and module.py's warnings.warn is not CPython's own (torch's "
        "_call_impl runs, with the frames a wrapper may read)",
    }
)


@dataclass(frozen=True)
class CallRow:
    """Calls of one class that ran torch's path, for one reason."""

    #: The class, ``module.QualifiedName``.
    cls: str
    #: Why they ran torch's path (``_core.call_handover``'s words).
    reason: str
    #: What to do about it, or that it is by design; None where nothing is known.
    remedy: str | None
    calls: int
    #: Distinct module instances called.
    modules: int


@dataclass(frozen=True)
class CallReport:
    """Module calls counted, and those that ran torch's path by class and reason
    (``rows``, most calls first). ``str(report)`` is the table."""

    calls: int
    rows: list[CallRow]

    @property
    def native_calls(self) -> int:
        """Calls that took fastmodule's native path."""
        return self.calls - sum(r.calls for r in self.rows)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (``schema`` gives the layout's version)."""
        return {
            "schema": SCHEMA,
            "module_calls": self.calls,
            "native_calls": self.native_calls,
            "torch_path": [dataclasses.asdict(r) for r in self.rows],
        }

    def dumps(self) -> str:
        """:meth:`to_json` as a JSON text."""
        return json.dumps(self.to_json(), indent=2)

    def format(self, width: int | None = None) -> str:
        """The table, wrapped to ``width`` columns (default: the terminal's, see
        :func:`terminal_width`)."""
        width = max(60, terminal_width() if width is None else width)
        native = self.native_calls
        share = f" ({100 * native / self.calls:.1f}%)" if self.calls else ""
        lines = [
            f"fastmodule report: {_count(self.calls, 'module call')}, {native:,} native{share}"
        ]
        if not self.rows:
            lines.append(
                "every module call took the native path" if self.calls else "no module calls"
            )
            return "\n".join(lines)
        lines.append("torch's path:")
        cls_width = min(max(len("class"), *(len(r.cls) for r in self.rows)), width * 2 // 5)
        mods_width = max(len("modules"), *(len(f"{r.modules:,}") for r in self.rows))
        calls_width = max(len("calls"), *(len(f"{r.calls:,}") for r in self.rows))
        indent = 2 + cls_width + 2 + mods_width + 2 + calls_width + 2
        text_width = max(20, width - indent)
        lines.append(
            f"  {'class':<{cls_width}}  {'modules':>{mods_width}}  {'calls':>{calls_width}}  why"
        )
        for r in self.rows:
            why = _wrap(r.reason, text_width) or [""]
            if r.remedy:
                why += _wrap(f"remedy: {r.remedy}", text_width, subsequent_indent="  ")
            lines.append(
                f"  {_fit(r.cls, cls_width):<{cls_width}}  {r.modules:>{mods_width},}  "
                f"{r.calls:>{calls_width},}  {why[0]}"
            )
            lines += [" " * indent + w for w in why[1:]]
        return "\n".join(lines)


def terminal_width() -> int:
    """The width to fit the table to: COLUMNS if set, else stderr's terminal width,
    else 100."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if sys.stderr.isatty():
            return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return 100


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _wrap(text: str, width: int, **kwargs: Any) -> list[str]:
    # Names (fastmodule.accelerate(model)) are not broken inside.
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False, **kwargs)


def _fit(name: str, width: int) -> str:
    """``name`` in ``width`` columns: cut at the front (the class's own name, at the
    end, is kept), marked with an ellipsis."""
    return name if len(name) <= width else "…" + name[len(name) - width + 1 :]


class _Group:
    """One (class, reason) row being counted."""

    __slots__ = ("calls", "modules", "refs")

    def __init__(self) -> None:
        self.calls = 0
        self.modules = 0
        # id -> a weak reference to the instance (None where it takes none): an id
        # reused by a new instance after the old one died counts as a new module.
        self.refs: dict[int, Any] = {}


class CallCounter:
    """A live count of module calls, from its start until :meth:`stop`.

    ``str(counter)`` is the table of the calls counted so far; :meth:`report` gives
    them as a :class:`CallReport`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._groups: dict[tuple[str, str | None], _Group] = {}
        self._running = False

    @property
    def running(self) -> bool:
        """Is this counter counting?"""
        return self._running

    def start(self) -> CallCounter:
        """Count from now on (nothing if already counting); returns the counter."""
        if not self._running:
            self._running = True
            _attach(self)
        return self

    def stop(self) -> CallCounter:
        """Stop counting (the counts stay); returns the counter."""
        if self._running:
            self._running = False
            _detach(self)
        return self

    def _add(self, module: torch.nn.Module, cls: str, reason: str | None) -> None:
        with self._lock:
            self._calls += 1
            group = self._groups.get((cls, reason))
            if group is None:
                group = self._groups[(cls, reason)] = _Group()
            group.calls += 1
            key = id(module)
            ref = group.refs.get(key, False)
            if ref is False or (ref is not None and ref() is not module):
                group.modules += 1
                try:
                    group.refs[key] = weakref.ref(module)
                except TypeError:
                    group.refs[key] = None

    def report(self) -> CallReport:
        """The calls counted so far."""
        with self._lock:
            rows = [
                CallRow(cls, reason, REMEDIES.get(reason), g.calls, g.modules)
                for (cls, reason), g in self._groups.items()
                if reason is not None
            ]
            calls = self._calls
        rows.sort(key=lambda r: (-r.calls, r.cls, r.reason))
        return CallReport(calls, rows)

    def __str__(self) -> str:
        return str(self.report())


# The one global hook, registered while some counter is running.
_counters: list[CallCounter] = []
_handle: Any = None
_attach_lock = threading.Lock()


def _attach(counter: CallCounter) -> None:
    global _handle
    with _attach_lock:
        _counters.append(counter)
        if _handle is None:
            _handle = _module_py.register_module_forward_pre_hook(_hook)


def _detach(counter: CallCounter) -> None:
    global _handle
    with _attach_lock:
        with contextlib.suppress(ValueError):
            _counters.remove(counter)
        if not _counters and _handle is not None:
            _handle.remove()
            _handle = None


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


def _reason(module: torch.nn.Module) -> str | None:
    """What this call of ``module`` does without the report's hook: None (native) or
    why it runs torch's path."""
    if not NATIVE:
        return NATIVE_OFF
    try:
        reason = _core.call_handover(module)
    except Exception as e:  # never fail the program's call
        return f"fastmodule could not tell ({type(e).__name__}: {e})"
    if reason in _HOOK_REASONS:
        reason = _without_hook(module, reason)
    return reason


def _without_hook(module: torch.nn.Module, reason: str) -> str | None:
    """``reason`` is a forward hook's: where the report's hook is the only one, ask
    again with it out of module.py's registry (torch's path runs this call: it walks
    a copy of the registry, so the call itself is not changed)."""
    handle = _handle
    hooks = _module_py._global_forward_pre_hooks
    if (
        handle is None
        or list(hooks) != [handle.id]
        or _module_py._global_forward_hooks
        or getattr(module, "_forward_pre_hooks", None)
        or getattr(module, "_forward_hooks", None)
    ):
        return reason
    hook = hooks.pop(handle.id)
    try:
        return _core.call_handover(module)
    except Exception:
        return reason
    finally:
        hooks[handle.id] = hook


def _hook(module: torch.nn.Module, args: object) -> None:
    if _is_compiling():
        return
    cls = type(module)
    name = f"{cls.__module__}.{cls.__qualname__}"
    reason = _reason(module)
    for counter in tuple(_counters):
        counter._add(module, name, reason)


_process: CallCounter | None = None
_at_exit_registered = False


def report(*, at_exit: bool = False) -> CallReport:
    """Count every module call of the process from now on (if not counting yet), and
    return the calls counted so far: which ran torch's path instead of fastmodule's
    native one, by class and reason, with the remedy where there is one.

    The first call starts the count (so it returns an empty report); later calls
    return what was counted since. ``print(fastmodule.report())`` prints the table;
    ``.to_json()`` gives it as data. With ``at_exit=True``, the table is also printed
    to stderr when the process exits (after an exception or ``sys.exit`` too), as
    ``python -m fastmodule run --report`` does. Counting costs a Python call per module
    call (a global forward pre-hook); nothing is registered before the first call.
    For one block of code, use :func:`reporting`.
    """
    global _process, _at_exit_registered
    if _process is None:
        _process = CallCounter()
    _process.start()
    if at_exit and not _at_exit_registered:
        _at_exit_registered = True
        atexit.register(_print_at_exit)
    return _process.report()


def _print_at_exit(json_path: str | None = None, table: bool = True) -> None:
    """Print the process's report to stderr (and write its JSON to ``json_path``);
    never raises (the program's exit status stays its own)."""
    try:
        counter = _process
        if counter is None:
            return
        counter.stop()
        result = counter.report()
        if json_path is not None:
            with open(json_path, "w", encoding="utf-8") as f:
                f.write(result.dumps() + "\n")
        if table:
            sys.stderr.flush()
            print(result.format(), file=sys.stderr, flush=True)
    except Exception as e:
        with contextlib.suppress(Exception):
            print(f"fastmodule report failed: {type(e).__name__}: {e}", file=sys.stderr)


def report_at_exit(*, table: bool = True, json_path: str | None = None) -> None:
    """For ``run --report``/``--report-json``: count from now on, and at the process's
    exit print the table to stderr (``table``) and write the JSON to ``json_path``."""
    global _process, _at_exit_registered
    if _process is None:
        _process = CallCounter()
    _process.start()
    _at_exit_registered = True
    atexit.register(_print_at_exit, json_path, table)


@contextlib.contextmanager
def reporting() -> Iterator[CallCounter]:
    """``with fastmodule.reporting() as calls: ...`` counts the module calls of the
    block (every thread's); after it, ``print(calls)`` prints the table and
    ``calls.report()`` gives the :class:`CallReport`. Independent of
    :func:`report`'s process-wide count."""
    counter = CallCounter().start()
    try:
        yield counter
    finally:
        counter.stop()
