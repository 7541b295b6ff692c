"""``fastmodule.check(model, *args, **kwargs)``: is the accelerated model exactly the
stock one on these inputs, and how much faster is it?

Acceleration is per class and in place, so the comparison runs in one process on one
model object: stock, stock again (a model that differs from itself is reported as
nondeterministic), then accelerated, each from the same parameters, buffers, grads
and RNG states, in the same grad mode as the timing (a forward under
``torch.no_grad()``; with ``train``, a forward and backward with grad); then the three
ways of running it (stock, accelerated, ``torch.compile`` of a copy) are timed
interleaved. A model holding ``fastmodule.Module`` subclasses runs stock inside
``fastmodule.disabled()``. With ``method="get_action_and_value"`` (``predict``,
``generate``, ...) every run calls that method of the model instead of the model.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from typing import Any

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.modules.module import _forward_unimplemented

from fastmodule import _core
from fastmodule.acceleration import NATIVE, accelerated
from fastmodule.module import Module
from fastmodule.tools.check.compare import is_numpy_array
from fastmodule.tools.check.handovers import CallCount, count_handovers
from fastmodule.tools.check.parity import Parity, Ways, check_parity
from fastmodule.tools.check.report import CheckReport
from fastmodule.tools.check.runs import CheckError, Inputs, Snapshot, Way, run_once
from fastmodule.tools.check.timing import Timings, time_model
from fastmodule.tools.check.where import Divergence

__all__ = [
    "CallCount",
    "CheckError",
    "CheckReport",
    "Divergence",
    "Parity",
    "Timings",
    "check",
    "describe_inputs",
    "model_methods",
    "validate_method",
]

#: The grad mode of a forward check (parity and timing alike).
FORWARD_MODE = "forward under torch.no_grad()"
#: With ``train=True``.
TRAIN_MODE = "train step: forward + backward with grad, training mode"


def mode_of(what: str, train: bool) -> str:
    """The grad mode in words for a check that runs ``what`` (``forward`` or a method
    name): :data:`FORWARD_MODE` or :data:`TRAIN_MODE` with ``forward`` replaced."""
    return (TRAIN_MODE if train else FORWARD_MODE).replace("forward", what, 1)


def model_methods(model: torch.nn.Module) -> list[str]:
    """The public methods of ``model``'s class beyond ``torch.nn.Module``'s, sorted (what
    a ``method`` can name; ``forward`` when the class defines one)."""
    base = set(dir(torch.nn.Module)) - {"forward"}
    names = []
    for name in dir(type(model)):
        if name.startswith("_") or name in base:
            continue
        value = inspect.getattr_static(type(model), name, None)
        if isinstance(value, (staticmethod, classmethod)) or inspect.isfunction(value):
            if name == "forward" and value is _forward_unimplemented:
                continue
            names.append(name)
    return names


def _methods_hint(model: torch.nn.Module, method: str | None = None) -> str:
    names = model_methods(model)
    close = difflib.get_close_matches(method, names, n=1) if method else []
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    hint = f"its methods: {shown}" if names else "it defines no public methods"
    return f"did you mean {close[0]!r}? {hint}" if close else hint


def validate_method(model: torch.nn.Module, method: str | None) -> None:
    """Can ``check`` call ``model`` this way: ``method`` names a callable attribute of
    ``model``; with None, the model has a ``forward`` or its own ``__call__`` (a module
    without one, such as CleanRL's ``Agent``, is driven through a method).

    Raises:
        TypeError: ``method`` is not a string.
        ValueError: the model has no such method, it is not callable, or (``method``
            None) the model defines no ``forward``; the message says what to name.
    """
    cls = type(model).__qualname__
    if method is None:
        forward = getattr(model, "forward", None)
        own_call = any(
            getattr(type(model), name) is not getattr(torch.nn.Module, name)
            for name in ("__call__", "_call_impl")
        )
        if getattr(forward, "__func__", forward) is _forward_unimplemented and not own_call:
            raise ValueError(
                f"{cls} has no forward, so model(...) cannot run it: name the method that "
                f"does (method=NAME; on the command line --method NAME) ({_methods_hint(model)})"
            )
        return
    if not isinstance(method, str):
        raise TypeError(f"method must be a method's name (a str), got {type(method).__name__}")
    try:
        value = getattr(model, method)
    except AttributeError:
        value = None
    if value is None or getattr(value, "__func__", None) is _forward_unimplemented:
        raise ValueError(
            f"{cls} has no method {method!r}: name one it has ({_methods_hint(model, method)})"
        )
    if not callable(value):
        raise ValueError(
            f"{cls}.{method} is a {type(value).__name__}, not a method: name one it has "
            f"({_methods_hint(model)})"
        )


def _core_accelerated(cls: type) -> bool:
    return NATIVE and _core.is_accelerated_class(cls)


def describe_inputs(inputs: Inputs) -> str:
    """``1x3x224x224 float32`` for each tensor argument (``4x8 float32 ndarray`` for a
    NumPy array), ``name=...`` for keywords."""

    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            shape = "x".join(str(n) for n in value.shape) or "scalar"
            return f"{shape} {str(value.dtype).removeprefix('torch.')}"
        if is_numpy_array(value):
            shape = "x".join(str(n) for n in value.shape) or "scalar"
            return f"{shape} {value.dtype} ndarray"
        return type(value).__name__

    parts = [one(a) for a in inputs.args] + [f"{k}={one(v)}" for k, v in inputs.kwargs.items()]
    return ", ".join(parts) or "none"


def _stock_way(model: torch.nn.Module) -> Way:
    """How to run ``model`` stock: as it is (its classes are restored for the check),
    or inside ``fastmodule.disabled()`` when it holds ``fastmodule.Module`` subclasses
    (they have no stock class to restore)."""
    native = sorted({type(m).__qualname__ for m in model.modules() if isinstance(m, Module)})
    if not native:
        return contextlib.nullcontext
    import fastmodule  # upward: disabled() as users see it (an older fastmodule lacks it)

    disabled = getattr(fastmodule, "disabled", None)
    if disabled is None:
        raise CheckError(
            f"these classes are fastmodule.Module subclasses: {', '.join(native)}; they "
            "always run fastmodule's native paths, and comparing them with stock needs "
            "fastmodule.disabled(), which this fastmodule does not have yet. Build the "
            "model from torch.nn classes (check accelerates them itself), or update "
            "fastmodule"
        )
    return disabled


def _lazy_modules(model: torch.nn.Module) -> list[str]:
    return sorted(
        {
            type(m).__qualname__
            for m in model.modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()
        }
    )


def _materialise(model: torch.nn.Module, inputs: Inputs, stock: Way) -> list[str]:
    """Run ``model`` once stock, in eval mode without grad, so its lazy modules get
    their parameters; the rest is put back as it was (values, training flags, RNG).
    Returns the lazy classes it had.

    Raises:
        CheckError: the run raised.
    """
    lazy = _lazy_modules(model)
    if not lazy:
        return []
    snapshot = Snapshot(model)
    try:
        for m in model.modules():
            m.training = False
        result = run_once(model, inputs, snapshot, train=False, way=stock)
    finally:
        snapshot.restore()
    if result.error is not None:
        raise CheckError(
            "the model raised on these inputs in the first stock run (run to materialise "
            f"its lazy modules: {', '.join(lazy)}): {result.error}",
            run="first stock run (materialising lazy modules)",
            error=result.error,
        )
    return lazy


def _accelerated_classes(model: torch.nn.Module) -> list[type]:
    classes = {type(m): None for m in model.modules()}
    return [
        cls
        for cls in classes
        if NATIVE and not issubclass(cls, Module) and _core.is_accelerated_class(cls)
    ]


def check(
    model: torch.nn.Module,
    *example_args: Any,
    method: str | None = None,
    train: bool = False,
    timing: bool = True,
    compile: bool = True,
    repeats: int = 15,
    threads: int | None = None,
    progress: bool = True,
    **example_kwargs: Any,
) -> CheckReport:
    """Compare ``model(*example_args, **example_kwargs)`` stock and accelerated, exactly,
    and time both (and ``torch.compile`` unless ``compile=False``).

    With ``method`` (``"get_action_and_value"``, ``"predict"``, ``"generate"``), every
    run, timed ones included, calls ``getattr(model, method)(*example_args,
    **example_kwargs)`` instead, exactly as a user's code calls it, and that call's
    result is compared; ``torch.compile`` is timed as ``torch.compile`` of the bound
    method of a copy (a failure to compile it is noted, the rest stands).

    Each run is a forward (or the method) under ``torch.no_grad()``, for the comparison
    and the timing alike; with ``train=True`` it runs in training mode, with grad, then
    ``backward()`` of the sum of the floating-point outputs that require grad, and the
    grads are compared too (a method that runs under ``torch.no_grad()`` itself, such as
    ``predict`` or ``generate``, returns none: nothing is backpropagated, the grads stay
    None in every run). Whatever the model returns is compared: tensors bitwise, NumPy
    arrays by dtype, shape and bytes, containers, dataclasses, ``ModelOutput``s, caches
    and other objects field by field (see :mod:`fastmodule.tools.check.compare`). A run
    that raises is a result too: raising in one run and not in another, or differently,
    is a difference. On a difference the first module whose output differs is named
    (``report.parity.diverged``; with a method, the model itself when only the method's
    own code differs).

    Lazy modules are materialised by a first stock run; otherwise the parameters,
    buffers (the registered objects and their values), grads, training flags and RNG
    states of ``model`` are as before when this returns; classes that were accelerated
    before stay so. ``threads`` sets ``torch.set_num_threads`` for the check (None:
    as it is). ``str(report)`` is the formatted report.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``, or ``method`` not a str.
        ValueError: ``repeats`` or ``threads`` below 1; ``model`` has no method
            ``method``, or it is not callable; ``method`` is None and ``model`` has no
            ``forward`` (see :func:`validate_method`).
        CheckError: the model raised the same error in every run (it rejects the
            inputs; ``error.run`` says which run, ``error.error`` what it raised), or it
            holds ``fastmodule.Module`` subclasses and this fastmodule cannot run them
            stock.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fastmodule.check expects a torch.nn.Module, got {type(model).__name__}")
    if timing and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    validate_method(model, method)
    stock = _stock_way(model)
    ways = Ways(stock=stock, fast=lambda: accelerated(model))
    inputs = Inputs(tuple(example_args), dict(example_kwargs), method)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    # Classes accelerated before (accelerate(), install()) run stock for the check.
    before = _accelerated_classes(model)
    for cls in before:
        _core.restore_class(cls)
    bar = None
    try:
        lazy = _materialise(model, inputs, stock)
        if lazy:  # materialising changes classes (LazyLinear -> Linear)
            for cls in _accelerated_classes(model):
                _core.restore_class(cls)
                before.append(cls)
        steps = 1 + ((repeats + (1 if compile else 0)) if timing else 0)
        if progress:
            # (The bench package is imported only when a check runs.)
            from fastmodule.bench.progress import Progress

            bar = Progress(steps)
            bar.step("parity: stock, stock again, accelerated; counting module calls")
        parity = check_parity(model, inputs, train=train, ways=ways)
        calls = count_handovers(
            model, inputs, Snapshot(model), train=train, stock=stock, fast=ways.fast
        )
        notes = []
        if lazy:
            notes.append(
                f"lazy modules ({', '.join(lazy)}) were materialised by a first stock run "
                "before the comparison"
            )
        timings = None
        if timing and parity.raised:
            notes.append("not timed: a run raised")
        elif timing:
            try:
                timings = time_model(
                    model,
                    inputs,
                    train=train,
                    repeats=repeats,
                    compile=compile,
                    progress=bar,
                    stock=stock,
                    fast=ways.fast,
                )
            except CheckError as e:  # the verdict stands; say why there are no timings
                notes.append(f"not timed: {e}")
        if bar:
            bar.done()
            bar = None
    finally:
        if bar is not None and bar.tty:
            bar.stream.write("\n")  # end the progress line (an error or Ctrl-C follows)
            bar.stream.flush()
        for cls in before:
            _core.accelerate_class(cls)
        if threads is not None:
            torch.set_num_threads(previous_threads)
    device = next((str(t.device) for t in model.parameters()), "cpu")
    return CheckReport(
        model=type(model).__qualname__,
        inputs=describe_inputs(inputs),
        mode=mode_of(inputs.what, train),
        device=device,
        parity=parity,
        calls=calls,
        timings=timings,
        threads=threads if threads is not None else previous_threads,
        notes=notes,
        method=method,
    )
