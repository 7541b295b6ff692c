"""``_apply`` for ``fastmodule.Module``: what ``.to()``, ``.float()``, ``.half()``,
``.cpu()``, ``.cuda()``, ``.type()`` and ``to_empty()`` run.

torch's ``to``/``float``/... stay torch's own methods; they end in
``self._apply(fn)``, which on a ``fastmodule.Module`` walks the tree in Rust
(``fastmodule._core``, module ``apply``). This file supplies what the native
walk needs from Python: torch's callables, the code objects of torch's own
conversion closures (recognised so that a conversion that changes nothing
costs almost nothing), and :func:`resume`, which lets torch's own code finish
a module whose conversion left the common case halfway through.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastmodule import _core
from fastmodule._methods.dispatch import torch_code, torch_method
from fastmodule._verified import verification

# The name torch's module globals give the walk too: the body runs with them
# (see fastmodule._methods.dispatch).
_fastmodule_walk = _core.walk

__all__ = ["KNOWN", "apply_fn"]

# torch's own `_apply` code (not routed back to the native walk).
_TORCH_APPLY = torch_code("_apply")
_NOT_CALLED = object()


def resume(
    module: torch.nn.Module,
    fn: Callable[[torch.Tensor], Any],
    answered: int,
    result: Any = _NOT_CALLED,
) -> None:
    """Run torch's ``_apply(fn, recurse=False)`` on ``module`` after the native
    walk converted part of it.

    torch's code calls ``fn`` in a fixed order (each parameter, then its grad,
    then the buffers). The first ``answered`` calls were already made, and their
    tensors converted in place: replaying them returns the tensor itself, for
    which torch's update is a no-op. The next call was made too and returned
    ``result`` (when given), which torch now handles its own way; later calls
    reach ``fn``.
    """
    calls = 0

    def replay(t: torch.Tensor) -> Any:
        nonlocal calls
        calls += 1
        if calls <= answered:
            return t
        if calls == answered + 1 and result is not _NOT_CALLED:
            return result
        return fn(t)

    _TORCH_APPLY(module, replay, False)


def _closures(method: str) -> list[Any]:
    """Code objects of the functions nested in ``torch.nn.Module.<method>``."""
    return [c for c in torch.nn.Module.__dict__[method].__code__.co_consts if hasattr(c, "co_code")]


def _verified(method: str) -> bool:
    return verification.function_problem(f"torch.nn.modules.module:Module.{method}") is None


def _known() -> list[tuple[Any, str, Any]]:
    """torch's conversion closures whose result the native walk can predict
    (only in methods whose code fastmodule verified)."""
    known: list[tuple[Any, str, Any]] = []
    for method, dtype in (
        ("float", torch.float32),
        ("double", torch.float64),
        ("half", torch.float16),
        ("bfloat16", torch.bfloat16),
    ):
        codes = _closures(method) if _verified(method) else []
        # Exactly one closure without free variables that calls t.<method>().
        if len(codes) == 1 and not codes[0].co_freevars and method in codes[0].co_names:
            known.append((codes[0], "float_type", dtype))
    cpu = _closures("cpu") if _verified("cpu") else []
    if len(cpu) == 1 and not cpu[0].co_freevars and cpu[0].co_names == ("cpu",):
        known.append((cpu[0], "cpu", None))
    for code in _closures("to") if _verified("to") else []:
        names = code.co_freevars
        if code.co_name == "convert" and set(names) == {
            "convert_to_format",
            "device",
            "dtype",
            "non_blocking",
        }:
            cells = (names.index("convert_to_format"), names.index("device"), names.index("dtype"))
            known.append((code, "to", cells))
    return known


def _tensor_methods() -> list[tuple[str, Any]]:
    """The Tensor attributes torch's closures call and the native walk reads,
    as the type lookup finds them on ``torch.Tensor`` now."""
    names = ["float", "double", "half", "bfloat16", "cpu", "to", "is_floating_point"]
    names += ["is_complex", "dim", "dtype", "is_cpu", "device", "grad", "data"]
    out = []
    for name in names:
        for cls in torch.Tensor.__mro__:
            if name in cls.__dict__:
                out.append((name, cls.__dict__[name]))
                break
    return out


#: torch's conversion closures the native ``_apply`` recognises: (code, kind, detail).
KNOWN = _known()


def install() -> None:
    """Hand the core what the native ``_apply`` needs (at start-up)."""
    _core.init_apply(
        {
            "compatible": torch._has_compatible_shallow_copy_type,
            "resume": resume,
            "known": KNOWN,
            "tensor_methods": _tensor_methods(),
        }
    )


def _apply_fn(
    self: torch.nn.Module, fn: Callable[[torch.Tensor], Any], recurse: bool = True
) -> torch.nn.Module:
    return _fastmodule_walk("_apply", self, fn, recurse)


apply_fn = torch_method("_apply", _apply_fn, walked=True)
