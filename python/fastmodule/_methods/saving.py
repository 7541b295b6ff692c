"""``state_dict`` of ``fastmodule.Module``, walked natively.

The tree walk and each module's ``_save_to_state_dict`` run in Rust
(``fastmodule._core``, module ``state_dict``), following torch's code: the same
``destination`` and ``_metadata`` entries, pre- and post-hooks with their
public/private return rules, ``get_extra_state``, and each submodule's own
``state_dict``/``_save_to_state_dict`` where its class overrides them. The
positional-argument handling (and its FutureWarning) is here, as in torch.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fastmodule import _core
from fastmodule._methods.dispatch import caller_stacklevel, torch_constant, torch_method

__all__ = ["state_dict"]

_POSITIONAL_WARNING = torch_constant("state_dict", "Positional args are being deprecated")


def _state_dict(
    self: torch.nn.Module,
    *args: Any,
    destination: Any = None,
    prefix: str = "",
    keep_vars: bool = False,
) -> Any:
    if len(args) > 0:
        # Reached from torch's routed state_dict (an accelerated root): this frame
        # stands between torch's and the warning, so the level counts one more
        # (fastmodule.Module's own method warns itself, from torch's place).
        level = caller_stacklevel("state_dict")
        warnings.warn(_POSITIONAL_WARNING or "", FutureWarning, stacklevel=level)
        if destination is None:
            destination = args[0]
        if len(args) > 1 and prefix == "":
            prefix = args[1]
        if len(args) > 2 and keep_vars is False:
            keep_vars = args[2]
    return _core.walk("state_dict", self, destination, prefix, keep_vars)


state_dict = torch_method(
    "state_dict",
    _state_dict,
    usable=_POSITIONAL_WARNING is not None,
    positional=_POSITIONAL_WARNING,
)
