"""The CUDA check of fastmodule: every phase in order, each under its own timeout and
within one budget, then a summary, and a check of what was written.

run.sh (beside this file) makes the venv and installs the wheel, then runs

    python gpu_check.py run --out DIR [--device cuda|cpu] [--dry-run] [--installed]

Phases, in order (each a subprocess: a crash or a hang ends that phase only):

    env            interpreter, torch, CUDA and the device            env.json
    smoke          smoke_wheel.py: identical output, no torch frames  logs/smoke.log
    doctor         python -m fastmodule doctor --json                  doctor.json
    parity         parity.py: stock against fast on the device         parity.json
    bench-call     bench: module call, hooks, MLP                      bench-call.json
    bench-models   bench: GPT-2 forward and decode, BERT, ResNet, ViT  bench-models.json
    bench-decode   bench: b=1 GPT-2/Llama decode and generate          bench-decode.json
    bench-compile  bench --compile on the cases that offer it          bench-compile.json
    bench-roots    bench --quick: whole-tree methods of HF roots       bench-roots.json
    bench-steps    bench --quick: training steps phase by phase        bench-steps.json

then summary.json and summary.txt (also printed). Every phase's output is in
logs/PHASE.log. A bench group names its cases by pattern; a pattern that matches no case
of the installed fastmodule is noted, a group left with none is skipped. The dry run
(``--dry-run``, with ``--device cpu``) runs the same phases on the CPU, benches with
``--quick``, and requires every phase to have passed.

    python gpu_check.py verify --out DIR [--dry-run]

checks the structure of DIR (run's last step; exits 1 listing each problem).

Exit status of run: 0 all passed; 1 a parity mismatch, a failed phase or a structure
problem; 2 nothing failed but something did not finish in time or was skipped for time;
3 no CUDA device (a run without --dry-run).
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA = 1

#: The whole run's budget (seconds from run.sh's start), and what is kept back from it
#: for the summary.
BUDGET_S = 480
RESERVE_S = 10


@dataclass(frozen=True)
class Group:
    """A bench run: the cases its patterns match (in run order), its own time cap."""

    name: str
    patterns: tuple[str, ...]
    cap_s: int
    compile: bool = False
    #: Always ``--quick`` (cases that run on the CPU whatever ``--device`` says, last).
    quick: bool = False


BENCH_GROUPS: tuple[Group, ...] = (
    Group(
        "bench-call", ("call", "call_kwargs", "call_reassigned_buffer", "call_*hook*", "mlp64*"), 90
    ),
    Group("bench-models", ("gpt2_*", "bert_*", "resnet18_*", "vit_*"), 100),
    Group("bench-decode", ("step_*_decode", "step_*_generate"), 70),
    Group("bench-compile", ("mlp64_accelerated", "gpt2_forward"), 150, compile=True),
    Group("bench-roots", ("root_*",), 60, quick=True),
    Group("bench-steps", ("step_*",), 60, quick=True),
)

#: The note of a bench group skipped for want of cases (not a failure, not for time).
NO_CASES = "no case to run"

#: Cases a dry run compiles (Inductor on the CPU: the 64-layer MLP only, to stay quick).
DRY_COMPILE = ("mlp64_accelerated",)


@dataclass
class Phase:
    name: str
    argv: list[str]
    cap_s: int
    #: Where the phase's JSON goes (its stdout for ``doctor``), relative to the output folder.
    json: str | None = None
    stdout_json: bool = False
    #: Fewer seconds than this left: skipped.
    min_s: int = 15
    cases: list[str] = field(default_factory=list)
    note: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def list_cases(python: str) -> list[str]:
    """The bench cases of the installed fastmodule, in run order."""
    code = "import json; from fastmodule.bench import case_names; print(json.dumps(case_names()))"
    proc = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def resolve(
    groups: tuple[Group, ...], known: list[str], only: list[str] | None = None
) -> dict[str, tuple[list[str], list[str]]]:
    """Each group's cases (matching its patterns, not taken by an earlier group, except
    that bench-compile reruns cases to compile them) and its patterns that matched none.
    ``only``: keep just the cases matching one of these patterns as well."""
    taken: set[str] = set()
    out: dict[str, tuple[list[str], list[str]]] = {}
    for group in groups:
        chosen: dict[str, None] = {}
        unmatched = []
        for pattern in group.patterns:
            hits = [n for n in known if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                unmatched.append(pattern)
            chosen.update(dict.fromkeys(n for n in hits if group.compile or n not in taken))
        cases = [n for n in chosen if not only or any(fnmatch.fnmatchcase(n, p) for p in only)]
        if not group.compile:
            taken.update(cases)
        out[group.name] = (cases, unmatched)
    return out


def plan(args: argparse.Namespace, python: str, known: list[str]) -> list[Phase]:
    """The phases of this run, in order."""
    device = args.device
    out = Path(args.out)
    # Beside this file in the bundle; one folder up in the repository.
    smoke_py = HERE / "smoke_wheel.py"
    if not smoke_py.is_file():
        smoke_py = HERE.parent / "smoke_wheel.py"
    smoke = [python, str(smoke_py)] + (["--installed"] if args.installed else [])
    phases = [
        Phase(
            "env",
            [
                python,
                str(HERE / "gpu_check.py"),
                "env",
                "--out",
                str(out / "env.json"),
                "--device",
                device,
            ],
            60,
            json="env.json",
        ),
        Phase("smoke", smoke, 60),
        Phase(
            "doctor",
            [python, "-m", "fastmodule", "doctor", "--json"],
            60,
            json="doctor.json",
            stdout_json=True,
        ),
        Phase(
            "parity",
            [python, str(HERE / "parity.py"), "--device", device, "--out", str(out / "parity.json")]
            + [a for name in args.skip_check for a in ("--skip", name)],
            240,
            json="parity.json",
            # cuBLAS's reductions in a fixed order: the same bits on both sides.
            env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
        ),
    ]
    groups = resolve(BENCH_GROUPS, known, args.bench_only or None)
    for group in BENCH_GROUPS:
        cases, unmatched = groups[group.name]
        notes = []
        if args.dry_run and group.compile:
            cases = [c for c in cases if c in DRY_COMPILE]
            notes.append("dry run: compiles " + " ".join(DRY_COMPILE) + " only")
        argv = [
            python,
            "-m",
            "fastmodule",
            "bench",
            "--device",
            device,
            "--json",
            str(out / f"{group.name}.json"),
            "--compile" if group.compile else "--no-compile",
        ]
        if args.dry_run or group.quick:
            argv.append("--quick")
        if unmatched:
            notes.append("no case matches " + " ".join(unmatched))
        if not cases:
            notes.insert(0, NO_CASES)
        phase = Phase(
            group.name,
            argv + ["--only", *cases],
            group.cap_s,
            json=f"{group.name}.json",
            min_s=30,
            cases=cases,
        )
        phase.note = "; ".join(notes) or None
        phases.append(phase)
    wanted = set(args.phases.split(",")) if args.phases else None
    return [p for p in phases if wanted is None or p.name in wanted]


def run_phase(phase: Phase, out: Path, timeout: float) -> dict[str, Any]:
    """Run one phase in its own process group under ``timeout``; its record."""
    log_path = out / "logs" / f"{phase.name}.log"
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **phase.env)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(phase.argv) + "\n")
        log.flush()
        stdout = open(out / phase.json, "w", encoding="utf-8") if phase.stdout_json else log
        try:
            proc = subprocess.Popen(
                phase.argv, stdout=stdout, stderr=log, env=env, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=timeout)
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc, status = None, "timeout"
        finally:
            if stdout is not log:
                stdout.close()
    return {
        "name": phase.name,
        "status": status,
        "rc": rc,
        "seconds": round(time.monotonic() - start, 1),
        "timeout_s": round(timeout),
        "log": f"logs/{phase.name}.log",
        "json": phase.json,
        "cases": phase.cases,
        "note": phase.note,
    }


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the phase's process group (compile workers too), SIGKILL 10 s later."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def cmd_env(args: argparse.Namespace) -> int:
    """env.json: the interpreter, torch, CUDA and the device. Exit 3 when ``--device cuda``
    and no CUDA device is usable."""
    import torch

    import fastmodule

    info: dict[str, Any] = {
        "schema": SCHEMA,
        "python": platform.python_version(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "platform": platform.platform(),
        "glibc": "-".join(platform.libc_ver()),
        "torch": torch.__version__,
        "torch_file": torch.__file__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "fastmodule": fastmodule.__version__,
        "fastmodule_file": fastmodule.__file__,
        "device": args.device,
        "cpu_count": os.cpu_count(),
    }
    for package in ("transformers", "timm"):
        try:
            info[package] = __import__(package).__version__
        except ImportError:
            info[package] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["cuda_devices"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
        info["cuda_capability"] = f"{props.major}.{props.minor}"
        info["cuda_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cudnn"] = torch.backends.cudnn.version()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"] = f"not run: {e}"
    Path(args.out).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(info, indent=2))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False", file=sys.stderr)
        return 3
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = args.started if args.started is not None else time.time()
    deadline = started + args.budget_s
    python = sys.executable
    began = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        known = list_cases(python)
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"gpu-check: listing the bench cases failed: {e}", file=sys.stderr)
        known = []
    phases = plan(args, python, known)
    records: list[dict[str, Any]] = []
    stop_reason = None
    for phase in phases:
        left = deadline - time.time() - RESERVE_S
        timeout = min(phase.cap_s, left)
        if stop_reason or not phase.cases and phase.name.startswith("bench-"):
            reason = stop_reason or phase.note or NO_CASES
            records.append(_skipped(phase, reason))
        elif timeout < phase.min_s:
            records.append(_skipped(phase, f"skipped: {max(0, round(left))} s of the budget left"))
        else:
            print(f"gpu-check: {phase.name} (at most {round(timeout)} s) ...", flush=True)
            records.append(run_phase(phase, out, timeout))
        rec = records[-1]
        if phase.name == "env" and rec["status"] != "ok":
            no_cuda = rec["rc"] == 3
            if no_cuda:
                rec["note"] = "no CUDA device: torch.cuda.is_available() is False"
            stop_reason = ("no CUDA device" if no_cuda else "the env phase failed") + (
                ": nothing else run"
            )
        print(
            f"gpu-check: {phase.name:<14} {rec['status']:<8} {rec['seconds']:6.1f} s"
            + (f"  ({rec['note']})" if rec["note"] else ""),
            flush=True,
        )
    summary = summarise(out, args, records, began, started)
    (out / "summary.txt").write_text(format_summary(summary) + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    # What was written, checked; the verdict goes into both files.
    problems = verify(out, args.dry_run)
    summary["structure"] = problems
    text = format_summary(summary)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(text, flush=True)
    if records and records[0]["name"] == "env" and records[0]["rc"] == 3:
        return 3
    if problems or summary["failed"]:
        return 1
    return 2 if summary["incomplete"] else 0


def _skipped(phase: Phase, reason: str) -> dict[str, Any]:
    return {
        "name": phase.name,
        "status": "skipped",
        "rc": None,
        "seconds": 0.0,
        "timeout_s": None,
        "log": None,
        "json": phase.json,
        "cases": phase.cases,
        "note": reason,
    }


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def summarise(
    out: Path,
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    began: str,
    started: float,
) -> dict[str, Any]:
    """summary.json's content: the phases, the parity verdicts and the bench figures."""
    env = _load(out / "env.json") or {}
    doctor = _load(out / "doctor.json")
    parity = _load(out / "parity.json")
    off = None
    if isinstance(doctor, dict) and isinstance(doctor.get("paths"), list):
        off = [p["name"] for p in doctor["paths"] if not p.get("on")]
    checks = (parity or {}).get("checks", [])
    counts = {
        s: sum(c["status"] == s for c in checks) for s in ("pass", "fail", "error", "skipped")
    }
    bench = []
    for rec in records:
        if not rec["name"].startswith("bench-"):
            continue
        data = _load(out / rec["json"]) if rec["status"] == "ok" else None
        for r in (data or {}).get("results", []):
            bench.append(
                {
                    "group": rec["name"],
                    "case": r["case"],
                    "device": r["device"],
                    "stock_ns": r["stock"]["median"],
                    "fast_ns": r["fast"]["median"],
                    "lower_ns": r["lower"]["median"],
                    "speedup": r["speedup"],
                    "compiled_ns": (r.get("compiled") or {}).get("median"),
                    "compile_s": r.get("compile_s"),
                }
            )
    failed = [r["name"] for r in records if r["status"] == "failed"]
    incomplete = [
        r["name"]
        for r in records
        if r["status"] == "timeout"
        or (r["status"] == "skipped" and not (r["note"] or "").startswith(NO_CASES))
    ]
    return {
        "schema": SCHEMA,
        "dry_run": args.dry_run,
        "device": args.device,
        "cuda_device": (env.get("cuda_devices") or [None])[0],
        "began": began,
        "seconds": round(time.time() - started, 1),
        "budget_s": args.budget_s,
        "python": env.get("python"),
        "torch": env.get("torch"),
        "fastmodule": env.get("fastmodule"),
        "native_paths_off": off,
        "parity": {
            "counts": counts,
            "planned": len((parity or {}).get("planned", [])),
            "native": (parity or {}).get("native"),
            "not_passed": [c for c in checks if c["status"] != "pass"],
        },
        "phases": records,
        "bench": bench,
        "failed": failed
        + [f"parity:{c['name']}" for c in checks if c["status"] in ("fail", "error")],
        "incomplete": incomplete,
    }


def _time(ns: float | None) -> str:
    if ns is None:
        return ""
    return (
        f"{ns:.0f} ns" if ns < 1e3 else f"{ns / 1e3:.2f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"
    )


def format_summary(s: dict[str, Any]) -> str:
    """summary.txt: what ran where, each phase, the parity verdicts, the bench table."""
    device = s["cuda_device"] or s["device"]
    lines = [
        f"fastmodule gpu-check{' (dry run)' if s['dry_run'] else ''}  {s['began']}",
        f"device {device}  python {s['python']}  torch {s['torch']}  fastmodule {s['fastmodule']}",
        f"{s['seconds']:.0f} s of a {s['budget_s']} s budget",
    ]
    if s["native_paths_off"]:
        lines.append(
            "native paths OFF: "
            + ", ".join(s["native_paths_off"])
            + " (where off, fastmodule runs torch's code and measures as stock)"
        )
    lines += ["", "phase           status    seconds  note"]
    for r in s["phases"]:
        lines.append(f"{r['name']:<15} {r['status']:<8} {r['seconds']:8.1f}  {r['note'] or ''}")
    c = s["parity"]["counts"]
    lines += [
        "",
        f"parity: {c['pass']} passed, {c['fail']} failed, {c['error']} errors, "
        f"{c['skipped']} skipped ({sum(c.values())} of {s['parity']['planned']} checks run)",
    ]
    for check in s["parity"]["not_passed"]:
        lines.append(f"  {check['name']}: {check['status']}: {check['note'] or ''}")
        if check.get("detail"):
            lines += ["    " + d for d in check["detail"].splitlines()[:12]]
    if s["bench"]:
        lines += [
            "",
            f"{'case':<28} {'device':<7} {'stock':>10} {'fast':>10} {'lower':>10} "
            f"{'speedup':>8} {'compiled':>10}",
        ]
        for b in s["bench"]:
            speedup = f"{b['speedup']:.2f}x" if b["speedup"] else "n/a"
            lines.append(
                f"{b['case']:<28} {b['device']:<7} {_time(b['stock_ns']):>10} "
                f"{_time(b['fast_ns']):>10} {_time(b['lower_ns']):>10} {speedup:>8} "
                f"{_time(b['compiled_ns']):>10}"
            )
    structure = s.get("structure")
    if structure:
        lines += ["", "structure problems (gpu_check.py verify):"] + [f"  {p}" for p in structure]
    elif structure is not None:
        lines += [
            "",
            "structure: ok (gpu_check.py verify" + (" --dry-run)" if s["dry_run"] else ")"),
        ]
    failed = s["failed"] + (["structure"] if structure else [])
    verdict = (
        "FAILED: " + ", ".join(failed)
        if failed
        else "INCOMPLETE: " + ", ".join(s["incomplete"])
        if s["incomplete"]
        else "all passed"
    )
    lines += ["", f"gpu-check: {verdict}"]
    return "\n".join(lines)


def verify(out: Path, dry_run: bool) -> list[str]:
    """What is wrong with the structure of ``out`` (empty: nothing). A dry run must
    have run every phase it planned, to the end."""
    problems: list[str] = []
    summary_path = out / "summary.json"
    summary = _load(summary_path)
    if not isinstance(summary, dict):
        return [f"{summary_path} is missing or not JSON"]
    for key in ("schema", "dry_run", "device", "phases", "parity", "bench", "failed"):
        if key not in summary:
            problems.append(f"summary.json has no {key!r}")
    if problems:
        return problems
    if not (out / "summary.txt").is_file():
        problems.append("summary.txt is missing")
    phases = summary["phases"]
    names = [p["name"] for p in phases]
    if names[:1] != ["env"]:
        problems.append(f"the first phase is not env: {names}")
    device = summary["device"]
    for p in phases:
        if p["status"] not in ("ok", "failed", "timeout", "skipped"):
            problems.append(f"{p['name']}: unknown status {p['status']!r}")
        if p["status"] != "skipped" and not (out / p["log"]).is_file():
            problems.append(f"{p['name']}: its log {p['log']} is missing")
        if (
            dry_run
            and p["status"] != "ok"
            and not (p["status"] == "skipped" and (p["note"] or "").startswith(NO_CASES))
        ):
            problems.append(f"{p['name']}: {p['status']} in a dry run ({p['note'] or p['rc']})")
        if p["status"] == "ok" and p["json"]:
            problems += _verify_json(out, p, device)
    return problems


def _verify_json(out: Path, phase: dict[str, Any], device: str) -> list[str]:
    path = out / phase["json"]
    data = _load(path)
    name = phase["name"]
    if not isinstance(data, dict):
        return [f"{name}: {phase['json']} is missing or not JSON"]
    if name == "env":
        missing = {"python", "torch", "fastmodule", "cuda_available"} - set(data)
        return [f"env.json lacks {sorted(missing)}"] if missing else []
    if name == "doctor":
        return [] if isinstance(data.get("paths"), list) else ["doctor.json has no paths list"]
    if name == "parity":
        got = [c.get("name") for c in data.get("checks", [])]
        planned = data.get("planned")
        problems = [] if planned and got == planned else [f"parity.json: ran {got} of {planned}"]
        for c in data.get("checks", []):
            if c.get("status") not in ("pass", "skipped"):
                problems.append(f"parity.json: {c.get('name')} {c.get('status')}")
            if c.get("status") == "skipped" and not c.get("note"):
                problems.append(f"parity.json: {c.get('name')} skipped without a note")
            if c.get("status") == "pass" and not c.get("comparisons"):
                problems.append(f"parity.json: {c.get('name')} passed comparing nothing")
        if not device.startswith("cuda"):
            stand_ins = [
                c
                for c in data.get("checks", [])
                if c.get("name", "").startswith(("cuda_", "make_graphed")) and not c.get("note")
            ]
            problems += [f"parity.json: {c['name']} on cpu without a note" for c in stand_ins]
        return problems
    results = data.get("results")
    if not isinstance(results, list) or not isinstance(data.get("meta"), dict):
        return [f"{phase['json']} has no meta or results"]
    problems = []
    got = [r.get("case") for r in results]
    if got != phase["cases"]:
        problems.append(f"{phase['json']}: cases {got} != planned {phase['cases']}")
    if data["meta"].get("device") != device:
        problems.append(f"{phase['json']}: device {data['meta'].get('device')} != {device}")
    for r in results:
        for kind in ("stock", "fast", "lower"):
            median = (r.get(kind) or {}).get("median")
            if not isinstance(median, int | float) or median <= 0:
                problems.append(f"{phase['json']}: {r.get('case')} {kind} median {median!r}")
        if not str(r.get("device", "")).startswith(("cpu", "cuda")):
            problems.append(f"{phase['json']}: {r.get('case')} device {r.get('device')!r}")
        if phase["name"] == "bench-compile" and "compiled" not in r:
            problems.append(f"{phase['json']}: {r.get('case')} has no compiled timing")
    return problems


def cmd_verify(args: argparse.Namespace) -> int:
    problems = verify(Path(args.out), args.dry_run)
    for p in problems:
        print(f"gpu-check: structure: {p}", file=sys.stderr)
    print(
        f"gpu-check: {args.out}: "
        + ("structure ok" if not problems else f"{len(problems)} problems")
    )
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="every phase, the summary, the structure check")
    run.add_argument("--out", required=True, help="the output folder")
    run.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    run.add_argument(
        "--dry-run", action="store_true", help="on the CPU, bench --quick, every phase must pass"
    )
    run.add_argument(
        "--installed",
        action="store_true",
        help="fastmodule must come from this venv (smoke_wheel.py --installed)",
    )
    run.add_argument("--started", type=float, help="epoch seconds the budget counts from")
    run.add_argument("--budget-s", type=int, default=BUDGET_S)
    run.add_argument("--phases", help="comma-separated phases to run (default: all)")
    run.add_argument(
        "--bench-only",
        nargs="*",
        metavar="PATTERN",
        help="bench only the cases of each group that also match these",
    )
    run.add_argument(
        "--skip-check",
        action="append",
        default=[],
        metavar="NAME",
        help="a parity check not to run (recorded as skipped)",
    )
    env = sub.add_parser("env", help="write env.json")
    env.add_argument("--out", required=True)
    env.add_argument("--device", default="cuda")
    verify_ = sub.add_parser("verify", help="check an output folder's structure")
    verify_.add_argument("--out", required=True)
    verify_.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run" and args.dry_run and args.device != "cpu":
        parser.error("--dry-run runs on the CPU: --device cpu")
    return {"run": cmd_run, "env": cmd_env, "verify": cmd_verify}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
