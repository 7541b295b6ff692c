"""One scenario script run on stock and on fastmodule, each side in a fresh interpreter
under CPython's debug allocator and dev mode (freed memory is poisoned, so a use after
free crashes the side that made it instead of passing by luck).

A fresh interpreter costs about two seconds of importing torch. The sides are therefore
forked from a server that started once under the same settings (``-X dev``,
``PYTHONMALLOC=debug``, ``PYTHONHASHSEED=0``) and imported torch, and nothing else:
fastmodule, and everything of it (its extension's statics included), is imported fresh
by each side. A side runs as ``python -c BODY side`` or ``python PATH side`` would (its
own ``__main__``, ``sys.argv``, ``sys.path[0]``), then exits through the interpreter's
own shutdown; a crash ends the side's process alone, reported as ``rc`` (negative: the
signal). ``FASTMODULE_TEST_FRESH=1`` runs each side in a new interpreter instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300.0

HEADER = """
import gc, sys
import torch
from torch import nn
import fastmodule
side = sys.argv[1]
fast = side == "fast"
"""

ENV = {"PYTHONMALLOC": "debug", "PYTHONHASHSEED": "0"}


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


def run_python(argv: list[str]) -> tuple[int, str, str]:
    """``python -X dev ARGV`` (``-c CODE ...`` or ``PATH ...``) as a fresh interpreter
    under the debug allocator runs it, from the repository root: exit status (negative:
    the signal that ended it), stdout, stderr."""
    if os.environ.get("FASTMODULE_TEST_FRESH") == "1":
        return _run_fresh(argv)
    return _SERVER.run(argv)


def _run(argv: list[str], side: str) -> str:
    rc, out, err = run_python([*argv, side])
    assert rc == 0, f"{side}: rc={rc}\n{err[-4000:]}"
    return out


def _run_fresh(argv: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-X", "dev", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=ROOT,
        env=dict(os.environ, **ENV),
    )
    return proc.returncode, proc.stdout, proc.stderr


# The server: reads one JSON request a line ({"argv": [...], "out": path, "err": path}),
# forks, answers {"pid": N} at once and {"rc": N} when the side has ended. Only torch is
# imported before the fork (no torch op runs: no thread pool exists to be lost in it).
SERVER = r"""
import json, os, runpy, sys, traceback, types
import torch
from torch import nn

def side(req):
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    for stream, path in ((1, req["out"]), (2, req["err"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, stream)
        os.close(fd)
    argv = req["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    # The side ends as an interpreter does: its own shutdown (atexit, finalizers).
    raise SystemExit(code)

answer = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        answer.close()
        side(req)
    answer.write(json.dumps({"pid": pid}) + "\n")
    answer.flush()
    _, status = os.waitpid(pid, 0)
    answer.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
    answer.flush()
answer.close()
"""


class _Server:
    """The fork server, started on first use; one side at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending = b""

    def _start(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-X", "dev", "-c", SERVER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
                cwd=ROOT,
                env=dict(os.environ, **ENV),
            )
            self.pending = b""
        return self.proc

    def _answer(self, proc: subprocess.Popen[bytes], timeout: float | None) -> dict[str, int]:
        """The server's next answer line (read unbuffered: select sees what is left)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self.pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the fork server ended (rc={proc.wait()})")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            proc = self._start()
            assert proc.stdin is not None
            request = {"argv": argv, "out": out, "err": err}
            proc.stdin.write((json.dumps(request) + "\n").encode())
            pid = self._answer(proc, 120.0)["pid"]
            try:
                rc = self._answer(proc, TIMEOUT_S)["rc"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._answer(proc, None)
                raise AssertionError(f"{argv[-1]}: no exit after {TIMEOUT_S} s") from None
            with open(out) as f, open(err) as g:
                return rc, f.read(), g.read()


_SERVER = _Server()
