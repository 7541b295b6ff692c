"""Smoke test of an installed fastmodule (run by scripts/check_wheels.sh in a clean venv).

A stock torch model, with a fixed seed, gives the same output before and after
``fastmodule.accelerate``, and the accelerated call really runs natively: it
enters none of torch's Python frames, where the stock call enters several.
Prints one line; exits non-zero on any failure.

    python scripts/smoke_wheel.py [--installed]

``--installed``: fastmodule must be imported from this environment's own
site-packages (a wheel installed into it), not from a source tree or another
environment made visible by a ``.pth`` file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import fastmodule
from fastmodule import _core


def torch_frames(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``call()``'s result and the names of torch's Python functions it entered."""
    torch_dir = str(Path(torch.__file__).parent)
    entered: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(torch_dir):
            entered.append(frame.f_code.co_name)

    # With a profile function set, fastmodule hands calls to torch's code (so that
    # profilers see stock frames); switched off here to watch the native route.
    was = _core.set_tracer_check(False)
    sys.setprofile(profile)
    try:
        result = call()
    finally:
        sys.setprofile(None)
        _core.set_tracer_check(was)
    return result, entered


def failures(installed: bool) -> tuple[list[str], int]:
    """What went wrong (empty: all good), and how many torch frames the stock call entered."""
    problems: list[str] = []
    here = Path(fastmodule.__file__).resolve()
    if installed and not here.is_relative_to(Path(sys.prefix).resolve()):
        problems.append(f"fastmodule imported from {here}, outside {sys.prefix}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4), torch.nn.ReLU()
    )
    x = torch.randn(8, 16)
    keys = list(model.state_dict())
    stock, stock_frames = torch_frames(lambda: model(x))
    if not stock_frames:
        problems.append("the stock call entered no torch frame (profile hook not working)")

    if fastmodule.accelerate(model) is not model:
        problems.append("accelerate did not return the model itself")
    fast, fast_frames = torch_frames(lambda: model(x))
    if not torch.equal(stock, fast):
        problems.append("output differs from stock")
    if not all(fastmodule.is_accelerated(m) for m in model.modules()):
        problems.append("not every module is accelerated")
    if fast_frames:
        problems.append(f"accelerated call entered torch's frames {sorted(set(fast_frames))}")
    if list(model.state_dict()) != keys:
        problems.append("state_dict keys differ from stock")
    return problems, len(stock_frames)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--installed", action="store_true", help="require an installed wheel")
    problems, stock_frames = failures(parser.parse_args().installed)
    where = (
        f"fastmodule {fastmodule.__version__} ({Path(fastmodule.__file__).parent}), "
        f"torch {torch.__version__}, CPython {sys.version.split()[0]}"
    )
    if problems:
        print(f"smoke FAILED: {'; '.join(problems)} [{where}]")
        return 1
    print(
        f"smoke ok: identical output; native call (torch frames entered: stock {stock_frames}, "
        f"accelerated 0) [{where}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
