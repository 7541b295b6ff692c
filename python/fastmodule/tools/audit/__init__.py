"""``fastmodule.audit(model)``: find the silent ``nn.Module`` bugs.

Modules, parameters and tensors kept where torch does not look (a plain
``list`` or ``dict`` attribute, a plain tensor attribute) are not trained,
saved, moved or switched by ``train()/eval()``, and nothing warns. ``audit``
walks a model's registered tree and reports each such place with a stable
code (``FM001`` ...), a severity, why it matters and the fix; see
:data:`KINDS` for every kind. ``python -m fastmodule audit pkg.module:factory``
does the same from the command line.

The audit only reads (each module's ``__dict__`` and registries, and its
class); it never runs a forward or changes the model, and a model gives the
same report whether fastmodule accelerates it or not.
"""

from __future__ import annotations

import torch

from fastmodule.tools.audit.findings import KINDS, SEVERITIES, Finding, Kind, Severity
from fastmodule.tools.audit.report import SCHEMA, AuditReport
from fastmodule.tools.audit.walk import elements, walk

__all__ = ["KINDS", "SCHEMA", "SEVERITIES", "AuditReport", "Finding", "Kind", "Severity", "audit"]


def audit(model: torch.nn.Module) -> AuditReport:
    """Audit ``model``: every finding about its modules, parameters, buffers and
    the plain attributes beside them.

    Reads only public state and never changes the model or runs its forward.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"audit() expects a torch.nn.Module, got {type(model).__name__}")
    w = walk(model)
    return AuditReport(
        model=type(model).__qualname__,
        findings=tuple(w.findings),
        modules=len(w.nodes),
        parameters=len(w.parameters),
        parameter_elements=elements(t for _, t in w.parameters.values()),
        buffers=len(w.buffers),
    )
