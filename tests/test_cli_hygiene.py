"""What every ``python -m fastmodule`` subcommand does besides its job (issue 29, item
7): a closed pipe ends it quietly, Ctrl-C prints one line and exits with 130, ``--json``
turns an error into a JSON object, ``run`` without a script shows its usage, and the
tools loaded on first use are in ``dir(fastmodule)``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fastmodule
from fastmodule import __main__ as cli
from tests.conftest import without_import_warning

ROOT = Path(__file__).resolve().parent.parent

PRINTER = "import sys\nfor i in range(100000):\n    print(i)\n"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("COLUMNS", None)
    return env


def test_every_subcommand_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # The reading end is closed before the command starts: its first write meets a
    # closed pipe, whatever the timing (as `... | head -c 1` does once head is done).
    printer = tmp_path / "printer.py"
    printer.write_text(PRINTER, encoding="utf-8")
    commands = {
        "audit": ["audit", "tests.audit_example:buggy"],
        "doctor": ["doctor"],
        "run": ["run", str(printer)],
        "check": ["check", "tests.audit_example:buggy", "--no-timing", "--no-compile"],
        "bench": ["bench", "--quick", "--only", "setattr_plain"],
    }
    procs = {}
    for name, argv in commands.items():
        read, write = os.pipe()
        os.close(read)
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "fastmodule", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=_env(),
        )
        os.close(write)
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert "Traceback" not in err and "BrokenPipeError" not in err, (name, err)
        assert "Exception ignored" not in err, (name, err)
        assert proc.returncode == cli.CLOSED_PIPE == 141, (name, proc.returncode, err)


def test_piped_into_head() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m fastmodule audit tests.audit_example:buggy | head -c 1",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
        timeout=600,
    )
    assert proc.stdout == "l" and without_import_warning(proc.stderr) == ""


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastmodule", "run", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        # A suite started in the background of a shell without job control inherits
        # SIGINT ignored, and so would the child (Python then installs no handler):
        # the child starts with the default, as a program run from a terminal does.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == cli.INTERRUPTED == 130
    assert without_import_warning(err) == "fastmodule run: interrupted\n"


def test_interrupt_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    for name in ("run_audit", "run_doctor", "run_bench", "run_check"):
        monkeypatch.setattr(cli, name, interrupted)
    for argv in (["audit", "x:y"], ["doctor", "--json"], ["bench"], ["check", "x:y"]):
        assert cli.main(argv) == 130
        out, err = capsys.readouterr()
        assert out == "" and err == f"fastmodule {argv[0]}: interrupted\n"


def test_json_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A factory that fails, a usage error, and a failure of the command itself: each a
    # JSON object on stdout with status 2, the human-readable text on stderr.
    assert cli.main(["audit", "tests.audit_example:broken", "--json"]) == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert list(data) == ["schema", "error", "exit_status"] and data["exit_status"] == 2
    assert "raised RuntimeError: no weights here" in data["error"]
    assert err.startswith("error: ") and "no weights here" in err

    with pytest.raises(SystemExit) as exited:
        cli.main(["doctor", "--json", "--bogus"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["error"] == "fastmodule: unrecognized arguments: --bogus"
    assert "usage:" in err

    def broken(args: object) -> int:
        raise RuntimeError("diagnostics unavailable")

    monkeypatch.setattr(cli, "run_doctor", broken)
    assert cli.main(["doctor", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "schema": 1,
        "error": "fastmodule doctor failed: RuntimeError: diagnostics unavailable",
        "exit_status": 2,
    }
    assert "Traceback" in err
    # Without --json: the traceback and the same message, status 2 (not 1, which
    # means "found something" for audit and "different" for check).
    assert cli.main(["doctor"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.rstrip().endswith("diagnostics unavailable")


def test_a_script_fails_as_under_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own exception, not turned into status 2 (run sets sys.argv and sys.path and
    # installs: all put back here).
    script = tmp_path / "fails.py"
    script.write_text("raise ValueError('from the script')\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        with pytest.raises(ValueError, match="from the script"):
            cli.main(["run", str(script)])
    finally:
        fastmodule.uninstall()


def test_run_without_a_script_shows_its_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: fastmodule run [-h] [--strict] [--strict-error] [--report]")
    assert "--strict-error" in err and "the script's arguments" in err
    assert "--report-json PATH" in err
    assert cli.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: fastmodule [-h] COMMAND")


def test_tools_are_in_dir() -> None:
    names = dir(fastmodule)
    for name in (
        "check",
        "audit",
        "strict",
        "strict_enabled",
        "StrictRegistrationInfo",
        "report",
        "reporting",
        "CallReport",
    ):
        assert name in names
        assert name in fastmodule.__all__
    assert names == sorted(names) and "accelerate" in names
