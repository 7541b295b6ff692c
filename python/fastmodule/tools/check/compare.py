"""Exact comparison of two results (tensors, containers of them, model outputs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["differences", "detached"]


def detached(value: Any) -> Any:
    """``value`` with every tensor detached and cloned (kept for comparing later)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: detached(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(detached(v) for v in value))
    if type(value) in (list, tuple):
        return type(value)(detached(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [detached(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: detached(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _tensor_difference(path: str, a: torch.Tensor, b: torch.Tensor) -> str | None:
    for what, x, y in (
        ("dtype", a.dtype, b.dtype),
        ("shape", tuple(a.shape), tuple(b.shape)),
        ("device", a.device, b.device),
        ("layout", a.layout, b.layout),
    ):
        if x != y:
            return f"{path}: {what} {x} != {y}"
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    if a.is_floating_point() or a.is_complex():
        # Bitwise, so NaNs in the same places with the same payload compare equal and
        # -0.0 differs from 0.0: "exactly the same numbers".
        same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    else:
        same = torch.equal(a, b)
    if same:
        return None
    if a.is_floating_point():
        diff = (a.double() - b.double()).abs()
        finite = diff[torch.isfinite(diff)]
        worst = f"max abs difference {finite.max().item():.3g}" if finite.numel() else "NaN/inf"
        count = int((a != b).sum().item())
        return f"{path}: {count} of {a.numel()} values differ ({worst})"
    return f"{path}: values differ"


def differences(a: Any, b: Any, path: str = "output", limit: int = 20) -> list[str]:
    """Where ``a`` and ``b`` differ (at most ``limit`` entries; empty: identical)."""
    out: list[str] = []
    _walk(a, b, path, out, limit)
    return out


def _walk(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            out.append(f"{path}: {type(a).__name__} != {type(b).__name__}")
            return
        found = _tensor_difference(path, a, b)
        if found:
            out.append(found)
        return
    if type(a) is not type(b):
        out.append(f"{path}: {type(a).__name__} != {type(b).__name__}")
        return
    if isinstance(a, Mapping):
        if list(a.keys()) != list(b.keys()):
            out.append(f"{path}: keys {list(a.keys())} != {list(b.keys())}")
            return
        for key in a:
            _walk(a[key], b[key], f"{path}[{key!r}]", out, limit)
        return
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}[{i}]", out, limit)
        return
    try:
        same = bool(a == b)
    except Exception:  # noqa: BLE001 - an object without a usable ==: compare identity
        same = a is b
    if not same:
        out.append(f"{path}: {a!r} != {b!r}")
