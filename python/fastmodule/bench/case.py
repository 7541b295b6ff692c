"""The benchmark case type and the helpers every group of cases shares.

A :class:`Case` builds three :class:`Variant` objects: the same work on stock
``torch.nn.Module``, on ``fastmodule.Module`` and without module machinery (the lower
bound). A variant is a statement plus the namespace it runs in, so the runner can time
it in a tight compiled loop (``timeit``) and pytest-benchmark can turn it into a plain
callable.

Also here: the columns (:data:`KINDS`), the size factor of the whole-tree cases
(:func:`set_scale`, :func:`scaled`), :func:`pair` (a stock and a fast class from the
*same* function objects, so the only difference between the two columns is the base
class), :func:`three` (bundle and warm the three variants), and the helpers of the
real-model groups (:func:`direct_forward`, :func:`sync_for`, :func:`decode`,
:func:`have`).

The groups of cases (:mod:`~fastmodule.bench.synthetic`,
:mod:`~fastmodule.bench.hook_cases`, :mod:`~fastmodule.bench.models`,
:mod:`~fastmodule.bench.user_cases`, :mod:`~fastmodule.bench.workloads`) import this
module;
:mod:`~fastmodule.bench.registry` lists them all. This module imports no group.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fastmodule.module import Module

__all__ = [
    "KINDS",
    "Case",
    "Variant",
    "decode",
    "direct_forward",
    "have",
    "pair",
    "scaled",
    "set_scale",
    "sync_for",
    "three",
]

#: The three columns of every case, in the order they are timed.
KINDS: tuple[str, ...] = ("stock", "fast", "lower")

#: Size factor of the whole-tree cases (``--quick`` runs them on smaller trees).
_SCALE = [1.0]


def set_scale(scale: float) -> None:
    """Scale the trees of the whole-tree cases (1.0: the sizes in their descriptions)."""
    _SCALE[0] = scale


def scaled(n: int) -> int:
    """``n`` times the current scale, at least 1."""
    return max(1, round(n * _SCALE[0]))


@dataclass(frozen=True)
class Variant:
    """One side of a case: ``stmt`` executed with ``namespace`` as globals."""

    stmt: str
    namespace: dict[str, Any]
    #: Context entered around the whole timed loop (e.g. ``torch.inference_mode``).
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    #: Called before each clock read (e.g. ``torch.cuda.synchronize``); ``None`` for CPU.
    sync: Callable[[], None] | None = None

    def as_callable(self) -> Callable[[], None]:
        """Compile ``stmt`` into a zero-argument function (for pytest-benchmark)."""
        ns = dict(self.namespace)
        body = textwrap.indent(self.stmt, "    ")  # every line, as timeit's template does
        exec(compile(f"def _op():\n{body}\n", "<bench>", "exec"), ns)
        return ns["_op"]


@dataclass(frozen=True)
class Case:
    """A named benchmark: ``build(device)`` returns ``{"stock", "fast", "lower"}`` variants."""

    name: str
    description: str
    build: Callable[[torch.device], dict[str, Variant]] = field(repr=False)
    #: Whether the case honours ``--device`` (only ``mlp64`` does).
    uses_device: bool = False
    #: Whether a plain ``fastmodule bench`` runs it; the others (the ``root_*`` and
    #: ``step_*`` groups) run when ``--only`` names them or a pattern matches them.
    default: bool = True


def pair(
    name: str, body: dict[str, Any], **per_side: tuple[Any, Any]
) -> tuple[type[nn.Module], type[nn.Module]]:
    """Build ``Stock<name>`` and ``Fast<name>`` sharing the very same methods.

    ``per_side`` maps class attributes to a ``(stock_value, fast_value)`` pair. The
    classes' ``__module__`` is the calling module's (where their names are bound).
    """
    module = sys._getframe(1).f_globals.get("__name__", __name__)
    classes = []
    for i, (prefix, base) in enumerate((("Stock", nn.Module), ("Fast", Module))):
        ns = {"__module__": module, **body, **{k: v[i] for k, v in per_side.items()}}
        classes.append(type(f"{prefix}{name}", (base,), ns))
    return classes[0], classes[1]


def three(stock: Variant, fast: Variant, lower: Variant) -> dict[str, Variant]:
    """Bundle the three variants, running each once so timing starts in steady state."""
    variants = {"stock": stock, "fast": fast, "lower": lower}
    for v in variants.values():
        with v.context():
            v.as_callable()()
    return variants


def _direct_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return self.forward(*args, **kwargs)


@contextlib.contextmanager
def direct_forward() -> Iterator[None]:
    """Module calls go straight to ``forward`` (hooks and all machinery skipped)."""
    original = nn.Module.__dict__["__call__"]
    nn.Module.__call__ = _direct_call  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.__call__ = original  # type: ignore[method-assign]


def sync_for(device: torch.device) -> Callable[[], None] | None:
    """What to call before each clock read on ``device`` (``None`` for CPU)."""
    return torch.cuda.synchronize if device.type == "cuda" else None


def _cache_argument(model: nn.Module) -> str:
    """The name under which the installed transformers takes and returns the KV cache
    (``cache`` in recent releases, ``past_key_values`` before)."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def decode(model: nn.Module, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy token-by-token decoding with the KV cache: ``steps`` model calls."""
    name = _cache_argument(model)
    out = model(ids, use_cache=True)
    token = out.logits[:, -1:].argmax(-1)
    tokens = [token]
    for _ in range(steps - 1):
        out = model(token, use_cache=True, **{name: getattr(out, name)})
        token = out.logits[:, -1:].argmax(-1)
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def have(package: str) -> bool:
    """Whether ``package`` is installed (cases needing a missing one are not offered)."""
    return importlib.util.find_spec(package) is not None
