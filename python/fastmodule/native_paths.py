"""Which native paths are on in this process, and why any is off.

``fastmodule.diagnostics()`` answers for this interpreter and torch;
``python -m fastmodule doctor`` prints the same as a table (``--json`` for
tools). A path that is off runs torch's own code, exactly as stock; the only
cost is speed. ``import fastmodule`` warns once (:class:`UnverifiedWarning`)
when something is off because fastmodule could not verify what it relies on.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch

from fastmodule import _core
from fastmodule._methods import conversion
from fastmodule._methods import dispatch as _dispatch
from fastmodule._verified import hook_dispatch, inline_routes, layers, verification
from fastmodule.module import NATIVE
from fastmodule.verification import UnverifiedWarning

__all__ = ["PathStatus", "UnverifiedWarning", "diagnostics", "format_table", "unverified_message"]


@dataclasses.dataclass(frozen=True)
class PathStatus:
    """One native path, or something every native path relies on."""

    #: What it is: ``"module call"``, ``"nn.Module.state_dict"``, ...
    name: str
    #: True: in use; False: torch's own code runs instead; None: this build of
    #: fastmodule does not say.
    on: bool | None
    #: When on, what is in use; when off, why.
    detail: str
    #: Off because fastmodule could not verify what it relies on (an interpreter,
    #: a torch function, a library symbol); ``import fastmodule`` warned about it.
    unverified: bool = False


_NO_NATIVE = "no native path is on (see interpreter)"


def _interpreter_rows() -> list[PathStatus]:
    problem = verification.interpreter_problem()
    version = sys.version.split()[0]
    build = "free-threaded" if "free-threading" in sys.version else "GIL"
    rows = [
        PathStatus(
            "interpreter",
            problem is None,
            f"CPython {version} ({build})" if problem is None else f"{problem}: {_NO_NATIVE}",
            unverified=problem is not None,
        )
    ]
    if problem is not None:
        rows.append(PathStatus("tracer check", False, "not probed"))
        rows.append(PathStatus("quiet dicts", False, "not checked"))
        return rows
    if NATIVE:
        tracer = PathStatus(
            "tracer check",
            True,
            "under sys.settrace/sys.setprofile (debuggers, profilers) torch's code runs",
        )
    else:
        detail = f"this CPython's trace/profile fields were not found: {_NO_NATIVE}"
        tracer = PathStatus("tracer check", False, detail, unverified=True)
    rows.append(tracer)
    if not NATIVE:
        rows.append(PathStatus("quiet dicts", False, "not checked"))
    elif _core.quiet_dicts_known():
        strs = (
            "compact ASCII str layout recognised"
            if _core.ascii_layout_known()
            else "compact ASCII str layout not recognised: state_dict keys matched as strs"
        )
        rows.append(PathStatus("quiet dicts", True, f"dict key-table layout recognised; {strs}"))
    else:
        detail = "dict key-table layout not recognised: every lookup is left to torch's code"
        rows.append(PathStatus("quiet dicts", False, detail, unverified=True))
    return rows


def _runtime_rows() -> list[PathStatus]:
    if not NATIVE:
        return [
            PathStatus(name, False, _NO_NATIVE)
            for name in ("jit tracing probe", "cache validity", "recorded walks")
        ]
    rows = []
    on, found = _core.tracing_probe()
    if on:
        rows.append(PathStatus("jit tracing probe", True, f"libtorch's getTracingState: {found}"))
    else:
        detail = f"torch._C._is_tracing() asked on every call: {found}"
        rows.append(PathStatus("jit tracing probe", False, detail, unverified=True))
    # Reported by builds that have them (getattr: older builds do not).
    validity = getattr(_core, "cache_validity", None)
    if validity is None:
        rows.append(PathStatus("cache validity", None, "unknown (this build does not report it)"))
    else:
        text = str(validity())
        rows.append(PathStatus("cache validity", not text.startswith("off"), text))
    recorded = getattr(_core, "recorded_walks", None)
    if recorded is None:
        rows.append(PathStatus("recorded walks", None, "unknown (this build does not report it)"))
    elif recorded():
        rows.append(PathStatus("recorded walks", True, "walks replayed from recorded plans"))
    else:
        detail = "not kept on this interpreter build: every walk runs live"
        rows.append(PathStatus("recorded walks", False, detail))
    return rows


_CORE_NAMES = {"call": "module call", "getattr": "attribute read", "registration": "registration"}
_CORE_ON = {
    "call": "m(...) runs torch's call decision natively",
    "getattr": "m.weight, m.child read natively",
    "registration": "m.x = v, del m.x, register_* run natively",
}


def _core_rows() -> dict[str, PathStatus]:
    rows = {}
    for path, functions in verification.CORE_PATHS.items():
        name = _CORE_NAMES[path]
        problem = verification.path_problem(functions)
        if not NATIVE:
            rows[path] = PathStatus(name, False, _NO_NATIVE)
        elif problem is not None:
            rows[path] = PathStatus(name, False, problem, unverified=True)
        else:
            rows[path] = PathStatus(name, True, _CORE_ON[path])
    return rows


def _hook_row(call_on: bool) -> PathStatus:
    name = "hook dispatch"
    if not NATIVE:
        return PathStatus(name, False, _NO_NATIVE)
    if hook_dispatch.HOOKS is not None:
        return PathStatus(name, False, hook_dispatch.HOOKS, unverified=True)
    if not call_on:
        return PathStatus(name, False, "the module call path is off")
    detail = (
        "forward (pre-)hooks, module and global, run natively; "
        "with backward hooks torch's _call_impl runs the call"
    )
    return PathStatus(name, True, detail)


def _layer_rows(call_on: bool) -> list[PathStatus]:
    if not NATIVE:
        names = ("layer forwards", "container methods", "conversion closures")
        return [PathStatus(name, False, _NO_NATIVE) for name in names]
    rows = []
    if layers.LAYERS is not None:
        rows.append(PathStatus("layer forwards", False, layers.LAYERS, unverified=True))
    elif not call_on:
        rows.append(PathStatus("layer forwards", False, "the module call path is off"))
    else:
        detail = "nn.Sequential/nn.Linear/nn.ReLU forwards run without their frames"
        rows.append(PathStatus("layer forwards", True, detail))
    served, wanted = len(layers.CONTAINERS), len(verification.CONTAINER_METHODS)
    missing = [
        f"{verification.display(f)}: {verification.function_problem(f) or 'reads other names'}"
        for f in verification.CONTAINER_METHODS
        if f.partition(":")[2] not in layers.CONTAINERS
    ]
    detail = f"{served} of {wanted} ModuleList/Sequential/ModuleDict methods served natively"
    rows.append(
        PathStatus(
            "container methods",
            not missing,
            detail + (f"; torch's for {'; '.join(missing)}" if missing else ""),
            unverified=bool(missing),
        )
    )
    unknown = [
        f"{verification.display(f)}: {verification.function_problem(f)}"
        for f in verification.CONVERSIONS
        if verification.function_problem(f) is not None
    ]
    known, wanted = len(conversion.KNOWN), len(verification.CONVERSIONS)
    detail = (
        f"{known} of {wanted} closures of .float()/.double()/.half()/.bfloat16()/.cpu()/.to() "
        "recognised by the native _apply (an unchanged tensor is not touched)"
    )
    if unknown:
        detail += f"; not those of {'; '.join(unknown)}"
    on = not unknown and known >= wanted
    rows.append(PathStatus("conversion closures", on, detail, unverified=bool(unknown)))
    return rows


def _method_rows() -> list[PathStatus]:
    prefixed = set(inline_routes.prefixed())
    rows = []
    for name in verification.METHOD_PATHS:
        label = f"nn.Module.{name}"
        if name in _dispatch.BODIES:
            if name in prefixed:
                detail = "native for fastmodule.Module and accelerated classes"
            else:
                detail = (
                    "native for fastmodule.Module; accelerated classes called from Python "
                    "run torch's code (its code could not be prefixed)"
                )
            rows.append(PathStatus(label, True, detail))
        else:
            why = _dispatch.STOCK.get(name, "not served")
            rows.append(PathStatus(label, False, why, unverified=NATIVE))
    return rows


def diagnostics() -> list[PathStatus]:
    """Every native path of fastmodule in this process (and what they all rely
    on: the interpreter, the tracer check, the dict layout, the jit-tracing
    probe, cache validity, recorded walks), each on or off with the reason.

    A path that is off runs torch's own code: behaviour is stock either way.
    """
    from fastmodule import switch

    core = _core_rows()
    return [
        *_interpreter_rows(),
        PathStatus(
            "switch",
            NATIVE and not switch.is_disabled(),
            switch.switch_state() if NATIVE else _NO_NATIVE,
        ),
        *_runtime_rows(),
        *core.values(),
        _hook_row(core["call"].on is True),
        *_layer_rows(core["call"].on is True),
        *_method_rows(),
    ]


def report(rows: list[PathStatus] | None = None) -> dict[str, Any]:
    """The rows with the versions they describe, as JSON-ready data."""
    import platform

    from fastmodule import __version__  # upward: the version is defined once, in __init__

    rows = diagnostics() if rows is None else rows
    return {
        "fastmodule": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "paths": [dataclasses.asdict(r) for r in rows],
    }


def format_table(rows: list[PathStatus]) -> str:
    """The rows as a plain-text table with a closing summary line."""
    state = {True: "on", False: "off", None: "?"}
    width = max(len(r.name) for r in rows)
    lines = [f"{'path':<{width}}  state  detail"]
    for r in rows:
        mark = "off!" if r.on is False and r.unverified else state[r.on]
        lines.append(f"{r.name:<{width}}  {mark:<5}  {r.detail}")
    off = [r for r in rows if r.on is False]
    if off:
        lines.append(f"\n{len(off)} off: torch's own code runs for them (off!: not verified)")
    else:
        lines.append("\nevery native path is on")
    return "\n".join(lines)


def unverified_message(rows: list[PathStatus] | None = None) -> str | None:
    """What ``import fastmodule`` warns about: the paths that are off because
    something they rely on could not be verified, or None."""
    rows = diagnostics() if rows is None else rows
    bad = [r for r in rows if r.unverified]
    if not bad:
        return None
    if not NATIVE:
        return (
            f"fastmodule: {verification.native_problem()}: no native path is on, torch's "
            "own code runs everywhere (python -m fastmodule doctor lists every path)"
        )
    functions = {
        f"{verification.display(f)} ({problem})"
        for f in verification.all_functions()
        if (problem := verification.function_problem(f)) is not None
    }
    parts = []
    if functions:
        shown = sorted(functions)
        more = f" and {len(shown) - 6} more" if len(shown) > 6 else ""
        parts.append(f"torch {torch.__version__}'s {', '.join(shown[:6])}{more} not verified")
    other = [r for r in bad if r.name in ("jit tracing probe", "quiet dicts")]
    parts += [f"{r.name}: {r.detail}" for r in other]
    paths = [r.name for r in bad if r not in other]
    text = "fastmodule: " + "; ".join(parts)
    if paths:
        text += f". Torch's own code runs for: {', '.join(paths)}"
    return text + " (python -m fastmodule doctor lists every path)"
