"""``from fastmodule import nn``: a drop-in for ``torch.nn``.

``nn.Module`` is :class:`fastmodule.Module`. Every other name is torch's own
object: module classes (``nn.Linear``, ``nn.Sequential``, ...) are torch's very
classes, accelerated in place when first read from here (so ``isinstance``
and exact-type checks hold trivially), and everything else (``functional``,
``init``, ``Parameter``, ``Buffer``, ``utils``, ...) is untouched.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.nn as _torch_nn

from fastmodule import _core
from fastmodule.module import NATIVE, Module

# `import fastmodule.nn.functional as F` and friends: torch's own modules.
for _name in ("functional", "init", "utils", "parameter", "modules", "parallel", "attention"):
    _sub = getattr(_torch_nn, _name, None)
    if _sub is not None:
        sys.modules[f"{__name__}.{_name}"] = _sub


def __getattr__(name: str) -> Any:
    try:
        obj = getattr(_torch_nn, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module) and obj is not torch.nn.Module:
        if NATIVE and not issubclass(obj, Module):  # (else nothing native is on)
            _core.accelerate_class(obj)
    return obj


def __dir__() -> list[str]:
    return sorted(set(dir(_torch_nn)) | {"Module"})


__all__ = sorted({n for n in dir(_torch_nn) if not n.startswith("_")} | {"Module"})
