"""The ``python -m fastmodule bench`` command line, run in a subprocess."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastmodule.bench import KINDS, case_names


# Timeouts only catch a hang: a loaded machine (the matrix's lanes side by side) takes
# several times an idle one's 2-3 minutes for the quick run.
def _bench(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastmodule", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_quick_json_has_every_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--quick", "--series", "--json", str(out)]
    plot = tmp_path / "bench.png"
    have_matplotlib = importlib.util.find_spec("matplotlib") is not None
    if have_matplotlib:
        args += ["--plot", str(plot)]
    proc = _bench(*args)
    assert proc.returncode == 0, proc.stderr
    if have_matplotlib:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text(encoding="utf-8"))
    series = data["series"]
    assert {p["operation"] for p in series} == {"state_dict", "load_state_dict"}
    assert all(p["fast_ms"] > 0 for p in series)
    assert data["meta"]["torch"] == torch.__version__
    assert data["meta"]["threads"] == 1
    results = {r["case"]: r for r in data["results"]}
    assert list(results) == case_names()
    for name, result in results.items():
        assert result["unit"] == "ns"
        for kind in KINDS:
            stats = result[kind]
            for key in ("median", "min", "max"):
                value = stats[key]
                assert isinstance(value, int | float) and math.isfinite(value), (name, kind, key)
                assert value > 0, (name, kind, key)
            assert stats["min"] <= stats["median"] <= stats["max"], (name, kind)
    # The table went to stdout, one row per case.
    for name in case_names():
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name
    # stderr holds the progress bar and nothing else (no library warnings or log lines).
    others = [
        line
        for line in re.split(r"[\r\n]+", proc.stderr)
        if line.strip() and not PROGRESS_LINE.match(line)
    ]
    assert others == []


#: One state of the progress bar on stderr.
PROGRESS_LINE = re.compile(r"^\[[#.]+\] ")


def test_help_is_plain_text() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "--help"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert "bench" in proc.stdout
    assert "``" not in proc.stdout


def test_only_runs_the_named_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _bench("--quick", "--only", "getattr_parameter", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [r["case"] for r in data["results"]] == ["getattr_parameter"]


def test_unknown_case_is_an_error() -> None:
    proc = _bench("--only", "nosuchcase", timeout=600)
    assert proc.returncode != 0
    assert "nosuchcase" in proc.stderr


def test_cuda_unavailable_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = _bench("--quick", "--device", "cuda", timeout=600)
    assert proc.returncode != 0
    assert "cuda" in proc.stderr.lower()


def test_callable_runs_every_line_of_a_statement() -> None:
    """pytest-benchmark's callable runs a multi-line statement whole, as timeit does."""
    import timeit

    from fastmodule.bench import Variant

    stmt = "log.append(1)\nfor i in (2, 3): log.append(i)\nlog.append(4)"
    log: list[int] = []
    Variant(stmt, {"log": log}).as_callable()()
    timed: list[int] = []
    timeit.Timer(stmt, globals={"log": timed}).timeit(1)
    assert log == timed == [1, 2, 3, 4]
