"""Start-up: everything ``import fastmodule`` installs, in one place and in order.

Importing fastmodule's modules defines its classes and functions and answers what
it verifies about the interpreter and the installed torch (``fastmodule._verified``:
each answer is computed once, when first asked, and kept). It hands nothing to the
native core and writes nothing into torch's modules. :func:`start`, called once by
``fastmodule/__init__.py``, does all of that, in the order below.
"""

from __future__ import annotations

import torch

from fastmodule import _core, switch
from fastmodule._methods import conversion, dispatch, loading, runtime
from fastmodule._verified import (
    frame_counting,
    hook_dispatch,
    inline_routes,
    layers,
    verification,
)
from fastmodule.module import NATIVE, Module

__all__ = ["start"]

_started = False


def start() -> None:
    """Install what fastmodule installs, once (a second call changes nothing)."""
    global _started
    if _started:
        return
    _started = True
    if NATIVE:
        # 1. The route check (``inline_routes.ROUTE``, which fastmodule.Module's own
        #    methods and torch's prefixed code ask) becomes the native one, and torch's
        #    module gets the ``_fastmodule_accelerated`` flag the core keeps: both before
        #    any class can be accelerated (step 9 on).
        inline_routes.install_route_check()
        # 2. torch's module gets ``_fastmodule_walk``: the whole-tree bodies run with
        #    torch's module globals and call it by that name, as torch's prefixed code
        #    will (step 12).
        dispatch.install()
    # 3-8. What the native paths consult, each captured by the core once (also where no
    #    native path is on, and then never used), all before step 9 switches the native
    #    paths on. 3. torch's runtime state (grad mode, torch-function and dispatch
    #    modes, ``torch.__future__``'s conversion flags) first: the native ``_apply`` and
    #    ``load_state_dict`` of steps 4-5 read it.
    runtime.install()
    conversion.install()  # 4. the native _apply: torch's conversion closures
    loading.install()  # 5. the native load walk: torch's per-module loading
    frame_counting.install()  # 6. which of torch's forwards count their caller's frames
    hook_dispatch.install()  # 7. forward hooks, where torch's hook code was verified
    layers.install()  # 8. layer forwards and container methods, where verified
    if NATIVE:
        # 9. The core captures torch's originals, routes torch's module functions through
        #    its vectorcalls and gives fastmodule.Module its slots: from here on the
        #    native paths are live (the core paths torch's code was not verified for stay
        #    off).
        _core.init(
            Module,
            [p for p, fns in verification.CORE_PATHS.items() if verification.path_problem(fns)],
        )
        # 10. libtorch's own jit-tracing check, found from torch's extension (the
        #     module call asks it; needs step 9's originals).
        _core.resolve_tracing_probe(getattr(torch._C, "__file__", None))
        # 11. torch's own whole-tree methods run the same bodies for fast instances
        #     (accelerated classes included), wherever they are called from; each with
        #     a private copy of torch's code for fastmodule's own calls of it.
        _core.route_torch_methods(
            dispatch.BODIES, {name: dispatch.torch_code(name) for name in dispatch.BODIES}
        )
        # 12. Called from Python (CPython 3.11 skips the vectorcall; from 3.12 on it is
        #     not routed at all, see inline_routes): a statement in front of torch's code.
        inline_routes.install(dispatch.BODIES, dispatch.WALKED)
        # 13. Sealed after step 12, so what is recorded is their code as routed (and
        #     that of torch's functions the whole-tree bodies call or reproduce at every
        #     module): once one is replaced (hot reload, a test double), torch's code
        #     runs those calls.
        _core.seal_torch_methods(sorted(set(dispatch.BODIES) | set(dispatch.REPRODUCED)))
    # 14. Last, so that ``FASTMODULE_DISABLE=1`` covers every path installed above.
    switch.install()
