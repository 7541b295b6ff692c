"""Command line: ``python -m fastmodule bench [--quick] [--only NAME ...] ...``,
``python -m fastmodule run [--report] [--report-json PATH] script.py [args ...]``,
``python -m fastmodule doctor [--json]``,
``python -m fastmodule audit pkg.module:factory [--json] [--select/--ignore CODES]``,
``python -m fastmodule audit --explain FM001`` and
``python -m fastmodule check pkg.module:factory [--input 1x3x224x224] [--method NAME]
[--train] [--json]``.

Every subcommand runs under :func:`main`'s common handling: a closed pipe (``| head``)
ends it quietly with status 141 (as a process ended by SIGPIPE), Ctrl-C prints one line
and exits with 130, and with ``--json`` (``audit``, ``doctor``, ``check``) a usage error
or a failure prints a JSON object with the error (``{"schema": 1, "error": ...,
"exit_status": 2}``) on stdout, the details on stderr."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from typing import Any, NoReturn

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
#: The exit status after a closed pipe (128 + SIGPIPE, what a shell shows for a process
#: that SIGPIPE ended) and after Ctrl-C (128 + SIGINT).
CLOSED_PIPE = 141
INTERRUPTED = 130
#: The subcommands whose ``--json`` is a flag (bench's names a file).
JSON_COMMANDS = ("audit", "doctor", "check")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as a JSON object when ``--json`` was asked for."""

    #: Set by :func:`main` when the command line asks for JSON.
    json_errors = False

    def error(self, message: str) -> NoReturn:
        if _Parser.json_errors:
            _print_json_error(f"{self.prog}: {message}", 2)
        super().error(message)


def _print_json_error(message: str, status: int, **extra: Any) -> None:
    """The JSON object of an error, on stdout (what reads ``--json`` output reads it)."""
    print(json.dumps({"schema": 1, "error": message, **extra, "exit_status": status}, indent=2))


def build_parser() -> argparse.ArgumentParser:
    """The ``fastmodule`` argument parser (subcommands ``bench``, ``run``, ``doctor``,
    ``audit``)."""
    parser = _Parser(prog="fastmodule", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser(
        "bench",
        help="time fastmodule.Module against stock torch.nn.Module",
        description="Time module call, attribute reads and registration on stock "
        "torch.nn.Module, fastmodule.Module and a lower bound without module machinery.",
    )
    bench.add_argument("--quick", action="store_true", help="fewer repeats, shorter loops")
    bench.add_argument(
        "--only",
        nargs="+",
        action="extend",
        metavar="NAME",
        help="run only these cases; a NAME may be a pattern such as 'root_*'. The root_* "
        "(whole-tree methods on Hugging Face roots) and step_* (a training step phase by "
        "phase, decode, generate) groups run only when named here; 'workload_*' (whole "
        "programs around small models: RL policies, timm at batch 1, an RK4 ODE solve, a "
        "sentence encoder, a PINN) is in the default run and selects that group alone",
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
    run.add_argument(
        "--report",
        action="store_true",
        help="at the program's exit (after an exception or sys.exit too), print to "
        "stderr a table of the module calls that ran torch's path instead of the "
        "native one: class, modules, calls, why and the remedy (fastmodule.report()). "
        "Calls are counted by a global forward pre-hook, so the run is slower; the "
        "script's stdout and exit status are its own",
    )
    run.add_argument(
        "--report-json",
        metavar="PATH",
        help="at the program's exit, write that report as JSON (schema 1) to PATH "
        "(without --report, no table is printed)",
    )
    run.add_argument("script", nargs="?", metavar="SCRIPT", help="path of the Python script")
    run.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments"
    )
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
        "or dtypes, modules held by plain helper objects, and more; one finding per "
        "finding with its code, severity, the file and line of the assignment where the "
        "source is found, and the fix (wrapped to the terminal; COLUMNS sets the width "
        "when the output is not a terminal). The model is only read, never run. Silence "
        "one finding in the code with a '# fastmodule: ignore[FM001]' comment on the line "
        "it names, or a class attribute __fastmodule_ignore__ = {'FM001': ['name']}. Exit "
        f"status: 0 when nothing at the --fail-on severity or worse was found, {AUDIT_FOUND} "
        "when something was, 2 when FACTORY cannot give a model or a code is unknown.",
    )
    audit.add_argument(
        "factory",
        metavar="FACTORY",
        nargs="?",
        help="pkg.module:factory or path/to/file.py:factory, a callable taking no "
        "arguments that returns a model or a (model, example_inputs) tuple",
    )
    audit.add_argument(
        "--select",
        action="append",
        metavar="CODES",
        help="report only these codes (comma-separated; a prefix such as FM00 selects "
        "FM001-FM009; repeatable)",
    )
    audit.add_argument(
        "--ignore",
        action="append",
        metavar="CODES",
        help="do not report these codes (as --select)",
    )
    audit.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="CODE",
        help="show what a code means (what goes wrong, an example, the fix) and exit; "
        "without CODE, list the codes",
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
        "from the same state and compare exactly what it returns (tensors bitwise; "
        "containers, model outputs, caches and other objects field by field) or raises, "
        "the parameters and buffers after the run and state_dict (with --train also "
        "grads); on a difference, name the first module whose output differs. Then time "
        "stock, "
        "accelerated and torch.compile, interleaved. Each run is a forward (or, with "
        "--method NAME, a call of the model's method NAME) under torch.no_grad(), or with "
        "--train a forward (the method) and backward with grad. Exit status: 0 "
        "identical, 1 different, 2 when FACTORY, the options or the inputs cannot be used "
        "or the model raises on the inputs in every run, 3 when two stock runs already "
        "differ (nondeterministic model: nothing compared).",
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
    check.add_argument(
        "--method",
        metavar="NAME",
        help="call the model's method NAME with the inputs in every run instead of the "
        "model itself (its forward), e.g. get_action_and_value, predict or generate; "
        "torch.compile is timed on the bound method",
    )
    check.add_argument("--dtype", help="convert the model and its floating inputs, e.g. bfloat16")
    check.add_argument("--device", default="cpu", help="run on this device (default: cpu)")
    check.add_argument(
        "--train",
        action="store_true",
        help="each run a forward and backward in training mode, with grad (default: a "
        "forward under torch.no_grad())",
    )
    check.add_argument("--repeats", type=int, default=15, help="timing rounds (default: 15)")
    check.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
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

    from fastmodule.bench import (
        DEFAULT,
        QUICK,
        case_names,
        default_case_names,
        get_case,
        run_case,
        select_cases,
    )
    from fastmodule.bench.plot import write_plot
    from fastmodule.bench.progress import Progress
    from fastmodule.bench.report import collect_meta, format_header, format_table, write_json
    from fastmodule.bench.series import DEFAULT_SIZES, QUICK_SIZES, format_series, run_series

    try:
        names = select_cases(args.only) if args.only else default_case_names()
    except KeyError as e:
        known = ", ".join(case_names())
        return _error(f"unknown case {e.args[0]!r} (no case matches it; known: {known})")
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


def _fail(args: argparse.Namespace, message: str, status: int = 2) -> int:
    """An error of a subcommand: ``error: message`` on stderr, and with ``--json`` the
    JSON object of the error on stdout too."""
    if getattr(args, "json", False) is True:
        _print_json_error(message, status)
    print(f"error: {message}", file=sys.stderr)
    return status


def _width() -> int | None:
    """The width to wrap text to: COLUMNS if set, else the terminal's when stdout is
    one, else None (one line per finding, for tools that read it)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if sys.stdout.isatty():
            return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return None


def run_script(args: argparse.Namespace) -> int:
    """Run the ``run`` subcommand: install, then the script as ``__main__``; without a
    script, its usage (status 2). With ``--report``/``--report-json``, the module calls
    are counted from before the script starts and reported at the process's exit."""
    import runpy

    import fastmodule

    if args.script is None:
        _subparser(build_parser(), "run").print_help(sys.stderr)
        return 2
    if not os.path.isfile(args.script):
        return _error(f"no such script: {args.script}")
    fastmodule.install()
    if args.strict or args.strict_error:
        fastmodule.strict(error=args.strict_error)
    if args.report or args.report_json:
        from fastmodule.tools.report import report_at_exit

        json_path = os.path.abspath(args.report_json) if args.report_json else None
        report_at_exit(table=args.report, json_path=json_path)
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
    found, :data:`AUDIT_FOUND` if something was, 2 if the factory gave no model or a
    code is unknown. ``--explain`` prints a code's page (or the list of codes)."""
    from fastmodule.cli.factory import FactoryError, load_factory
    from fastmodule.tools.audit import audit, select_codes
    from fastmodule.tools.audit.explain import explain, explain_dict, index

    if args.explain is not None:
        if not args.explain:
            print(index(_width()))
            return 0
        try:
            page = json.dumps(explain_dict(args.explain), indent=2) if args.json else None
            print(page or explain(args.explain, _width()))
        except KeyError as e:
            return _fail(args, str(e.args[0]))
        return 0
    if args.factory is None:
        _subparser(build_parser(), "audit").print_usage(sys.stderr)
        return _fail(args, "audit needs FACTORY (or --explain CODE)")
    try:
        select_codes(args.select, args.ignore)
    except ValueError as e:
        return _fail(args, str(e))
    try:
        loaded = load_factory(args.factory)
    except FactoryError as e:
        return _fail(args, str(e))
    report = audit(loaded.model, select=args.select, ignore=args.ignore)
    print(report.to_json() if args.json else report.format(args.show, width=_width()))
    return AUDIT_FOUND if report.at_least(args.fail_on) else 0


def run_check(args: argparse.Namespace) -> int:
    """Run the ``check`` subcommand; the exit status is the report's (0 identical,
    1 different, 3 nondeterministic), 2 when the factory, the options or the inputs are
    unusable or the model raised on the inputs in every run (with ``--json`` the JSON
    object of the error then, ``raised`` saying which run raised what, or null)."""
    from fastmodule.cli.factory import FactoryError, load_factory
    from fastmodule.cli.inputs import InputError, prepare
    from fastmodule.tools.check import CheckError, check, validate_method
    from fastmodule.tools.check.report import EXIT_UNUSABLE, raised_json

    def fail(message: str, error: CheckError | None = None) -> int:
        if args.json:
            _print_json_error(message, EXIT_UNUSABLE, raised=raised_json(error))
        return _error(message)

    if args.repeats < 1:
        return fail(f"--repeats must be at least 1, got {args.repeats}")
    if args.threads < 1:
        return fail(f"--threads must be at least 1, got {args.threads}")
    try:
        loaded = load_factory(args.factory)
        model, inputs = prepare(loaded, args.input, args.dtype, args.device)
    except (FactoryError, InputError) as e:
        return fail(str(e))
    try:
        validate_method(model, args.method)
    except ValueError as e:
        return fail(f"--method {args.method}: {e}" if args.method is not None else str(e))
    try:
        report = check(
            model,
            *inputs.args,
            method=args.method,
            train=args.train,
            timing=not args.no_timing,
            compile=args.compile,
            repeats=args.repeats,
            threads=args.threads,
            **inputs.kwargs,
        )
    except CheckError as e:
        return fail(str(e), e)
    print(report.dumps() if args.json else report.format())
    return report.exit_status


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _dispatch(args: argparse.Namespace) -> int:
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


def _quiet_stdout() -> None:
    """stdout's reader is gone: point the descriptor at the null device, so nothing
    written later (Python's own flush at exit included) fails again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _say(line: str) -> None:
    """One line on stderr, if stderr can still take it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m fastmodule`` and the ``fastmodule`` console script.

    Common to every subcommand: a closed stdout (``| head``) ends it quietly with
    :data:`CLOSED_PIPE`; Ctrl-C prints one line and returns :data:`INTERRUPTED`; with
    ``--json``, a usage error or an unexpected failure prints the JSON object of the
    error on stdout (the traceback on stderr) and returns 2. A script under ``run``
    fails as under ``python script.py`` (its traceback, status 1)."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = words[0] if words else ""
    _Parser.json_errors = command in JSON_COMMANDS and "--json" in words
    args = None
    try:
        if not words:
            build_parser().print_help(sys.stderr)
            return 2
        args = build_parser().parse_args(words)
        status = _dispatch(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return CLOSED_PIPE
    except KeyboardInterrupt:
        _say(f"{' '.join(filter(None, ('fastmodule', command)))}: interrupted")
        return INTERRUPTED
    except Exception as e:
        if args is None or args.command == "run":
            raise  # the script's own error, as Python shows it
        traceback.print_exc()
        message = f"fastmodule {args.command} failed: {type(e).__name__}: {e}"
        if getattr(args, "json", False) is True:
            _print_json_error(message, 2)
        _say(f"error: {message}")
        return 2
    finally:
        _Parser.json_errors = False


if __name__ == "__main__":
    raise SystemExit(main())
