"""One scenario script run on stock and on fastmodule, each side in a fresh interpreter
under CPython's debug allocator and dev mode (freed memory is poisoned, so a use after
free crashes the side that made it instead of passing by luck)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HEADER = """
import gc, sys
import torch
from torch import nn
import fastmodule
side = sys.argv[1]
fast = side == "fast"
"""


def run_side(body: str, side: str) -> str:
    """``body`` (using ``side``/``fast``) in a fresh interpreter under the debug
    allocator and dev mode: its output (a crash or an exit status other than 0
    fails)."""
    return _run(["-c", HEADER + textwrap.dedent(body)], side)


def assert_same(body: str) -> str:
    """``body`` on both sides: their output, which must be the same."""
    stock = run_side(body, "stock")
    fast = run_side(body, "fast")
    assert fast == stock
    return fast


def assert_same_file(path: str) -> str:
    """The script ``path`` (``python path stock|fast``, importing fastmodule only on
    the fast side) on both sides: their output, which must be the same."""
    stock = _run([path], "stock")
    fast = _run([path], "fast")
    assert fast == stock
    return fast


def _run(argv: list[str], side: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-X", "dev", *argv, side],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONMALLOC="debug", PYTHONHASHSEED="0"),
    )
    assert proc.returncode == 0, f"{side}: rc={proc.returncode}\n{proc.stderr[-4000:]}"
    return proc.stdout
