"""Turning fastmodule off: ``fastmodule.disabled()`` and ``FASTMODULE_DISABLE=1``.

While fastmodule is off, every native path hands over to torch's own code at its
first step (module calls, attribute reads, registration, whole-tree methods,
container methods, torch's layers): accelerated classes and ``fastmodule.Module``
subclasses behave, and cost, exactly as stock modules, so one line rules
fastmodule in or out of a difference. The switch is process-wide (other threads
run torch's code meanwhile too). ``FASTMODULE_DISABLE=1`` (``true``/``yes``/``on``)
in the environment when fastmodule is imported keeps it off for the whole
process; ``disabled()`` blocks nest.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from fastmodule import _core
from fastmodule._verified import verification

__all__ = ["ENV_VAR", "disabled", "is_disabled", "switch_state"]

#: The environment variable read at import.
ENV_VAR = "FASTMODULE_DISABLE"

_ON_WORDS = frozenset({"1", "true", "yes", "on"})

#: Off for the whole process (the environment asked for it at import).
_FROM_ENV = os.environ.get(ENV_VAR, "").strip().lower() in _ON_WORDS

# Open ``disabled()`` blocks, counted under a lock (they may open and close in any
# thread).
_lock = threading.Lock()
_depth = 0

_NATIVE = verification.native_problem() is None


def _apply() -> None:
    if _NATIVE:
        _core.set_switched_off(_FROM_ENV or _depth > 0)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """``with fastmodule.disabled():`` every native path runs torch's own code
    inside the block (process-wide; blocks nest).

    Example::

        with fastmodule.disabled():
            expected = model(x)  # exactly stock, whatever was accelerated
    """
    global _depth
    with _lock:
        _depth += 1
        _apply()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            _apply()


def is_disabled() -> bool:
    """Is fastmodule switched off right now (by ``disabled()`` or the environment)?"""
    return _FROM_ENV or _depth > 0


def switch_state() -> str:
    """The switch in words, for ``fastmodule doctor``."""
    if _FROM_ENV:
        return f"off: {ENV_VAR} is set, every native path runs torch's code"
    if _depth > 0:
        return "off: inside fastmodule.disabled(), every native path runs torch's code"
    return f"on (fastmodule.disabled() or {ENV_VAR}=1 turn every native path off)"


def install() -> None:
    """Apply ``FASTMODULE_DISABLE`` from the environment (at start-up)."""
    _apply()
