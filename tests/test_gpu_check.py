"""The CUDA check's logic (scripts/gpu_check, carried by ``make gpu-check``), here on the
CPU against the installed fastmodule, no wheel built: its orchestrator runs the phases up
to the first bench group, writes the same files as on a CUDA device, and its structure
check accepts them and rejects what is missing. ``make gpu-check-dry`` runs all of it,
from the wheel, through run.sh."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from fastmodule.bench import case_names, get_case
from fastmodule.module import NATIVE

HERE = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check"
SCRIPT = HERE / "gpu_check.py"
PHASES = ["env", "smoke", "doctor", "parity", "bench-call"]
#: Why the tests of a whole run need the native paths: the bundle's smoke and doctor
#: phases fail by design where they are off (they check the wheel runs natively there).
SMOKE_AND_DOCTOR = "the run's smoke and doctor phases check that the native paths are on"


def _orchestrator() -> ModuleType:
    """gpu_check.py as a module (it imports neither torch nor fastmodule)."""
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # Timeouts only catch a hang (the phases keep their own).
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One CPU run of the first phases: its output folder and what it printed."""
    out = tmp_path_factory.mktemp("gpu-check")
    proc = _run(
        "run",
        "--device",
        "cpu",
        "--dry-run",
        "--out",
        str(out),
        "--phases",
        ",".join(PHASES),
        "--bench-only",
        "call",
        "call_forward_hook",
        # Inductor on 2 cores: the dry run compiles; the suite does not wait for it.
        "--skip-check",
        "compile_reduce_overhead",
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, proc.stdout


@pytest.mark.requires_native(SMOKE_AND_DOCTOR)
def test_cpu_run_writes_every_file(cpu_run: tuple[Path, str]) -> None:
    out, printed = cpu_run
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["dry_run"] is True and summary["device"] == "cpu"
    assert [p["name"] for p in summary["phases"]] == PHASES
    assert all(p["status"] == "ok" for p in summary["phases"])
    assert summary["structure"] == [] and summary["failed"] == [] and summary["incomplete"] == []
    for name in ("env.json", "doctor.json", "parity.json", "bench-call.json", "summary.txt"):
        assert (out / name).is_file(), name
    for phase in PHASES:
        assert (out / "logs" / f"{phase}.log").is_file(), phase
    assert "smoke ok: identical output" in (out / "logs" / "smoke.log").read_text(encoding="utf-8")
    assert "gpu-check: all passed" in printed
    assert [b["case"] for b in summary["bench"]] == ["call", "call_forward_hook"]
    assert {b["device"] for b in summary["bench"]} == {"cpu"}


@pytest.mark.requires_native(SMOKE_AND_DOCTOR)
def test_cpu_run_parity_verdicts(cpu_run: tuple[Path, str]) -> None:
    parity = json.loads((cpu_run[0] / "parity.json").read_text(encoding="utf-8"))
    checks = {c["name"]: c for c in parity["checks"]}
    assert list(checks) == parity["planned"]
    assert checks["compile_reduce_overhead"]["status"] == "skipped"
    # Without a CUDA device: skipped or replaced by a CPU equivalent, each saying so.
    assert checks["make_graphed_callables"]["status"] == "skipped"
    for name in ("cuda_methods", "cuda_graph_inference", "cuda_graph_training", "to"):
        assert checks[name]["note"], name
    passed = [c for c in checks.values() if c["status"] == "pass"]
    assert len(passed) == len(checks) - 2
    assert all(c["comparisons"] > 0 for c in passed)
    # Where native paths are on, the fast side really ran them.
    assert all(parity["native"].values()) or not NATIVE, parity["native"]


@pytest.mark.requires_native(SMOKE_AND_DOCTOR)
def test_verify_rejects_what_is_missing_or_failed(
    cpu_run: tuple[Path, str], tmp_path: Path
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(cpu_run[0], out)
    assert _run("verify", "--out", str(out), "--dry-run").returncode == 0
    (out / "bench-call.json").unlink()
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    summary["phases"][3]["status"] = "timeout"
    summary_path.write_text(json.dumps(summary), encoding="utf-8")
    proc = _run("verify", "--out", str(out), "--dry-run")
    assert proc.returncode == 1
    assert "bench-call: bench-call.json is missing or not JSON" in proc.stderr
    assert "parity: timeout in a dry run" in proc.stderr


def test_bench_groups_name_existing_cases() -> None:
    gpu_check = _orchestrator()
    known = case_names()
    groups = gpu_check.resolve(gpu_check.BENCH_GROUPS, known)
    assert {"call", "call_forward_hook", "mlp64", "mlp64_accelerated"} <= set(
        groups["bench-call"][0]
    )
    measured = [c for g, (cases, _) in groups.items() if g != "bench-compile" for c in cases]
    assert len(measured) == len(set(measured)), "a case in two groups"
    for name in groups["bench-compile"][0] + list(gpu_check.DRY_COMPILE):
        assert name in known
    if importlib.util.find_spec("transformers") is not None:
        assert "gpt2_decode" in groups["bench-models"][0]
        assert groups["bench-models"][1] == []
    # Cases that honour --device are all measured on the CUDA device.
    on_device = {n for n in known if get_case(n).uses_device}
    assert on_device <= set(measured)


def test_parity_catches_a_difference() -> None:
    """A fast model one value away from the stock one fails the comparison."""
    code = textwrap.dedent(
        """
        import sys, torch
        sys.path.insert(0, sys.argv[1])
        import parity

        def off_by_one_ulp():
            model = parity._seeded(parity._mlp)()
            with torch.no_grad():
                w = model[0].weight
                w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(2.0))
            return model

        def op(m):
            return {"out": m(*good.inputs(ctx.device, 1)), "state": parity.snapshot(m)}

        good = parity.zoo()[0]
        bad = parity.Zoo("mlp", good.stock, off_by_one_ulp, good.inputs)
        ctx = parity.Ctx(torch.device("cpu"), torch.device("cpu"))
        parity.compare(ctx, "call", op, [good])
        try:
            parity.compare(ctx, "call", op, [bad])
        except parity.Mismatch as e:
            print("MISMATCH", e)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(HERE)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "MISMATCH call [mlp] ok.state.parameters.0.weight.values: values differ (max abs diff"
        in proc.stdout
    )
