"""``load_state_dict`` in linear time, with torch's semantics.

torch's ``load_state_dict`` hands each child the entries of its parent's dict
whose key starts with ``prefix + name + "."``, rebuilding that sub-dict by a
scan of the whole parent dict per child: quadratic in a module's width. The
walk runs in Rust (``fastmodule._core``, module ``state_dict``): the parent dict
is split once into per-child buckets (same entries, same order), rebuilt if
anything mutates it while its children load, and torch's own scan is used
whenever a key or child name is not a plain ``str``. Each module's
``_load_from_state_dict`` runs natively in the common case (torch's method,
no pre-hooks, exact tensors of matching shapes: ``copy_`` under ``no_grad``),
and otherwise as the module's own method, exactly as torch calls it, with the
same metadata, key lists, post-hooks and errors. The argument checks and final
messages below are torch's texts.
"""

from __future__ import annotations

import dis
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.nn.modules.module import _IncompatibleKeys

from fastmodule import _core
from fastmodule._methods.dispatch import torch_constant, torch_method
from fastmodule._verified.inline_routes import original_code

__all__ = ["load_state_dict"]


def _texts() -> dict[str, str] | None:
    """torch's message templates, read from its code (so they always match)."""
    wanted = {
        "missing": "Missing key(s) in state_dict: ",
        "unexpected": "Unexpected key(s) in state_dict: ",
        "error": "Error(s) in loading state_dict for ",
        "post_hook": "Hooks registered with ``register_load_state_dict_post_hook``",
    }
    found = {key: torch_constant("load_state_dict", start) for key, start in wanted.items()}
    if any(text is None for text in found.values()):
        return None
    return {key: text for key, text in found.items() if text is not None}


_TEXTS = _texts()


def copy_error(key: str, param: torch.Tensor, input_param: torch.Tensor, ex: Exception) -> str:
    """torch's message for a ``copy_`` that raised while loading ``key``."""
    return (
        f'While copying the parameter named "{key}", '
        f"whose dimensions in the model are {param.size()} and "
        f"whose dimensions in the checkpoint are {input_param.size()}, "
        f"an exception occurred : {ex.args}."
    )


def copy_one(key: str, param: Any, input_param: Any, error_msgs: list[str]) -> None:
    """torch's step of ``_load_from_state_dict`` for one pair (no swap, no assign:
    the native load's case). The native copies hand a pair here when it is no
    longer the plain case it was when checked: an earlier ``copy_`` released the
    GIL, and another thread changed a shape, a device or a type since."""
    if not torch.overrides.is_tensor_like(input_param):
        error_msgs.append(
            f'While copying the parameter named "{key}", '
            "expected torch.Tensor or Tensor-like object from checkpoint but "
            f"received {type(input_param)}"
        )
        return
    is_param_lazy = torch.nn.parameter.is_lazy(param)
    if (
        not is_param_lazy
        and len(param.shape) == 0
        and len(input_param.shape) == 1
        and input_param.shape[0] == 1
    ):
        input_param = input_param[0]
    if not is_param_lazy and input_param.shape != param.shape:
        error_msgs.append(
            f"size mismatch for {key}: copying a param with shape {input_param.shape} from "
            f"checkpoint, the shape in current model is {param.shape}."
        )
        return
    if param.is_meta and not input_param.is_meta:
        warnings.warn(
            f"for {key}: copying from a non-meta parameter in the checkpoint to a meta "
            "parameter in the current model, which is a no-op. (Did you mean to "
            "pass `assign=True` to assign items in the state dictionary to their "
            "corresponding key in the module instead of copying them in place?)",
            stacklevel=2,
        )
    try:
        with torch.no_grad():
            param.copy_(input_param)
    except Exception as ex:
        error_msgs.append(copy_error(key, param, input_param, ex))


def load_tail(
    module: torch.nn.Module,
    state_dict: Mapping[str, Any],
    prefix: str,
    local_state: Mapping[str, Any],
    missing_keys: list[str],
    unexpected_keys: list[str],
) -> None:
    """torch's end of ``_load_from_state_dict`` (strict, as its ``load`` calls it),
    after the copies: the extra state and the unexpected-key scan, reading
    ``self.__class__.set_extra_state`` and ``self._modules`` then. The native load
    hands them here when either changed during its copies (which released the GIL)."""
    extra_state_key = prefix + "_extra_state"
    base = torch.nn.Module.set_extra_state
    if getattr(module.__class__, "set_extra_state", base) is not base:
        if extra_state_key in state_dict:
            module.set_extra_state(state_dict[extra_state_key])
        else:
            missing_keys.append(extra_state_key)
    elif extra_state_key in state_dict:
        unexpected_keys.append(extra_state_key)
    for key in state_dict:
        if key.startswith(prefix) and key != extra_state_key:
            input_name = key[len(prefix) :].split(".", 1)
            if len(input_name) > 1:
                if input_name[0] not in module._modules:
                    unexpected_keys.append(key)
            elif input_name[0] not in local_state:
                unexpected_keys.append(key)


def _torch_load_call() -> Callable[..., None]:
    """``module._load_from_state_dict(...)`` called from a frame that reads as
    torch's own ``load`` (nested in ``load_state_dict``): torch's file, module
    globals and the line of its call. ``warnings.warn(stacklevel=2)`` inside
    ``_load_from_state_dict`` (torch's meta-parameter warning, or an
    override's) takes its filename, line, module name and registry from that
    frame, so filters by module and "once per location" match as in torch."""
    outer = original_code("load_state_dict")
    load = next(
        (c for c in outer.co_consts if isinstance(c, types.CodeType) and c.co_name == "load"),
        outer,
    )
    line = load.co_firstlineno
    found = False
    for ins in dis.get_instructions(load):
        if ins.argval == "_load_from_state_dict":
            found = True
        elif found and ins.opname.startswith("CALL") and ins.positions is not None:
            line = ins.positions.lineno or line
            break
    # One line, so that the call instruction is at torch's line.
    source = "\n" * (line - 1) + (
        "def load(module, state_dict, prefix, local_metadata, strict, missing, unexpected, "
        "errors): return module._load_from_state_dict(state_dict, prefix, local_metadata, "
        "strict, missing, unexpected, errors)\n"
    )
    compiled = compile(source, outer.co_filename, "exec", dont_inherit=True)
    code = next(c for c in compiled.co_consts if isinstance(c, types.CodeType))
    code = code.replace(co_qualname=load.co_qualname)
    return types.FunctionType(code, vars(torch.nn.modules.module), "load")


def install() -> None:
    """Hand the core what the native load walk needs (at start-up)."""
    _core.init_load(
        {
            "load_from_state_dict": torch.nn.Module.__dict__["_load_from_state_dict"],
            "set_extra_state": torch.nn.Module.__dict__["set_extra_state"],
            "incompatible_keys": _IncompatibleKeys,
            "copy_error": copy_error,
            "copy_one": copy_one,
            "load_tail": load_tail,
            "load_call": _torch_load_call(),
        }
    )


def _load_state_dict(
    self: torch.nn.Module, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
) -> Any:
    texts = _TEXTS or {}
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
    missing: list[str] = []
    unexpected: list[str] = []
    errors: list[str] = []
    metadata = getattr(state_dict, "_metadata", None)
    # An unchanged tree whose dict holds exactly its keys: copied from the
    # recorded walk, reading the caller's dict (no hook sees torch's copy);
    # a module changed meanwhile (copy_ lets other threads run) loads live.
    if not _core.load_replay(
        self, state_dict, metadata, assign, missing, unexpected, errors, texts["post_hook"]
    ):
        # A copy, as torch makes: _load_from_state_dict may edit it.
        root = OrderedDict(state_dict)
        if metadata is not None:
            root._metadata = metadata  # type: ignore[attr-defined]
        _core.load_tree(
            self, root, metadata, assign, missing, unexpected, errors, texts["post_hook"]
        )
    if strict:
        if unexpected:
            quoted = ", ".join(f'"{k}"' for k in unexpected)
            errors.insert(0, texts["unexpected"].format(quoted))
        if missing:
            quoted = ", ".join(f'"{k}"' for k in missing)
            errors.insert(0, texts["missing"].format(quoted))
    if errors:
        raise RuntimeError(texts["error"].format(self.__class__.__name__, "\n\t".join(errors)))
    return _IncompatibleKeys(missing, unexpected)


load_state_dict = torch_method("load_state_dict", _load_state_dict, usable=_TEXTS is not None)
