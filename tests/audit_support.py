"""Shared by the audit tests: audit a model stock and accelerated, and check the two
reports are the same and that the audit changed nothing."""

from __future__ import annotations

from typing import Any

import torch

import fastmodule
from fastmodule.module import NATIVE
from fastmodule.tools.audit import AuditReport
from tests.conftest import state


def snapshot(model: torch.nn.Module) -> list[Any]:
    """Every module's registries and plain attributes (by identity), its training flag,
    and every registered tensor's device, dtype, requires_grad and version."""
    out: list[Any] = []
    for m in torch.nn.Module.modules(model):
        out.append((state(m), m.training))
    for t in [*torch.nn.Module.parameters(model), *torch.nn.Module.buffers(model)]:
        out.append((t.device, t.dtype, t.requires_grad, t._version))
    return out


def audit_both(model: torch.nn.Module) -> AuditReport:
    """``fastmodule.audit(model)`` on the stock model, then on it accelerated (its
    classes restored after): the same report, and the model unchanged by either."""
    before = snapshot(model)
    report = fastmodule.audit(model)
    assert snapshot(model) == before
    with fastmodule.accelerated(model):
        if NATIVE:
            assert all(fastmodule.is_accelerated(m) for m in torch.nn.Module.modules(model))
        accelerated = fastmodule.audit(model)
    assert snapshot(model) == before
    assert accelerated == report
    return report
