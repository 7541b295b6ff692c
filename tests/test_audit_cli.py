"""``python -m fastmodule audit FACTORY``: exit status 0/1/2, text and JSON (schema 1),
and the factory loader it shares with later commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fastmodule.__main__ import AUDIT_FOUND, build_parser, main
from fastmodule.cli.factory import FactoryError, load_factory, parse_spec
from fastmodule.tools.audit import KINDS, SCHEMA, SEVERITIES
from tests.audit_example import FixedNet

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = str(ROOT / "tests" / "audit_example.py")


@pytest.fixture(autouse=True)
def unwrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """One line per finding (COLUMNS would wrap the text)."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["audit", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_exit_status_1_on_errors(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "tests.audit_example:buggy")
    assert status == AUDIT_FOUND == 1 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["layers", "Net", "FM001", "error"]
    assert "-> use nn.ModuleList" in lines[0]
    assert lines[1].split()[:4] == ["mask", "Net", "FM005", "warning"]
    assert lines[-1].endswith("1 error, 1 warning, 0 info")


def test_exit_status_0_when_clean(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, f"{EXAMPLE}:fixed")
    assert status == 0
    assert out.strip() == (
        "FixedNet: 6 modules, 8 parameters (833 elements), 1 buffer audited: no findings"
    )


def test_fail_on_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.audit_example:buggy", "--show", "error")
    assert status == 1
    assert [line.split()[2] for line in out.splitlines()[:-2]] == ["FM001"]
    assert out.splitlines()[-1].endswith("(1 below error not shown)")
    assert run(capsys, "tests.audit_example:buggy", "--fail-on", "info")[0] == 1
    assert run(capsys, "tests.audit_example:INSTANCE", "--fail-on", "info")[0] == 0


def test_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.audit_example:buggy", "--json")
    assert status == 1
    data = json.loads(out)
    assert data["schema"] == SCHEMA == 1
    assert data["model"] == "Net"
    fields = ["code", "severity", "path", "attribute", "class", "message", "why", "fix"]
    for f in data["findings"]:
        assert list(f) == [*fields, "file", "line"]
        assert all(isinstance(f[k], str) for k in fields)
        assert f["severity"] == KINDS[f["code"]].severity
    # Where the source was found: the assignments in tests/audit_example.py.
    assert [(f["file"], f["line"]) for f in data["findings"]] == [(EXAMPLE, 15), (EXAMPLE, 16)]
    assert [(f["code"], f["path"], f["attribute"]) for f in data["findings"]] == [
        ("FM001", "", "layers"),
        ("FM005", "", "mask"),
    ]
    assert data["summary"] == {
        "modules": 2,
        "parameters": 2,
        "parameter_elements": 17,
        "buffers": 0,
        "error": 1,
        "warning": 1,
        "info": 0,
        "suppressed": 0,
    }
    assert set(SEVERITIES) <= set(data["summary"])


BAD_SPECS = {
    "tests.audit_example": "expected pkg.module:factory",
    "tests.audit_example:": "expected pkg.module:factory",
    "tests.audit_example:not-a-name": "is not a Python name",
    "no_such_package_xyz.models:make": "no module named 'no_such_package_xyz'",
    "tests.audit_example:missing": "has no attribute 'missing' (it has: ",
    "tests.audit_example:broken": "raised RuntimeError: no weights here (at ",
    "tests.audit_example:not_a_model": "returned int: expected a torch.nn.Module",
    "tests.audit_example:__doc__": "is a str, not a callable",
    "no/such/file.py:make": "no such file: no/such/file.py",
}


@pytest.mark.parametrize(("spec", "says"), BAD_SPECS.items(), ids=list(BAD_SPECS))
def test_exit_status_2_says_what_to_do(
    capsys: pytest.CaptureFixture[str], spec: str, says: str
) -> None:
    status, out, err = run(capsys, spec)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and says in err, err
    with pytest.raises(FactoryError, match="."):
        load_factory(spec)


def test_loader_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_spec("C:/models/net.py:make") == ("C:/models/net.py", "make")
    loaded = load_factory(f"{EXAMPLE}:buggy")
    assert type(loaded.model).__name__ == "Net" and tuple(loaded.example_inputs.shape) == (8, 16)
    assert loaded.spec == f"{EXAMPLE}:buggy"
    assert load_factory("tests.audit_example:fixed").example_inputs is None
    assert isinstance(load_factory("tests.audit_example:INSTANCE").model, FixedNet)
    # A file imports its neighbours (its directory is first on the path while it runs),
    # and a dotted name reaches into the module.
    (tmp_path / "helper_for_audit_test.py").write_text("WIDTH = 3\n")
    (tmp_path / "model_file.py").write_text(
        "import torch\nfrom helper_for_audit_test import WIDTH\n"
        "class Make:\n    @staticmethod\n    def small():\n"
        "        return torch.nn.Linear(WIDTH, 1)\n"
    )
    monkeypatch.delitem(sys.modules, "helper_for_audit_test", raising=False)
    before = list(sys.path)
    model = load_factory(f"{tmp_path / 'model_file.py'}:Make.small").model
    assert model.in_features == 3
    assert sys.path == before
    sys.modules.pop("helper_for_audit_test", None)


def test_help_is_plain_text() -> None:
    parser = build_parser()
    texts = [parser.format_help()]
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    texts += [p.format_help() for p in sub.choices.values()]
    for text in texts:
        assert "``" not in text and ":func:" not in text and ":data:" not in text


def subprocess_audit(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "fastmodule", "audit", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_command_line_end_to_end(tmp_path: Path) -> None:
    # From the project root a module spec imports (the current directory is on the path).
    proc = subprocess_audit("tests.audit_example:buggy", "--json")
    assert proc.returncode == 1, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert [f["code"] for f in data["findings"]] == ["FM001", "FM005"]
    # From elsewhere a file spec works.
    proc = subprocess_audit(f"{EXAMPLE}:fixed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("no findings")
