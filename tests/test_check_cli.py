"""``python -m fastmodule check FACTORY``: exit statuses 0/1/2/3, --input shapes, JSON
(schema 1), errors (the model's, the options') as exit 2 and as JSON, Ctrl-C."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fastmodule.__main__ import main
from fastmodule.cli.inputs import InputError, parse_input
from fastmodule.tools.check.report import SCHEMA
from tests.check_models import DIFFERS_WHEN_ACCELERATED


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["check", *argv])
    out, err = capsys.readouterr()
    return status, out, err


FAST = ("--no-timing",)


def test_identical_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:small", *FAST)
    assert status == 0
    assert out.splitlines()[1].startswith("parity       identical")


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_different_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:differs", *FAST)
    assert status == 1
    assert "DIFFERENT from stock" in out and "output: 8 of 8 values differ" in out


def test_nondeterministic_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:nondeterministic", *FAST)
    assert status == 3
    assert "NOT CHECKED" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tests.check_models:nosuch"], "nosuch"),
        (["tests.check_models:without_inputs"], "--input SHAPE"),
        (["tests.check_models:small", "--input", "4xeight"], "SHAPE[:DTYPE]"),
        (["tests.check_models:small", "--dtype", "float77"], "unknown dtype"),
        (["tests.check_models:small", "--device", "nosuchdevice"], "--device"),
        (["tests.check_models:small", "--dtype", "int64"], "not a floating-point dtype"),
        (["tests.check_models:small", "--repeats", "-3"], "--repeats must be at least 1"),
        (["tests.check_models:small", "--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run(capsys, *argv, *FAST)
    assert status == 2 and out == ""
    assert message in err


def test_input_shapes_replace_the_factorys(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:without_inputs", "--input", "3x8", *FAST)
    assert status == 0
    assert "inputs 3x8 float32" in out.splitlines()[0]


def test_parse_input() -> None:
    g = torch.Generator().manual_seed(0)
    ids = parse_input("2x5:int64", g)
    assert ids.dtype == torch.int64 and ids.shape == (2, 5) and int(ids.max()) < 16
    x = parse_input("1x3x4x4:bfloat16", g)
    assert x.dtype == torch.bfloat16 and x.shape == (1, 3, 4, 4)
    with pytest.raises(InputError):
        parse_input("1x-2", g)


def test_dtype_converts_model_and_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:small", "--dtype", "float64", *FAST)
    assert status == 0
    assert "4x8 float64" in out


def test_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "tests.check_models:small", "--json", "--repeats", "2", "--no-compile"
    )
    assert status == 0
    data = json.loads(out)
    assert data["schema"] == SCHEMA == 1
    assert set(data) == {
        "schema",
        "model",
        "method",
        "inputs",
        "mode",
        "device",
        "threads",
        "parity",
        "module_calls",
        "native_calls",
        "handovers",
        "timings",
        "speedup",
        "compiled_speedup",
        "notes",
        "exit_status",
    }
    assert data["parity"]["identical"] is True and data["exit_status"] == 0
    assert set(data["parity"]) == {
        "identical",
        "nondeterministic",
        "differences",
        "stock_differences",
        "compared",
        "not_compared",
        "diverged",
        "raised",
    }
    assert data["threads"] == 1 and data["parity"]["diverged"] is None
    assert data["method"] is None  # the model itself was called (its forward)
    timings = data["timings"]
    assert timings["repeats"] == 2 and timings["compiled"] is None
    assert set(timings["stock"]) == {"median", "min", "max"}
    assert data["speedup"] > 0 and data["compiled_speedup"] is None


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_subprocess_end_to_end() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "check", "tests.check_models:differs", "--no-timing"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr
    assert "DIFFERENT from stock" in proc.stdout


@pytest.mark.parametrize(
    ("factory", "package"), [("gpt2", "transformers"), ("llama", "transformers"), ("lora", "peft")]
)
def test_hf_models_identical_exit_0(
    capsys: pytest.CaptureFixture[str], factory: str, package: str
) -> None:
    pytest.importorskip(package)
    status, out, _ = run(capsys, f"tests.check_models:{factory}", *FAST)
    assert status == 0, out
    assert out.splitlines()[1].startswith("parity       identical")


def test_model_rejecting_the_inputs_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "tests.check_models:rejects", *FAST)
    assert status == 2 and out == ""
    assert "first stock run" in err and "RuntimeError: " in err
    assert "mat1 and mat2 shapes cannot be multiplied" in err
    assert "Traceback" not in err


def test_errors_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:rejects", "--json", *FAST)
    data = json.loads(out)
    assert status == 2 and data["exit_status"] == 2 and data["schema"] == SCHEMA
    assert "mat1 and mat2" in data["error"]
    assert data["raised"]["run"] == "first stock run"
    assert data["raised"]["type"] == "RuntimeError"
    # The innermost frame outside torch: Small.forward's line.
    assert "check_models.py:" in data["raised"]["where"]
    status, out, _ = run(capsys, "tests.check_models:small", "--json", "--repeats", "-3")
    assert status == 2
    assert json.loads(out) == {
        "schema": SCHEMA,
        "error": "--repeats must be at least 1, got -3",
        "raised": None,
        "exit_status": 2,
    }
    status, out, _ = run(capsys, "tests.check_models:nosuch", "--json")
    assert status == 2 and "nosuch" in json.loads(out)["error"]


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_raising_when_accelerated_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:raises_accelerated", *FAST)
    assert status == 1
    assert "the stock run returned; the accelerated run raised ValueError" in out
    assert "diverges at  1.1 (RaisesAccelerated)" in out


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_where_it_diverges_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:shift", "--json", *FAST)
    assert status == 1
    diverged = json.loads(out)["parity"]["diverged"]
    assert diverged == {
        "module": "1.1",
        "cls": "Shift",
        "call": 1,
        "differences": ["output: 8 of 8 values differ (max abs difference 1)"],
        "note": None,
    }


def test_quick_start_model_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "tests.check_models:quick_start", *FAST)
    assert status == 0, out


def test_ctrl_c_one_line_exit_130(capsys: pytest.CaptureFixture[str]) -> None:
    # KeyboardInterrupt raised in the model's forward, as Ctrl-C raises it there.
    status, out, err = run(capsys, "tests.check_models:interrupted", *FAST)
    assert status == 130 and out == ""
    # One line, after the progress lines (stderr is not a terminal here).
    said = [line for line in err.splitlines() if not line.startswith("[")]
    assert len(said) == 1 and "interrupted" in said[0], err
