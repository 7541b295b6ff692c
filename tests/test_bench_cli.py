"""The ``python -m fastmodule bench`` command line, run in a subprocess."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule.bench import KINDS, case_names, default_case_names, get_case, select_cases
from tests.conftest import without_import_warning


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
    assert list(results) == default_case_names()
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
    for name in default_case_names():
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name
    # stderr holds the progress bar and nothing else (no library warnings or log lines).
    others = [
        line
        for line in re.split(r"[\r\n]+", without_import_warning(proc.stderr))
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


#: The opt-in groups: whole-tree methods on HF roots, a training step phase by phase.
USER_GROUPS = ("root_", "step_")


def _user_cases() -> list[str]:
    return [n for n in case_names() if n.startswith(USER_GROUPS)]


def test_user_groups_are_opt_in() -> None:
    """A plain run leaves the root_*/step_* groups out; --only patterns select them."""
    defaults = default_case_names()
    assert not [n for n in defaults if n.startswith(USER_GROUPS)]
    assert [n for n in case_names() if n not in _user_cases()] == defaults
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    ops = ["named_parameters", "state_dict", "load_state_dict", "zero_grad", "to_noop", "train"]
    for model in ("gpt2", "llama", "bert"):
        assert select_cases([f"root_{model}_*"]) == [f"root_{model}_{op}" for op in ops]
    phases = ["forward", "backward", "clip", "optimizer", "zero_grad", "total"]
    assert select_cases(["step_gpt2_*"]) == [f"step_gpt2_{p}" for p in phases] + [
        "step_gpt2_decode",
        "step_gpt2_generate",
    ]
    # Names and patterns mixed, in the order given, each case once.
    assert select_cases(["call", "root_bert_train", "root_bert_tr*"]) == [
        "call",
        "root_bert_train",
    ]
    with pytest.raises(KeyError):
        select_cases(["root_nosuchmodel_*"])


def test_user_cases_build_and_run_once() -> None:
    """Every root_*/step_* case builds its three variants (each checked and run once
    there), and leaves no class accelerated and nn.Module.__call__ as it was."""
    names = _user_cases()
    if not names:
        pytest.skip("transformers and timm are not installed")
    call = nn.Module.__dict__["__call__"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI runs them (two threads on a busy machine crawl)
    try:
        for name in names:
            case = get_case(name)
            assert not case.default, name
            variants = case.build(torch.device("cpu"))
            assert set(variants) == set(KINDS), name
            for variant in variants.values():
                model = variant.namespace.get("m")
                if isinstance(model, nn.Module):
                    assert not any(fastmodule.is_accelerated(m) for m in model.modules()), name
            assert nn.Module.__dict__["__call__"] is call, name
    finally:
        torch.set_num_threads(threads)


def test_only_pattern_runs_the_group(tmp_path: Path) -> None:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    out = tmp_path / "bench.json"
    proc = _bench("--quick", "--only", "root_gpt2_*", "step_mlp_total", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    expected = select_cases(["root_gpt2_*", "step_mlp_total"])
    assert [r["case"] for r in data["results"]] == expected
    for result in data["results"]:
        for kind in KINDS:
            assert result[kind]["median"] > 0, (result["case"], kind)
    assert "root_*: lower bound" in proc.stdout
    assert "step_*: lower bound" in proc.stdout
    others = [
        line
        for line in re.split(r"[\r\n]+", without_import_warning(proc.stderr))
        if line.strip() and not PROGRESS_LINE.match(line)
    ]
    assert others == []


def test_workload_group_is_selected_by_its_pattern() -> None:
    """--only 'workload_*' selects exactly the workload group, in run order; a plain run
    includes it (it fits the default run's time)."""
    from fastmodule.bench.workloads import TIMM_MODELS, WORKLOAD_CASES

    names = [c.name for c in WORKLOAD_CASES]
    assert select_cases(["workload_*"]) == names
    assert [n for n in case_names() if n.startswith("workload_")] == names
    defaults = default_case_names()
    assert all(n in defaults for n in names)
    expected = {
        "workload_sb3_predict",
        "workload_cleanrl_agent",
        "workload_ode_rk4_accelerate",
        "workload_ode_rk4_install",
        "workload_pinn_inference",
        "workload_pinn_train_step",
    }
    if importlib.util.find_spec("timm") is not None:
        expected |= {f"workload_timm_{m}" for m in TIMM_MODELS}
    if importlib.util.find_spec("transformers") is not None:
        expected.add("workload_sentence_encoder")
    assert set(names) == expected


def test_workload_cases_build_and_run_once() -> None:
    """Every workload_* case builds at a small scale: its build runs the program stock,
    fast and lower and raises unless the results are bitwise equal, then runs each
    variant once. It leaves no class accelerated, install() undone and
    nn.Module.__call__ as it was."""
    from fastmodule.bench.case import set_scale

    call = nn.Module.__dict__["__call__"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    set_scale(0.1)
    try:
        for name in select_cases(["workload_*"]):
            case = get_case(name)
            variants = case.build(torch.device("cpu"))
            assert set(variants) == set(KINDS), name
            assert nn.Module.__dict__["__call__"] is call, name
            assert not fastmodule.installed(), name
            for variant in variants.values():
                for value in variant.namespace.values():
                    owner = getattr(value, "__self__", None)
                    if isinstance(owner, nn.Module):
                        assert not any(fastmodule.is_accelerated(m) for m in owner.modules())
    finally:
        set_scale(1.0)
        torch.set_num_threads(threads)


def test_workload_check_catches_a_difference() -> None:
    """The build-time check compares bitwise, through nested results."""
    import numpy as np

    from fastmodule.bench.workloads import _check

    a = [torch.ones(3), (np.zeros(2, dtype=np.float32), 1.0)]
    _check("same", a, copy.deepcopy(a), copy.deepcopy(a))
    b = copy.deepcopy(a)
    b[0][1] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    with pytest.raises(RuntimeError, match="stock and fast"):
        _check("differs", a, b, a)
    c = copy.deepcopy(a)
    c[1][0][0] = 1e-30
    with pytest.raises(RuntimeError, match="lower-bound"):
        _check("differs", a, a, c)
    with pytest.raises(RuntimeError, match="stock and fast"):
        _check("dtype", [torch.ones(3)], [torch.ones(3, dtype=torch.float64)], [torch.ones(3)])


def test_only_workload_pattern_runs_and_notes_the_lower_bound(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _bench("--quick", "--only", "workload_pinn_*", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [r["case"] for r in data["results"]] == select_cases(["workload_pinn_*"])
    assert "workload_*: the whole program timed" in proc.stdout
