"""Thread stress (issue 35, item 3): several threads on one model while another mutates
it, stock and with fastmodule, checked by invariants that hold for every interleaving
of stock torch (never by timings).

The scenarios live in ``tests/thread_stress_support.py`` (their docstrings say what each
invariant means) and run in two child processes at once (``lanes``), under
``PYTHONMALLOC=debug`` and ``-X faulthandler``, so a crash or a hang fails the scenario
it happened in, not the suite: the child is restarted for the scenarios after it. Each
scenario stresses for ``FASTMODULE_STRESS_SECONDS`` (default ``DEFAULT_SECONDS``; ``make
test-threads`` runs them longer), and at least a fixed number of rounds.

- ``mlp``, ``hf_bert``, ``layers``: callers and a mutator (rebind, replace, delete,
  hook, load, convert, train/eval, zero_grad); only exceptions stock can raise there,
  and afterwards the model equals a reference put through the same steps serially.
- ``hooks``: value-keeping mutations; every call exact, hooks run exactly once per call.
- ``walks``: walks yield only what was registered under that name at some point.
- ``state_dict_order``, ``load_order``, ``bn_order``, ``apply_flag``: what a thread
  observes of a whole-tree call or a BatchNorm step is what some serial order gives.
- ``gc_state`` (and a watcher thread in every scenario with callers or walkers): the GC
  never seen disabled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from tests.conftest import BASES, IDS
from tests.thread_stress_support import SCENARIOS, stress_seconds

ROOT = Path(__file__).resolve().parent.parent
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
#: How long the child may take to import torch (and transformers) under the debug
#: allocator, and each scenario past its stress time, before it counts as hung.
STARTUP_S = 180.0
SCENARIO_SLACK_S = 120.0


@dataclass
class Outcome:
    """One scenario's result on one side: the violations the child reported, its
    stats, and ``crash`` when the child died (or hung) inside it."""

    violations: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    crash: str | None = None


Item = tuple[str, str]  # (side, scenario)


def run_child(items: list[Item], seconds: float) -> tuple[dict[Item, Outcome], str]:
    """Run ``items`` in order in one child; the outcomes it reported, and the child's
    stderr tail (with its exit status) if it did not exit cleanly. The item it was in
    when it died or hung gets a ``crash`` outcome."""
    env = dict(os.environ, PYTHONMALLOC="debug")
    argv = [sys.executable, "-X", "faulthandler", "-m", "tests.thread_stress_support"]
    out: dict[Item, Outcome] = {}
    lines: queue.Queue[str | None] = queue.Queue()
    with (
        tempfile.TemporaryFile("w+") as err,
        subprocess.Popen(
            [*argv, str(seconds), *(f"{side}:{name}" for side, name in items)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None

        def read(stream: Any = proc.stdout) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        # A reader thread: the wait for each line has a timeout (a hung child).
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        current: Item | None = None
        timeout = STARTUP_S + SCENARIO_SLACK_S + 3 * seconds
        timed_out = False
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                timed_out = True
                proc.kill()
                break
            if line is None:
                break
            if line.startswith("START "):
                side, _, name = line.split()[1].partition(":")
                current = (side, name)
                timeout = SCENARIO_SLACK_S + 3 * seconds
            elif line.startswith("RESULT "):
                r = json.loads(line[len("RESULT ") :])
                side, _, name = r["item"].partition(":")
                out[(side, name)] = Outcome(r["violations"], r["stats"])
                current = None
        rc = proc.wait()
        reader.join(10)
        err.seek(0)
        tail = err.read()[-6000:]
    problem = ""
    if rc != 0 or timed_out:
        what = "timed out (killed)" if timed_out else f"exited with status {rc}"
        problem = f"child {what}; its stderr ends:\n{tail}"
        if current is not None:
            out[current] = Outcome(crash=f"during {current}: {problem}")
        for o in out.values():
            if o.violations and o.crash is None:
                # A hang is reported, then the child dumps every thread's stack.
                o.violations.append(problem)
    return out, problem


def run_lane(items: list[Item], seconds: float) -> dict[Item, Outcome]:
    """Every item's outcome: all in one child, restarted after an item it crashed or
    hung in, for the items after it."""
    todo = list(items)
    got: dict[Item, Outcome] = {}
    while todo:
        out, problem = run_child(todo, seconds)
        got.update(out)
        left = [i for i in todo if i not in got]
        if left and not out:
            # Nothing started: the child failed before its first item.
            got.update({i: Outcome(crash=f"the child did not start: {problem}") for i in left})
            left = []
        todo = left
    return got


#: The HF scenario's first model costs its child seconds of imports (transformers,
#: torch._dynamo; measured on 2 shared cores), and every item some set-up besides its
#: stress time: what ``lanes`` balances.
HF_IMPORT_S = 8.0
ITEM_SETUP_S = 0.3


def lanes(items: list[Item], seconds: float) -> list[list[Item]]:
    """Two children's worth of items (two cores), about equally long. Acceleration is
    per class and for good, so within a child every stock item runs before any fast
    one: the HF pair (stock, then fast) and some fast items in one child; the other
    stock items, then the other fast ones, in the other."""
    hf = sorted((i for i in items if i[1] == "hf_bert"), key=lambda i: i[0] == "fast")
    stock = [i for i in items if i[0] == "stock" and i not in hf]
    fast = [i for i in items if i[0] == "fast" and i not in hf]
    # The HF pair's cost in items: its two runs and the imports.
    hf_items = (len(hf) + HF_IMPORT_S / (seconds + ITEM_SETUP_S)) if hf else 0
    k = min(len(fast), max(0, round((len(stock) + len(fast) - hf_items) / 2)))
    return [lane for lane in (hf + fast[:k], stock + fast[k:]) if lane]


_RESULTS: dict[Item, Outcome] = {}


def results(item: Item, request: pytest.FixtureRequest) -> Outcome:
    """``item``'s outcome. The first test of this file runs every item selected in this
    session (two children at once) and waits for them: no thread or child of it
    outlives that test."""
    if item not in _RESULTS:
        selected = {item}
        for it in request.session.items:
            if it.module is sys.modules[__name__] and hasattr(it, "callspec"):
                side = IDS[BASES.index(it.callspec.params["base"])]
                selected.add((side, it.originalname.removeprefix("test_")))
        if not HAVE_TRANSFORMERS:  # its tests are skipped
            selected = {i for i in selected if i[1] != "hf_bert"}
        todo = [i for side in IDS for name in SCENARIOS if (i := (side, name)) in selected]
        todo = [i for i in todo if i not in _RESULTS]
        seconds = stress_seconds()
        errors: list[BaseException] = []

        def run(lane: list[Item]) -> None:
            try:
                _RESULTS.update(run_lane(lane, seconds))
            except BaseException as e:  # noqa: BLE001 - raised in the test below
                errors.append(e)

        runners = [threading.Thread(target=run, args=(lane,)) for lane in lanes(todo, seconds)]
        for t in runners:
            t.start()
        for t in runners:
            t.join()
        if errors:
            raise errors[0]
    return _RESULTS[item]


def check(base: type[nn.Module], scenario: str, request: pytest.FixtureRequest) -> None:
    """Fail with the scenario's violations (or its crash) on ``base``'s side."""
    side = IDS[BASES.index(base)]
    o = results((side, scenario), request)
    assert o.crash is None, f"{side} {scenario}: the child crashed or hung {o.crash}"
    assert not o.violations, f"{side} {scenario} ({o.stats}):\n" + "\n".join(o.violations)


def test_mlp(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """(a) An MLP called by two threads while a third rebinds, replaces, deletes,
    hooks, loads, converts, toggles train/eval and zeroes grads: no crash or hang,
    only the dtype errors stock raises mid-conversion, the GC never seen off, and the
    model equal to its reference after the same steps serially."""
    check(base, "mlp", request)


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="no transformers")
def test_hf_bert(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """(b) A tiny BertModel (from a config) under callers and a mutator, as ``test_mlp``."""
    check(base, "hf_bert", request)


def test_layers(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """(c) A Sequential of torch's layers, layers deleted and inserted while callers
    iterate it: only iteration and dtype errors stock raises; equal to its reference."""
    check(base, "layers", request)


def test_hooks(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """(d) A hooked model under value-keeping mutations: every output exact, permanent
    hooks exactly once per call in order, temporary ones at most once and exactly
    once for a call within their lifetime."""
    check(base, "hooks", request)


def test_walks(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """Walks while the tree is restructured yield only ``(name, obj)`` pairs registered
    under that name at some point, no duplicates where torch drops them, only stock's
    iteration errors, and the same tree as stock's walk afterwards."""
    check(base, "walks", request)


def test_state_dict_order(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """Every state dict taken while another thread mutates is one a serial order gives."""
    check(base, "state_dict_order", request)


def test_load_order(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """A load reads each module's tensors when it reaches it, as torch's does."""
    check(base, "load_order", request)


def test_gc_state(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """No whole-tree call changes the GC's state for other threads."""
    check(base, "gc_state", request)


def test_bn_order(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """BatchNorm reads ``momentum`` after ``num_batches_tracked.add_``, as torch does."""
    check(base, "bn_order", request)


def test_apply_flag(base: type[nn.Module], request: pytest.FixtureRequest) -> None:
    """``_apply`` reads ``torch.__future__``'s flag per parameter, as torch does."""
    check(base, "apply_flag", request)
