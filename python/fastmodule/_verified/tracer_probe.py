"""Find, once at import, where CPython keeps a thread's trace and profile functions.

While a trace or profile function is set (debuggers, ``cProfile``, coverage),
module calls run torch's own ``_wrapped_call_impl``/``_call_impl`` so those tools
see stock frames. The native check reads two fields of CPython's thread state,
whose offset differs between versions: a fresh thread sets functions of its own
and the extension locates them (``fastmodule._core.locate_tracer_fields``), then
confirms they clear when unset. If that fails the check stays off and
``tracer_check_known()`` says so.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from fastmodule import _core


def _marker_profile(*args: Any) -> None:
    return None


def _marker_trace(*args: Any) -> None:
    return None


def probe() -> bool:
    """Locate and confirm the fields in a fresh thread; True when the check is on."""
    result: list[bool] = []

    def run() -> None:
        found = False
        sys.setprofile(_marker_profile)
        sys.settrace(_marker_trace)
        try:
            found = _core.locate_tracer_fields(_marker_profile, _marker_trace)
        finally:
            sys.settrace(None)
            sys.setprofile(None)
        result.append(found and _core.confirm_tracer_fields())

    t = threading.Thread(target=run, name="fastmodule-tracer-probe")
    t.start()
    t.join()
    return bool(result and result[0])
