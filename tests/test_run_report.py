"""``python -m fastmodule run --report`` / ``--report-json`` and ``fastmodule.report()`` /
``fastmodule.reporting()``: the module calls of a program that ran torch's path, by
class and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastmodule
from fastmodule.tools.report import NOT_ACCELERATED, OWN_CALL, REMEDIES, CallReport, CallRow

ROOT = Path(__file__).resolve().parents[1]

#: A script: a stack called a few times, then (argv[1] == "late") a class whose
#: instances are made and called after everything was accelerated and its
#: acceleration undone (as a class a library makes that acceleration never reached),
#: then one with its own __call__; it prints a line and exits with argv[2].
SCRIPT = """
import sys
import torch
import fastmodule


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


model = fastmodule.accelerate(torch.nn.Sequential(Block(), Block()))
for _ in range(3):
    model(torch.ones(2, 4))

if sys.argv[1] == "late":
    def make():
        class LibraryWrapper(torch.nn.Module):
            def forward(self, x):
                return x * 2
        fastmodule.restore(LibraryWrapper())
        return LibraryWrapper()

    for _ in range(2):
        make()(torch.ones(1))

    class OwnCall(torch.nn.Module):
        def forward(self, x):
            return x + 1

        def __call__(self, x):
            return super().__call__(x)

    OwnCall()(torch.ones(1))
    OwnCall()(torch.ones(1))
print("the script's own output")
if sys.argv[2] == "raise":
    raise ValueError("the script failed")
sys.exit(int(sys.argv[2]))
"""


def _run(
    tmp_path: Path, *argv: str, report: tuple[str, ...] = ("--report",)
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "COLUMNS": "100"}
    env.pop("FASTMODULE_DISABLE", None)
    return subprocess.run(
        [sys.executable, "-m", "fastmodule", "run", *report, str(script), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.requires_native("native calls are counted as native")
def test_late_class_and_own_call_are_named_with_reason_and_remedy(tmp_path: Path) -> None:
    done = _run(tmp_path, "late", "0")
    assert done.returncode == 0, done.stderr
    err = done.stderr
    # 3 x (Sequential + 2 x (Block, Linear, ReLU)) native, then 2 + 2 on torch's path.
    assert "fastmodule report: 25 module calls, 21 native (84.0%)" in err
    assert "__main__.make.<locals>.LibraryWrapper" in err
    assert NOT_ACCELERATED in err
    assert "fastmodule.install()" in err
    assert "__main__.OwnCall" in err
    assert OWN_CALL in err
    lines = err.splitlines()
    row = next(line for line in lines if "LibraryWrapper" in line)
    assert row.split()[1:3] == ["2", "2"]  # two instances (one class per make()), two calls
    assert all(len(line) <= 100 for line in lines if line.startswith("  "))


@pytest.mark.requires_native("native calls are counted as native")
def test_native_run_reports_nothing(tmp_path: Path) -> None:
    done = _run(tmp_path, "native", "0")
    assert done.returncode == 0, done.stderr
    assert "fastmodule report: 21 module calls, 21 native (100.0%)" in done.stderr
    assert "every module call took the native path" in done.stderr


@pytest.mark.parametrize("status", ["0", "3", "raise"])
def test_exit_status_and_stdout_are_the_scripts(tmp_path: Path, status: str) -> None:
    plain = _run(tmp_path, "late", status, report=())
    reported = _run(tmp_path, "late", status)
    assert reported.returncode == plain.returncode == (1 if status == "raise" else int(status))
    assert reported.stdout == plain.stdout == "the script's own output\n"
    assert "fastmodule report" not in plain.stderr
    # Printed at exit, after the script's traceback too.
    assert "fastmodule report: 25 module calls" in reported.stderr
    if status == "raise":
        assert reported.stderr.index("ValueError") < reported.stderr.index("fastmodule report")


def test_json_has_the_tables_rows(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = _run(tmp_path, "late", "0", report=("--report", "--report-json", "report.json"))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == 1
    assert data["module_calls"] == 25
    rows = data["torch_path"]
    for row in rows:
        assert set(row) == {"cls", "reason", "remedy", "calls", "modules"}
        assert row["cls"] in done.stderr
        assert row["remedy"] == REMEDIES.get(row["reason"])
    table_calls = sum(r["calls"] for r in rows)
    assert data["native_calls"] == 25 - table_calls
    if fastmodule.is_accelerated(torch.nn.Linear(1, 1)):
        assert {(r["cls"], r["reason"], r["calls"], r["modules"]) for r in rows} == {
            ("__main__.make.<locals>.LibraryWrapper", NOT_ACCELERATED, 2, 2),
            ("__main__.OwnCall", OWN_CALL, 2, 2),
        }
    only_json = _run(tmp_path, "late", "0", report=("--report-json", "report.json"))
    assert "fastmodule report" not in only_json.stderr
    assert json.loads(out.read_text()) == data


def test_reporting_block_in_process() -> None:
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = dict(hooks)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    with fastmodule.accelerated(model):

        class Late(torch.nn.Module):  # made after accelerate(model), never accelerated
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x

        late = Late()
        model(torch.ones(1, 3))  # not counted
        with fastmodule.reporting() as calls:
            assert calls.running and len(hooks) == len(before) + 1
            for _ in range(2):
                model(torch.ones(1, 3))
                late(torch.ones(1))
        assert not calls.running
        assert dict(hooks) == before  # nothing left registered
        model(torch.ones(1, 3))  # not counted
        native = fastmodule.is_accelerated(model)
    result = calls.report()
    assert isinstance(result, CallReport)
    assert result.calls == 8
    late_row = next(r for r in result.rows if r.cls.endswith("Late"))
    assert late_row.calls == 2 and late_row.modules == 1
    assert late_row.cls == f"{__name__}.test_reporting_block_in_process.<locals>.Late"
    if native:
        assert result.rows == [late_row]
        assert late_row.reason == NOT_ACCELERATED
        assert late_row.remedy == REMEDIES[NOT_ACCELERATED]
        assert result.native_calls == 6
    assert str(calls) == str(result) == result.format()
    rows = json.loads(result.dumps())["torch_path"]
    assert [CallRow(**row) for row in rows] == result.rows


def test_report_counts_from_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastmodule.tools import report as report_module

    monkeypatch.setattr(report_module, "_process", None)
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = dict(hooks)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    try:
        with fastmodule.accelerated(model):
            first = fastmodule.report()
            assert first.calls == 0 and first.rows == []
            assert "no module calls" in str(first)
            model(torch.ones(1, 3))
            with fastmodule.disabled():
                model(torch.ones(1, 3))
            second = fastmodule.report()
            native = fastmodule.is_accelerated(model)
        assert second.calls == 4
        assert second.native_calls == (2 if native else 0)
        assert {r.cls for r in second.rows} >= {
            "torch.nn.modules.container.Sequential",
            "torch.nn.modules.linear.Linear",
        }
    finally:
        assert report_module._process is not None
        report_module._process.stop()
    assert dict(hooks) == before


def test_format_fits_and_sorts() -> None:
    long = "some.library.with.a.very.long.module.path." + "Wrapper" * 6
    rows = [
        CallRow(long, NOT_ACCELERATED, REMEDIES[NOT_ACCELERATED], 7, 3),
        CallRow("pkg.Own", OWN_CALL, REMEDIES[OWN_CALL], 1_234, 1),
        CallRow("pkg.Odd", "a reason with no remedy", None, 2, 2),
    ]
    report = CallReport(10_000, sorted(rows, key=lambda r: -r.calls))
    text = report.format(width=80)
    lines = text.splitlines()
    assert lines[0] == "fastmodule report: 10,000 module calls, 8,757 native (87.6%)"
    assert all(len(line) <= 80 for line in lines), text
    assert "…" in text and "Wrapper" in text  # the long name cut at its front
    assert lines[3].split()[:3] == ["pkg.Own", "1", "1,234"]  # most calls first
    assert "remedy:" not in text.split("pkg.Odd")[1]  # the last row: no remedy known
    assert CallReport(0, []).format().endswith("no module calls")
