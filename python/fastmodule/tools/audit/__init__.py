"""``fastmodule.audit(model)``: find the silent ``nn.Module`` bugs.

Modules, parameters and tensors kept where torch does not look (a plain
``list`` or ``dict`` attribute, a plain tensor attribute, a plain helper object)
are not trained, saved, moved or switched by ``train()/eval()``, and nothing
warns. ``audit`` walks a model's registered tree and reports each such place
with a stable code (``FM001`` ...), a severity, why it matters, the fix and,
where the source can be found, the file and line of the assignment; see
:data:`KINDS` for every kind and :func:`explain` for a page per kind.
``python -m fastmodule audit pkg.module:factory`` does the same from the
command line.

A finding is silenced in the code by a ``# fastmodule: ignore[FM001]`` comment on
the line it names, or by a class attribute ``__fastmodule_ignore__ = {"FM001":
["layers"]}`` (see :mod:`fastmodule.tools.audit.source`); ``select``/``ignore``
choose codes for one audit.

The audit only reads (each module's ``__dict__`` and registries, its class and
the class's source file); it never runs a forward or changes the model, and a
model gives the same report whether fastmodule accelerates it or not.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fastmodule.tools.audit.explain import explain
from fastmodule.tools.audit.findings import KINDS, SEVERITIES, Finding, Kind, Severity
from fastmodule.tools.audit.report import SCHEMA, AuditReport
from fastmodule.tools.audit.walk import elements, walk

__all__ = [
    "KINDS",
    "SCHEMA",
    "SEVERITIES",
    "AuditReport",
    "Finding",
    "Kind",
    "Severity",
    "audit",
    "explain",
    "select_codes",
]


def select_codes(
    select: Iterable[str] | None = None, ignore: Iterable[str] | None = None
) -> frozenset[str]:
    """The codes an audit reports: those ``select`` names (every code when None) less
    those ``ignore`` names. Each entry is a code or the start of codes, as in ruff
    (``"FM00"``: FM001-FM009), any case, and may list several separated by commas.

    Raises:
        ValueError: an entry that is no code and starts none.
    """

    def expand(entries: Iterable[str] | None) -> set[str] | None:
        if entries is None:
            return None
        if isinstance(entries, str):
            entries = [entries]
        out: set[str] = set()
        for entry in entries:
            for part in str(entry).split(","):
                prefix = part.strip().upper()
                if not prefix:
                    continue
                matched = {code for code in KINDS if code.startswith(prefix)}
                if not matched:
                    raise ValueError(
                        f"unknown code {part.strip()!r} (codes: {min(KINDS)}-{max(KINDS)})"
                    )
                out |= matched
        return out

    chosen = expand(select)
    dropped = expand(ignore) or set()
    return frozenset((set(KINDS) if chosen is None else chosen) - dropped)


def audit(
    model: torch.nn.Module,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> AuditReport:
    """Audit ``model``: every finding about its modules, parameters, buffers and
    the plain attributes and helper objects beside them.

    ``select`` and ``ignore`` choose the codes reported (see :func:`select_codes`).
    Findings the code silences are left out of ``findings`` and kept in
    ``suppressed``. Reads only public state and the classes' source files; never
    changes the model or runs its forward.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: an unknown code in ``select`` or ``ignore``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"audit() expects a torch.nn.Module, got {type(model).__name__}")
    codes = select_codes(select, ignore)
    w = walk(model)
    return AuditReport(
        model=type(model).__qualname__,
        findings=tuple(f for f in w.findings if f.code in codes),
        modules=len(w.nodes),
        parameters=len(w.parameters),
        parameter_elements=elements(t for _, t in w.parameters.values()),
        buffers=len(w.buffers),
        suppressed=tuple(f for f in w.suppressed if f.code in codes),
    )
