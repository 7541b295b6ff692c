"""``load_state_dict`` in linear time, with torch's semantics.

torch's ``load_state_dict`` hands each child the entries of its parent's dict
whose key starts with ``prefix + name + "."``, rebuilding that sub-dict by a
scan of the whole parent dict per child: quadratic in a module's width. Here the
parent dict is split once into per-child buckets (same entries, same order),
and everything else is torch's: each module's own ``_load_from_state_dict``
(overrides included) runs exactly as torch calls it, with the same metadata,
key lists, post-hooks and errors. The buckets are rebuilt if anything mutates
the parent dict while its children load, and the scan is torch's own whenever a
key or child name is not a plain ``str`` (its ``startswith`` may behave
differently) or a child name contains a dot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch.nn.modules.module import _IncompatibleKeys

from fastmodule import _core
from fastmodule._dispatch import torch_constant, torch_method

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


def _buckets(
    local: dict[str, Any], prefix: str, children: dict[str, Any]
) -> dict[str, dict[str, Any]] | None:
    """Split ``local`` by child name; None when torch's own scan must decide."""
    if type(prefix) is not str:
        return None
    for name in children:
        if type(name) is not str or "." in name:
            return None
    out: dict[str, dict[str, Any]] = {}
    start = len(prefix)
    for key, value in local.items():
        if type(key) is not str:
            return None
        if not key.startswith(prefix):
            continue
        head, dot, _ = key[start:].partition(".")
        if dot:
            bucket = out.get(head)
            if bucket is None:
                bucket = out[head] = {}
            bucket[key] = value
    return out


def _load(
    module: torch.nn.Module,
    local: dict[str, Any],
    prefix: str,
    metadata: Any,
    assign: bool,
    missing: list[str],
    unexpected: list[str],
    errors: list[str],
    post_hook_text: str,
) -> None:
    local_metadata = {} if metadata is None else metadata.get(prefix[:-1], {})
    if assign:
        local_metadata["assign_to_params_buffers"] = assign
    module._load_from_state_dict(local, prefix, local_metadata, True, missing, unexpected, errors)
    children = module._modules
    buckets: dict[str, dict[str, Any]] | None = None
    seen: Any = None
    for name, child in children.items():
        if child is None:
            continue
        child_prefix = prefix + name + "."
        # Rebuild if a hook changed the parent's dict (entries or order) or
        # the children while earlier children loaded.
        versions = (_core.dict_version(local), _core.dict_version(children))
        if buckets is None or None in versions or versions != seen:
            buckets = _buckets(local, prefix, children)
            seen = versions
        if buckets is not None:
            # A fresh dict per child, as torch builds one.
            child_local = buckets.pop(name, None) or {}
        else:
            child_local = {k: v for k, v in local.items() if k.startswith(child_prefix)}
        _load(
            child, child_local, child_prefix, metadata, assign,
            missing, unexpected, errors, post_hook_text,
        )  # fmt: skip
    incompatible = _IncompatibleKeys(missing, unexpected)
    for hook in module._load_state_dict_post_hooks.values():
        if hook(module, incompatible) is not None:
            raise AssertionError(post_hook_text)


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
    # A copy, as torch makes: _load_from_state_dict may edit it.
    root = OrderedDict(state_dict)
    if metadata is not None:
        root._metadata = metadata  # type: ignore[attr-defined]
    _load(self, root, "", metadata, assign, missing, unexpected, errors, texts["post_hook"])
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
