"""Shared fixtures: every behaviour test runs on stock torch.nn.Module and on fastmodule.
Every test also runs under ``process_state_kept`` (tests/isolation.py): the same
process-wide state before it, whatever ran earlier.

Where no native path is on (an interpreter fastmodule has not verified; forced with
``FASTMODULE_UNVERIFIED=1``, ``make test-unverified``) every fastmodule path runs
torch's code: the parity tests run there too and must pass (fast is stock by
construction). A test of what only the native paths do (their counters, plans, slots,
frames, ``_core`` internals) carries ``@pytest.mark.requires_native("what it
checks")`` (or ``pytestmark = pytest.mark.requires_native(...)`` for a whole file)
and is skipped there, with that reason; ``NATIVE`` says which mode runs, for a check
whose answer differs by design (``fastmodule.is_accelerated`` is False there).
"""

from __future__ import annotations

import gc
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import fastmodule
from fastmodule._verified import verification
from tests.isolation import (
    at_fixed_depth,
    process_state_kept,  # noqa: F401 - autouse, found by its name here
)

BASES = [torch.nn.Module, fastmodule.Module]
IDS = ["stock", "fast"]

#: Why no native path is on in this process (then every fastmodule path runs torch's
#: code), or None.
NO_NATIVE = verification.native_problem()
#: Are fastmodule's native paths on in this process?
NATIVE = NO_NATIVE is None


# The one warning ``import fastmodule`` gives where no native path is on, as a fresh
# process prints it on stderr: ``FILE:LINE: UnverifiedWarning: MESSAGE``, then the
# importing line's source, if Python finds it.
_IMPORT_WARNING = re.compile(
    r"^[^\n]*: UnverifiedWarning: fastmodule: [^\n]*\n(?:[ \t]+[^\n]*\n)?", re.MULTILINE
)


def without_import_warning(stderr: str) -> str:
    """``stderr`` of a fresh process that imported fastmodule, without the warning import
    gives where no native path is on (the process's other output must be as where it is
    on); unchanged where they are on."""
    return stderr if NATIVE else _IMPORT_WARNING.sub("", stderr, count=1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires_native(why): the test checks what only fastmodule's native paths do "
        "(why: what); skipped where no native path is on",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``requires_native`` becomes a skip, with its reason, where no native path is on."""
    if NATIVE:
        return
    for item in items:
        mark = item.get_closest_marker("requires_native")
        if mark is not None:
            why = mark.args[0] if mark.args else mark.kwargs.get("why", "native internals")
            item.add_marker(pytest.mark.skip(reason=f"no native path ({NO_NATIVE}): {why}"))


@pytest.fixture(params=BASES, ids=IDS)
def base(request: pytest.FixtureRequest) -> type[torch.nn.Module]:
    """The module base class under test."""
    return request.param


def outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """Run ``fn`` and describe what happened: its value or its exception type and text."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the exception *is* the result under test
        return ("raised", type(e), str(e))


def state(m: torch.nn.Module) -> dict[str, Any]:
    """Registries and plain attributes of one module, by name and identity."""
    d = m.__dict__
    plain = {k: v for k, v in d.items() if not k.startswith("_") and k != "training"}
    return {
        "params": {k: id(v) if v is not None else None for k, v in d["_parameters"].items()},
        "buffers": {k: id(v) if v is not None else None for k, v in d["_buffers"].items()},
        "modules": {k: id(v) if v is not None else None for k, v in d["_modules"].items()},
        "non_persistent": set(d["_non_persistent_buffers_set"]),
        "plain": {k: id(v) for k, v in plain.items()},
    }


def high_then_low_limit(
    call: Callable[[], Any], then: Callable[[], Any] | None = None
) -> tuple[Any, Any]:
    """``call()`` three times under a recursion limit of 20000 (a deep tree's walk
    records), then ``then()`` (default ``call``) once under 1000: the outcomes, the
    last without an exception's text (how far a walk got before the limit depends
    on how many Python frames each level takes, which a native walk does not
    reproduce). Runs at a fixed depth (``at_fixed_depth``), so both limits leave the
    same headroom in any order and under any runner."""

    def scenario() -> tuple[Any, Any]:
        first = [outcome(call) for _ in range(3)]
        sys.setrecursionlimit(1000)
        second = outcome(then or call)
        return first, second[:2]

    return at_fixed_depth(scenario, limit=20000)


def assert_gc_state_kept(call: Callable[[], Any]) -> None:
    """``call()`` leaves the cyclic GC enabled or disabled as it found it (replays
    pause it)."""
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            call()
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


class LogFunctions(TorchFunctionMode):
    """Records the name of every torch function called under it."""

    def __init__(self, log: list[Any]) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.log.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


class LogOps(TorchDispatchMode):
    """Records every aten op dispatched under it."""

    def __init__(self, log: list[Any]) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.log.append(str(func))
        return func(*args, **(kwargs or {}))
