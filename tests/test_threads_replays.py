"""Recorded ``load_state_dict``/``state_dict`` walks while another thread changes the tree.

``copy_`` and ``detach`` release the GIL, so another thread runs in the middle of a
replay. What it changes there must be seen as torch's own walk would see it: a module
is read when the walk reaches it (``load``: its registries when its
``_load_from_state_dict`` starts; the children's dict iterated live; the post-hooks
read after the children), and the cyclic GC is never switched off where another
thread can see it. Each scenario runs on a stock tree and on the same tree
accelerated, and the outcomes are compared.

The mutating thread acts while the load copies the large tensors of ``m0`` (tens of
milliseconds with the GIL released); a run where it did not get in before ``m1``
was reached is not one of the scenario and is tried again.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE, outcome

BIG = 1 << 22  # elements of m0's two large parameters (16 MiB each)
ATTEMPTS = 50


def build() -> nn.Module:
    root = nn.Module()
    root.m0 = nn.Module()
    # m1 is reached after the copies of big1..big3: the other thread's window.
    for i in range(4):
        root.m0.register_parameter(f"big{i}", nn.Parameter(torch.zeros(BIG)))
    root.m1 = nn.Linear(2, 2)
    root.m1.register_buffer("counts", torch.zeros(2))
    root.m2 = nn.Linear(2, 2)
    with torch.no_grad():
        for p in root.parameters():
            p.zero_()
    return root


def loaded_values() -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, 5.0) for k, v in build().state_dict().items()}


def during_load(
    side: str, mutate: Callable[[nn.Module], Any], stack: contextlib.ExitStack
) -> tuple[nn.Module, Any, Any] | None:
    """Load 5s into a fresh tree (its load recorded and replayed once before, on the
    fast side), with ``mutate(root)`` run by another thread once ``m0.big0`` is
    loaded and before ``m1`` is: (root, the load's outcome, what ``mutate``
    returned); None when the thread came too late."""
    root = build()
    if side == "fast":
        stack.enter_context(fastmodule.accelerated(root))
    zero = {k: torch.zeros_like(v) for k, v in root.state_dict().items()}
    root.load_state_dict(zero)
    root.load_state_dict(zero)
    sd = loaded_values()
    before = _core.load_plan_stats()[1]
    result: list[Any] = []
    in_time: list[bool] = []

    big0, last = root.m0.big0, root.m0.big3

    def other() -> None:
        while big0[0].item() != 5.0:
            pass
        result.append(mutate(root))
        # m1 comes after big3's copy: some element of big3 not yet copied after
        # the change means the change was made before the load reached m1.
        in_time.append(not bool((last == 5.0).all()))

    t = threading.Thread(target=other)
    t.start()
    got = outcome(lambda: root.load_state_dict(sd))
    t.join(timeout=60)
    assert not t.is_alive()
    if side == "fast" and NATIVE:
        # The call started from the recorded walk (where there are recorded walks).
        assert _core.load_plan_stats()[1] == before + 1
    if not in_time or not in_time[0]:
        return None
    return root, got, result[0] if result else None


def scenario(side: str, mutate: Callable[[nn.Module], Any], describe: Callable[..., Any]) -> Any:
    """``describe(root, outcome, mutated)`` of the first run where the thread got in."""
    for _ in range(ATTEMPTS):
        with contextlib.ExitStack() as stack:
            run = during_load(side, mutate, stack)
            if run is not None:
                return describe(*run)
    pytest.fail(f"the other thread never acted during the load in {ATTEMPTS} runs")


def values(root: nn.Module) -> dict[str, float]:
    return {k: float(v.reshape(-1)[0]) for k, v in root.state_dict().items()}


def _rebind_weight(root: nn.Module) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(2, 2))
    root.m1.weight = p
    return p


def _replace_child(root: nn.Module) -> nn.Module:
    new = nn.Linear(2, 2)
    new.register_buffer("counts", torch.zeros(2))
    with torch.no_grad():
        for p in new.parameters():
            p.zero_()
    root.m2 = new
    return new


def _add_child(root: nn.Module) -> None:
    root.extra = nn.Linear(1, 1)
    with torch.no_grad():
        root.extra.weight.zero_()
        root.extra.bias.zero_()


def _delete_child(root: nn.Module) -> None:
    del root.m2


def _post_hook(root: nn.Module) -> list[Any]:
    seen: list[Any] = []
    root.register_load_state_dict_post_hook(
        lambda m, keys: seen.append((sorted(keys.missing_keys), sorted(keys.unexpected_keys)))
    )
    return seen


def _pre_hook_on_later_child(root: nn.Module) -> list[Any]:
    seen: list[Any] = []
    root.m2.register_load_state_dict_pre_hook(
        lambda module, sd, prefix, *rest: seen.append((prefix, torch.is_grad_enabled()))
    )
    return seen


def _non_persistent(root: nn.Module) -> None:
    root.m1.register_buffer("counts", root.m1.counts, persistent=False)


def _new_parameter(root: nn.Module) -> None:
    root.m1.register_parameter("scale", nn.Parameter(torch.zeros(1)))


CHANGES: dict[str, tuple[Callable[[nn.Module], Any], Callable[..., Any]]] = {
    # The load copies into the tensor registered when m1 is reached.
    "rebind_parameter": (
        _rebind_weight,
        lambda root, got, p: (got, float(p.detach()[0, 0]), root.m1.weight is p, values(root)),
    ),
    # The children's dict is iterated live: a replaced child is the one loaded.
    "replace_child": (
        _replace_child,
        lambda root, got, new: (got, root.m2 is new, values(root)),
    ),
    # The children's dict changed size while iterated: torch's RuntimeError.
    "add_child": (_add_child, lambda root, got, _: (got, values(root))),
    "delete_child": (_delete_child, lambda root, got, _: (got, values(root))),
    # Post-hooks are read after the children loaded.
    "post_hook": (_post_hook, lambda root, got, seen: (got, list(seen), values(root))),
    # A pre-hook registered on a later module runs there, with the caller's grad mode
    # (torch enters no_grad only around each module's copies).
    "pre_hook_on_later_child": (
        _pre_hook_on_later_child,
        lambda root, got, seen: (got, list(seen), torch.is_grad_enabled(), values(root)),
    ),
    # Persistence is read when the module is reached: its key is unexpected then.
    "buffer_made_non_persistent": (_non_persistent, lambda root, got, _: (got, values(root))),
    "parameter_registered": (_new_parameter, lambda root, got, _: (got, values(root))),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_load_replay_sees_changes_made_while_it_copies(change: str) -> None:
    mutate, describe = CHANGES[change]
    stock = scenario("stock", mutate, describe)
    fast = scenario("fast", mutate, describe)
    assert fast == stock


def test_load_replay_after_changes_loads_as_stock_again() -> None:
    """A change during one replayed load: the next load is torch's order again."""

    def again(root: nn.Module, got: Any, _: Any) -> Any:
        sd = {k: torch.full_like(v, 7.0) for k, v in root.state_dict().items()}
        return got, outcome(lambda: root.load_state_dict(sd)), values(root)

    assert scenario("fast", _rebind_weight, again) == scenario("stock", _rebind_weight, again)


# The serial-order checks of the shared reproducers, shorter: each runs stock and
# fast in fresh processes and fails on an outcome no serial order of stock gives.
STATE_DICT_MIXED = """
import sys, threading, time, torch
from torch import nn
torch.set_num_threads(1)
sys.setswitchinterval(1e-6)
fast = sys.argv[1] == "fast"
if fast:
    import fastmodule
K = 400
def build():
    root = nn.Module()
    root.m0 = nn.Module()
    for j in range(200):
        root.m0.register_parameter(f"p{j}", nn.Parameter(torch.zeros(64, 64)))
    root.m1 = nn.Module()
    for i in range(K + 1):
        root.m1.register_buffer(f"b{i}", torch.zeros(1))
    root.m2 = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        root.m2.weight.fill_(0)
    return root
bad = 0
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    root = build()
    if fast:
        fastmodule.accelerate(root)
    P = [nn.Parameter(torch.full((1, 1), float(i))) for i in range(K + 1)]
    root.state_dict(); root.state_dict()
    def mutate():
        for i in range(1, K + 1):
            root.m2.weight = P[i]
            root.m1.register_buffer(f"b{i}", root.m1._buffers[f"b{i}"], persistent=False)
    go = threading.Event()
    t = threading.Thread(target=lambda: (go.wait(), mutate())); t.start()
    go.set()
    sd = root.state_dict()
    t.join()
    left_out = [i for i in range(1, K + 1) if f"m1.b{i}" not in sd]
    if left_out and max(left_out) > int(sd["m2.weight"].item()):
        bad += 1
print(bad)
"""

GC_SEEN_OFF = """
import gc, sys, threading, time, torch
from torch import nn
torch.set_num_threads(1)
sys.setswitchinterval(1e-6)
if sys.argv[1] == "fast":
    import fastmodule
m = nn.Sequential(*[nn.Linear(8, 8) for _ in range(100)])
if sys.argv[1] == "fast":
    fastmodule.accelerate(m)
zero = {k: torch.zeros_like(v) for k, v in m.state_dict().items()}
m.state_dict(); m.state_dict(); m.load_state_dict(zero); m.load_state_dict(zero)
stop = threading.Event()
def work():
    while not stop.is_set():
        m.state_dict(); m.load_state_dict(zero); m.zero_grad(); m.train(); m.eval()
t = threading.Thread(target=work); t.start()
off = 0
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    if not gc.isenabled():
        off += 1
stop.set(); t.join()
print(off)
"""


@pytest.mark.parametrize("script", ["state_dict_mixed", "gc_seen_off"])
def test_threaded_replays_give_only_serial_outcomes(script: str) -> None:
    """The count of impossible outcomes is 0 on both sides (stock checks the test)."""
    source = {"state_dict_mixed": STATE_DICT_MIXED, "gc_seen_off": GC_SEEN_OFF}[script]
    # Both sides at once (each is mostly importing torch).
    runs = {
        side: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(source), side, "1.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for side in ("stock", "fast")
    }
    for side, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
        assert out.split()[-1] == "0", (side, out)
