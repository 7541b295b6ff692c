"""Command line: ``python -m fastmodule bench [--quick] [--only NAME ...] ...``,
``python -m fastmodule run script.py [args ...]``,
``python -m fastmodule doctor [--json]``,
``python -m fastmodule audit pkg.module:factory [--json]`` and
``python -m fastmodule check pkg.module:factory [--input 1x3x224x224] [--train] [--json]``."""

from __future__ import annotations

import argparse
import dataclasses
import sys

#: The top-level --help text (plain: argparse prints it as is).
DESCRIPTION = (
    "fastmodule: torch.nn.Module with its hot paths in Rust. Commands: bench (time it "
    "against stock torch), run (a script with every module class accelerated), doctor "
    "(which native paths are on), audit (what a model silently does not register), "
    "check (a model stock against accelerated: exact parity and speed)."
)
#: ``doctor``'s exit status when some native path is off (torch's code runs for it).
DOCTOR_PATH_OFF = 3
#: ``audit``'s exit status when it found something at the ``--fail-on`` severity or worse.
AUDIT_FOUND = 1


def build_parser() -> argparse.ArgumentParser:
    """The ``fastmodule`` argument parser (subcommands ``bench``, ``run``, ``doctor``,
    ``audit``)."""
    parser = argparse.ArgumentParser(prog="fastmodule", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser(
        "bench",
        help="time fastmodule.Module against stock torch.nn.Module",
        description="Time module call, attribute reads and registration on stock "
        "torch.nn.Module, fastmodule.Module and a lower bound without module machinery.",
    )
    bench.add_argument("--quick", action="store_true", help="fewer repeats, shorter loops")
    bench.add_argument(
        "--only", nargs="+", action="extend", metavar="NAME", help="run only these cases"
    )
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    bench.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="for the MLP and real-model cases (default: cpu)",
    )
    bench.add_argument("--plot", metavar="PATH.png", help="also draw the speedups (matplotlib)")
    bench.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time torch.compile where a case offers it, compile time shown apart "
        "(default: on, off with --quick)",
    )
    bench.add_argument(
        "--series",
        action="store_true",
        help="also time state_dict/load_state_dict over growing trees",
    )
    run = sub.add_parser(
        "run",
        help="run a Python script with every torch.nn.Module class accelerated",
        description="Call fastmodule.install(), then run SCRIPT as __main__ with ARGS.",
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="warn at each assignment of an unregistered module, parameter or tensor to "
        "a module attribute (fastmodule.strict())",
    )
    run.add_argument(
        "--strict-error",
        action="store_true",
        help="like --strict, but raise StrictRegistrationError there",
    )
    run.add_argument("script", help="path of the Python script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    doctor = sub.add_parser(
        "doctor",
        help="list which native paths are on for this interpreter and torch",
        description="List fastmodule's native paths for this interpreter and torch: each on "
        "or off, and why. A path that is off runs torch's own code. Exit status: 0 when "
        f"every path is on, {DOCTOR_PATH_OFF} when some path is off.",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON instead of a table")
    audit = sub.add_parser(
        "audit",
        help="find modules, parameters and tensors a model does not register",
        description="Build a model with FACTORY and report what torch silently ignores: "
        "modules, parameters and tensors kept in plain lists, dicts or attributes (not "
        "trained, saved or moved), attributes that shadow registered ones, mixed devices "
        "or dtypes, and more; one finding per line with its code, severity and fix. The "
        "model is only read, never run. Exit status: 0 when nothing at the --fail-on "
        f"severity or worse was found, {AUDIT_FOUND} when something was, 2 when FACTORY "
        "cannot give a model.",
    )
    audit.add_argument(
        "factory",
        metavar="FACTORY",
        help="pkg.module:factory or path/to/file.py:factory, a callable taking no "
        "arguments that returns a model or a (model, example_inputs) tuple",
    )
    audit.add_argument("--json", action="store_true", help="print JSON (schema 1) instead of text")
    audit.add_argument(
        "--fail-on",
        choices=("error", "warning", "info"),
        default="error",
        help="exit with status 1 when a finding of this severity or worse is found "
        "(default: error)",
    )
    audit.add_argument(
        "--show",
        choices=("error", "warning", "info"),
        default="info",
        help="text output: show findings of this severity or worse (default: info)",
    )
    _add_check(sub)
    return parser


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser(
        "check",
        help="run a model stock and accelerated: exact parity, then the speedup",
        description="Build a model with FACTORY, run it stock twice and accelerated once "
        "from the same state and compare outputs (with --train also grads), parameters and "
        "buffers after the run and state_dict exactly; then time stock, accelerated and "
        "torch.compile, interleaved. Exit status: 0 identical, 1 different, 2 when FACTORY "
        "or the inputs cannot be used, 3 when two stock runs already differ "
        "(nondeterministic model: nothing compared).",
    )
    check.add_argument(
        "factory",
        metavar="FACTORY",
        help="pkg.module:factory or path/to/file.py:factory, a callable taking no "
        "arguments that returns a model or a (model, example_inputs) tuple (inputs: a "
        "tensor, a tuple of positional arguments or a dict of keyword arguments)",
    )
    check.add_argument(
        "--input",
        action="append",
        metavar="SHAPE[:DTYPE]",
        help="a random positional input instead of the factory's, e.g. 1x3x224x224 or "
        "1x8:int64 (floats from randn, integers from 0-15); repeat for more arguments",
    )
    check.add_argument("--dtype", help="convert the model and its floating inputs, e.g. bfloat16")
    check.add_argument("--device", default="cpu", help="run on this device (default: cpu)")
    check.add_argument(
        "--train", action="store_true", help="a forward and backward step in training mode"
    )
    check.add_argument("--repeats", type=int, default=15, help="timing rounds (default: 15)")
    check.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time torch.compile of a copy, its compile time apart (default: on)",
    )
    check.add_argument("--no-timing", action="store_true", help="parity only")
    check.add_argument("--json", action="store_true", help="print JSON (schema 1) instead of text")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def run_bench(args: argparse.Namespace) -> int:
    """Run the ``bench`` subcommand; returns the exit status."""
    import torch

    from fastmodule.bench import DEFAULT, QUICK, case_names, get_case, run_case
    from fastmodule.bench.plot import write_plot
    from fastmodule.bench.progress import Progress
    from fastmodule.bench.report import collect_meta, format_header, format_table, write_json
    from fastmodule.bench.series import DEFAULT_SIZES, QUICK_SIZES, format_series, run_series

    known = case_names()
    names = list(dict.fromkeys(args.only)) if args.only else known
    for name in names:
        if name not in known:
            return _error(f"unknown case {name!r} (known: {', '.join(known)})")
    if args.threads < 1:
        return _error(f"--threads must be at least 1, got {args.threads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return _error("--device cuda requested but torch.cuda.is_available() is False")

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _error("--plot needs matplotlib (pip install matplotlib)")

    torch.set_num_threads(args.threads)
    use_compile = (not args.quick) if args.compile is None else args.compile
    settings = dataclasses.replace(QUICK if args.quick else DEFAULT, compile=use_compile)
    meta = collect_meta(args.threads, args.device, settings, args.quick)
    print(format_header(meta), end="\n\n", flush=True)
    results = []
    progress = Progress(len(names) + (1 if args.series else 0))
    for name in names:
        progress.step(name)
        results.append(run_case(get_case(name), torch.device(args.device), settings))
    series = None
    if args.series:
        progress.step("size series")
        sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
        series = run_series(sizes, stock_max=500 if args.quick else 2000)
    progress.done()
    print(format_table(results))
    if series is not None:
        print()
        print(format_series(series))
    if args.json:
        write_json(args.json, meta, results, series)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, results, series, format_header(meta).splitlines()[1])
        print(f"wrote {args.plot}")
    return 0


def run_script(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand: install, then the script as ``__main__``."""
    import os
    import runpy

    import fastmodule

    if not os.path.isfile(args.script):
        return _error(f"no such script: {args.script}")
    fastmodule.install()
    if args.strict or args.strict_error:
        fastmodule.strict(error=args.strict_error)
    sys.argv = [args.script, *args.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")
    return 0


def run_doctor(args: argparse.Namespace) -> int:
    """Run the ``doctor`` subcommand: 0 if every native path is on, else
    :data:`DOCTOR_PATH_OFF`."""
    import json

    from fastmodule import native_paths

    rows = native_paths.diagnostics()
    if args.json:
        print(json.dumps(native_paths.report(rows), indent=2))
    else:
        header = native_paths.report(rows)
        print(
            f"fastmodule {header['fastmodule']}, torch {header['torch']}, "
            f"Python {header['python']} ({header['platform']})\n"
        )
        print(native_paths.format_table(rows))
    return DOCTOR_PATH_OFF if any(r.on is False for r in rows) else 0


def run_audit(args: argparse.Namespace) -> int:
    """Run the ``audit`` subcommand: 0 if nothing at ``--fail-on`` or worse was
    found, :data:`AUDIT_FOUND` if something was, 2 if the factory gave no model."""
    from fastmodule.cli.factory import FactoryError, load_factory
    from fastmodule.tools.audit import audit

    try:
        loaded = load_factory(args.factory)
    except FactoryError as e:
        return _error(str(e))
    report = audit(loaded.model)
    print(report.to_json() if args.json else report.format(args.show))
    return AUDIT_FOUND if report.at_least(args.fail_on) else 0


def run_check(args: argparse.Namespace) -> int:
    """Run the ``check`` subcommand; the exit status is the report's (0 identical,
    1 different, 3 nondeterministic), 2 when the factory or the inputs are unusable."""
    from fastmodule.cli.factory import FactoryError, load_factory
    from fastmodule.cli.inputs import InputError, prepare
    from fastmodule.tools.check import check

    try:
        loaded = load_factory(args.factory)
        model, inputs = prepare(loaded, args.input, args.dtype, args.device)
    except (FactoryError, InputError) as e:
        return _error(str(e))
    report = check(
        model,
        *inputs.args,
        train=args.train,
        timing=not args.no_timing,
        compile=args.compile,
        repeats=args.repeats,
        **inputs.kwargs,
    )
    print(report.dumps() if args.json else report.format())
    return report.exit_status


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fastmodule`` and the ``fastmodule`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "run":
        return run_script(args)
    if args.command == "doctor":
        return run_doctor(args)
    if args.command == "audit":
        return run_audit(args)
    if args.command == "check":
        return run_check(args)
    return 2  # unreachable: argparse requires a known subcommand


if __name__ == "__main__":
    raise SystemExit(main())
