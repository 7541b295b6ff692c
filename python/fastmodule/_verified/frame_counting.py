"""Which of torch's ``forward`` functions count their caller's frames.

A module call served natively has no ``_wrapped_call_impl``/``_call_impl``
frames. torch's own code that passes a ``stacklevel`` (or reads frames) from a
``forward`` would then point its warnings at another line than on stock, so
the call path runs such a call through torch's ``_wrapped_call_impl`` instead.
``classify`` is asked once per code object (``fastmodule._core`` remembers
the answer); user code is not classified, see the README on frames.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator

import torch
import torch.nn.modules.activation as _activation

from fastmodule import _core

__all__ = ["ALWAYS", "NONE", "WHEN_DIM_NONE", "classify"]

#: Runs without torch's call frames as stock runs with them.
NONE = 0
#: Needs torch's call frames while ``self.dim`` is None: ``F.softmax``,
#: ``F.softmin`` and ``F.log_softmax`` warn (counting frames) only then.
WHEN_DIM_NONE = 1
#: Needs torch's call frames on every call.
ALWAYS = 2

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

# Words in a code object that count frames: the keyword of `warnings.warn` and
# of torch's softmax family, and the frame accessors.
_STACKLEVEL = frozenset({"stacklevel", "_stacklevel"})
_FRAME_NAMES = frozenset({"_getframe", "currentframe", "_getframemodulename"})

# torch's forwards whose only frame counting is the softmax family's
# `_stacklevel=5`, passed with `self.dim` (warns only when it is None) or with
# a constant dim (never warns).
_DIM_NONE_CODES = tuple(
    cls.forward.__code__
    for cls in (_activation.Softmax, _activation.Softmin, _activation.LogSoftmax)
)
_CONSTANT_DIM_CODES = (_activation.Softmax2d.forward.__code__,)


def _constants(code: types.CodeType) -> Iterator[object]:
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _constants(c)
        elif isinstance(c, tuple):  # keyword names of a call
            yield from c
        else:
            yield c


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def _counts_frames(code: types.CodeType) -> bool:
    return any(isinstance(c, str) and c in _STACKLEVEL for c in _constants(code)) or any(
        n in _FRAME_NAMES for n in _names(code)
    )


def classify(code: types.CodeType) -> int:
    """``NONE``, ``WHEN_DIM_NONE`` or ``ALWAYS`` for a ``forward``'s code."""
    if not code.co_filename.startswith(_TORCH_DIR) or not _counts_frames(code):
        return NONE
    if any(code is c for c in _DIM_NONE_CODES):
        return WHEN_DIM_NONE
    if any(code is c for c in _CONSTANT_DIM_CODES):
        return NONE
    return ALWAYS


def install() -> None:
    """Register :func:`classify` with the call path (at start-up)."""
    _core.init_frame_counting(classify)
