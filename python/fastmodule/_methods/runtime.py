"""torch's runtime state that the native ``_apply`` and ``load_state_dict`` consult.

Grad mode (they run torch's ``with torch.no_grad():`` steps), whether a
torch-function or dispatch mode is active (modes observe every tensor
operation, so then only torch's own code runs), and ``torch.__future__``'s
conversion flags, whose getters are read without a frame while they are
torch's own.
"""

from __future__ import annotations

import torch

from fastmodule import _core

__all__: list[str] = []


def install() -> None:
    """Hand the core torch's runtime state (at start-up)."""
    _core.init_runtime(
        {
            "is_grad_enabled": torch.is_grad_enabled,
            "set_grad_enabled": torch._C._set_grad_enabled,
            "function_mode": torch._C._is_torch_function_mode_enabled,
            "dispatch_depth": torch._C._len_torch_dispatch_stack,
            "swap_flag": torch.__future__.get_swap_module_params_on_conversion,
            "overwrite_flag": torch.__future__.get_overwrite_module_params_on_conversion,
        }
    )
