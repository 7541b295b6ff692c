"""torch layers whose ``forward`` the native call path may run without a frame,
and torch's container protocol methods served natively.

``nn.Sequential.forward``, ``nn.Linear.forward`` and ``nn.ReLU.forward`` are
short and fixed: the native call (``fastmodule._core``, module ``leaves``)
runs the same builtin ops with the same arguments, after checking on every
call that the globals they read are still torch's objects. This file hands
over those objects, but only after checking that the installed torch's
functions read exactly the names that code reproduces; otherwise nothing is
registered and the functions simply run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.modules.activation as activation
import torch.nn.modules.linear as linear

from fastmodule import _core
from fastmodule._verified import verification

__all__ = ["CONTAINERS", "LAYERS", "LAYER_KINDS"]


def _names(f: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    code = f.__code__
    return code.co_names, code.co_varnames[: code.co_argcount]


def _expected() -> bool:
    """Do torch's functions read exactly what the native versions reproduce?"""
    return (
        _names(torch.nn.Linear.forward) == (("F", "linear", "weight", "bias"), ("self", "input"))
        and _names(torch.nn.ReLU.forward) == (("F", "relu", "inplace"), ("self", "input"))
        and _names(torch.nn.Sequential.forward) == ((), ("self", "input"))
        and _names(torch.nn.Sequential.__dict__["__iter__"])
        == (("iter", "_modules", "values"), ("self",))
        and set(_names(F.relu)[0])
        == {"has_torch_function_unary", "handle_torch_function", "relu", "torch", "relu_"}
        and _names(F.relu)[1] == ("input", "inplace")
        and F.relu.__defaults__ == (False,)
        and F.linear is torch._C._nn.linear
    )


def _layers_problem() -> str | None:
    """Why torch's layer forwards run with their frames, or None."""
    problem = verification.native_problem()
    problem = problem or verification.path_problem(verification.LAYER_FUNCTIONS)
    if problem is None and not _expected():
        problem = "torch's layer code reads other names than the native versions"
    return problem


#: Why the layer forwards are not run natively (None: they are, within the call
#: path; see ``fastmodule.diagnostics()``).
LAYERS = _layers_problem()


def _spec_problem(kind: str) -> str | None:
    problem = verification.path_problem(verification.LAYER_FAMILIES[kind])
    if problem is None and not _family_checks[kind]():
        problem = "torch's code reads other names than the native version"
    return problem


def _specs() -> dict[str, Any]:
    from fastmodule._verified import layer_specs as _layer_specs

    out: dict[str, Any] = {}
    for kind, build in _layer_specs.SPECS.items():
        if _spec_problem(kind) is None:
            out[kind] = build()
    return out


if LAYERS is None:
    from fastmodule._verified import layer_specs as _layer_specs

    _family_checks = _layer_specs.CHECKS
    #: The layer kinds served natively beyond Sequential/Linear/ReLU.
    LAYER_KINDS: tuple[str, ...] = ()
    _served = _specs()
    LAYER_KINDS = tuple(sorted(_served))
else:
    LAYER_KINDS = ()


# Container protocol methods, each a one-line view of `self._modules`.
_CONTAINER_METHODS = {
    "ModuleList.__iter__": (("iter", "_modules", "values"), torch.nn.ModuleList),
    "Sequential.__iter__": (("iter", "_modules", "values"), torch.nn.Sequential),
    "ModuleDict.__iter__": (("iter", "_modules"), torch.nn.ModuleDict),
    "ModuleList.__len__": (("len", "_modules"), torch.nn.ModuleList),
    "Sequential.__len__": (("len", "_modules"), torch.nn.Sequential),
    "ModuleDict.__len__": (("len", "_modules"), torch.nn.ModuleDict),
    "ModuleDict.keys": (("_modules", "keys"), torch.nn.ModuleDict),
    "ModuleDict.values": (("_modules", "values"), torch.nn.ModuleDict),
    "ModuleDict.items": (("_modules", "items"), torch.nn.ModuleDict),
}


def _containers() -> dict[str, Any]:
    """The container methods whose installed body is the one-liner reproduced
    (and verified: ``fastmodule._verified.verification``)."""
    out = {}
    if verification.native_problem() is not None:
        return out
    for qualname, (names, cls) in _CONTAINER_METHODS.items():
        f = cls.__dict__.get(qualname.split(".")[1])
        verified = verification.function_problem(f"{cls.__module__}:{qualname}") is None
        if verified and hasattr(f, "__code__") and _names(f) == (names, ("self",)):
            out[qualname] = f
    return out


#: The container methods served natively, by qualified name.
CONTAINERS = _containers()


def install() -> None:
    """Hand the core the verified layer forwards and container methods (at start-up)."""
    if LAYERS is None:
        _core.init_layers(
            {
                "sequential_forward": torch.nn.Sequential.forward,
                "sequential_iter": torch.nn.Sequential.__dict__["__iter__"],
                "linear_forward": torch.nn.Linear.forward,
                "relu_forward": torch.nn.ReLU.forward,
                "functional": F,
                "functional_dict": F.__dict__,
                "linear_globals": linear.__dict__,
                "activation_globals": activation.__dict__,
                "f_linear": F.linear,
                "f_relu": F.relu,
                "f_relu_globals": F.relu.__globals__,
                "torch": torch,
                "torch_dict": torch.__dict__,
                "torch_relu": torch.relu,
                "torch_relu_": torch.relu_,
                "has_torch_function_unary": F.relu.__globals__["has_torch_function_unary"],
                "has_torch_function_variadic": F.__dict__["has_torch_function_variadic"],
                "tensor_type": torch.Tensor,
                "parameter_type": torch.nn.Parameter,
                "absent": _layer_specs.ABSENT,
                "layers": _served,
            }
        )
    _core.init_containers(CONTAINERS)
