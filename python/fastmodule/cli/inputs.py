"""The example inputs of ``python -m fastmodule check``: the factory's, or random
tensors from ``--input SHAPE[:DTYPE]``; the model and inputs moved to ``--device`` and
converted to ``--dtype``."""

from __future__ import annotations

from typing import Any

import torch

from fastmodule.cli.factory import Loaded
from fastmodule.tools.check.runs import Inputs

__all__ = ["InputError", "parse_input", "prepare"]

#: Integer inputs are drawn from 0 to this (exclusive): valid ids for any vocabulary.
INT_HIGH = 16


class InputError(Exception):
    """Inputs that cannot be used; the text says what to do."""


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise InputError(f"unknown dtype {name!r}: use a torch dtype name such as float32")
    return value


def parse_input(spec: str, generator: torch.Generator) -> torch.Tensor:
    """``1x3x224x224`` -> a float32 randn tensor; ``1x8:int64`` -> integers 0-15."""
    shape_text, _, dtype_text = spec.partition(":")
    try:
        shape = [int(n) for n in shape_text.lower().split("x")]
    except ValueError:
        raise InputError(
            f"--input {spec!r}: expected SHAPE[:DTYPE] such as 1x3x224x224 or 1x8:int64"
        ) from None
    if any(n < 0 for n in shape):
        raise InputError(f"--input {spec!r}: negative size")
    dtype = _dtype(dtype_text) if dtype_text else torch.float32
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    return torch.randint(0, INT_HIGH, shape, generator=generator, dtype=dtype)


def _as_inputs(example: Any) -> Inputs:
    if example is None:
        return Inputs((), {})
    if isinstance(example, dict):
        return Inputs((), dict(example))
    if type(example) in (tuple, list):
        return Inputs(tuple(example), {})
    return Inputs((example,), {})


def _moved(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device=device)
    if type(value) in (tuple, list):
        return type(value)(_moved(v, device, dtype) for v in value)
    if type(value) is dict:
        return {k: _moved(v, device, dtype) for k, v in value.items()}
    return value


def prepare(
    loaded: Loaded, specs: list[str] | None, dtype: str | None, device: str
) -> tuple[torch.nn.Module, Inputs]:
    """The model and inputs ``check`` runs on.

    Raises:
        InputError: no inputs at all, a malformed ``--input``, an unknown or
            non-floating dtype, an unusable device, or moving the model there raised.
    """
    if specs:
        generator = torch.Generator().manual_seed(0)
        inputs = Inputs(tuple(parse_input(s, generator) for s in specs), {})
    else:
        inputs = _as_inputs(loaded.example_inputs)
        if not inputs.args and not inputs.kwargs:
            raise InputError(
                f"{loaded.spec} gave a model without example inputs: pass --input SHAPE "
                "(e.g. --input 1x3x224x224), or return (model, example_inputs) from the factory"
            )
    try:
        target = torch.device(device)
        if target.type == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda: CUDA is not available here")
    except RuntimeError as e:
        raise InputError(f"--device {device!r}: {e}") from None
    to_dtype = _dtype(dtype) if dtype else None
    if to_dtype is not None and not to_dtype.is_floating_point:
        raise InputError(
            f"--dtype {dtype}: not a floating-point dtype; --dtype converts the model's "
            "floating-point parameters, buffers and inputs, so use float64, float32, "
            "float16 or bfloat16 (integer inputs such as token ids: --input 1x8:int64)"
        )
    try:
        model = loaded.model.to(device=target)
        if to_dtype is not None:
            model = model.to(dtype=to_dtype)
        moved = Inputs(
            _moved(inputs.args, target, to_dtype), _moved(inputs.kwargs, target, to_dtype)
        )
    except (RuntimeError, TypeError, ValueError) as e:
        where = f"--device {device}" + (f" --dtype {dtype}" if dtype else "")
        raise InputError(
            f"{where}: moving the model and inputs raised {type(e).__name__}: {e}"
        ) from e
    return model, moved
