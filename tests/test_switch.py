"""``fastmodule.disabled()`` and ``FASTMODULE_DISABLE=1``: every native path hands over
to torch's own code, so a user can rule fastmodule in or out in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core, switch

pytestmark = pytest.mark.skipif(
    not fastmodule.module.NATIVE, reason="no native path is on in this process"
)


class Probe(nn.Module):
    """Records which function called its forward: torch's ``_call_impl`` on stock's
    path, the caller itself on the native one."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.callers: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.callers.append(sys._getframe(1).f_code.co_name)
        return self.lin(x)


class FastProbe(fastmodule.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.callers: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.callers.append(sys._getframe(1).f_code.co_name)
        return self.lin(x)


def _work(m: nn.Module) -> Any:
    x = torch.ones(1, 2)
    out = m(x)
    m.extra = nn.Parameter(torch.zeros(1))
    del m.extra
    sd = m.state_dict()
    m.load_state_dict(sd)
    m.eval()
    m.train()
    m.zero_grad()
    m.to(torch.float32)
    return (
        out.tolist(),
        sorted(sd),
        [n for n, _ in m.named_parameters()],
        [n for n, _ in m.named_modules()],
        m.lin.weight.shape,
    )


@pytest.mark.parametrize("make", [Probe, FastProbe], ids=["accelerated", "fastmodule.Module"])
def test_disabled_runs_torchs_code(make: type[nn.Module]) -> None:
    torch.manual_seed(0)
    stock = make()
    stock_out = _work(stock) if make is Probe else None
    torch.manual_seed(0)
    m = make()
    with fastmodule.accelerated(m):
        # The first call of a forward code object this process has not seen runs
        # torch's call while fastmodule classifies the code (docs/design.md): the
        # second is native.
        m(torch.ones(1, 2))
        m(torch.ones(1, 2))
        native_caller = m.callers[-1]
        assert native_caller != "_call_impl"
        plans = _core.plan_stats()
        with fastmodule.disabled():
            assert fastmodule.switch.is_disabled() and _core.switched_off()
            assert "switched off" in (_core.call_handover(m) or "")
            out = _work(m)
            assert m.callers[-1] == "_call_impl"
            # No walk was recorded or replayed natively meanwhile.
            assert _core.plan_stats() == plans
        assert not _core.switched_off()
        m(torch.ones(1, 2))
        assert m.callers[-1] == native_caller
    if stock_out is not None:
        assert out == stock_out


def test_disabled_nests_and_survives_exceptions() -> None:
    with fastmodule.disabled():
        with fastmodule.disabled():
            assert _core.switched_off()
        assert _core.switched_off()
        with pytest.raises(ValueError), fastmodule.disabled():
            raise ValueError
        assert _core.switched_off()
    assert not _core.switched_off() and not switch.is_disabled()


def test_disabled_from_another_thread() -> None:
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with fastmodule.disabled():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(30)
        assert _core.switched_off()  # process-wide
    finally:
        leave.set()
        t.join(30)
    assert not _core.switched_off()


def test_doctor_shows_the_switch() -> None:
    rows = {r.name: r for r in fastmodule.diagnostics()}
    assert rows["switch"].on is True
    with fastmodule.disabled():
        rows = {r.name: r for r in fastmodule.diagnostics()}
        assert rows["switch"].on is False and "disabled()" in rows["switch"].detail


ENV_SCRIPT = """
import sys, torch
from torch import nn
import fastmodule
from fastmodule import _core
class Probe(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
    def forward(self, x):
        print(sys._getframe(1).f_code.co_name)
        return self.lin(x)
m = fastmodule.accelerate(Probe())
m(torch.ones(1, 2))
with fastmodule.disabled():
    pass
m(torch.ones(1, 2))
rows = {r.name: r for r in fastmodule.diagnostics()}
print(_core.switched_off(), rows["switch"].on, rows["switch"].detail)
"""


def test_environment_switch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(ENV_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FASTMODULE_DISABLE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["_call_impl", "_call_impl"]
    assert lines[2].startswith("True False off: FASTMODULE_DISABLE is set")
