"""What the native layer forwards (``src/call/layers/``) reproduce of torch's
code, kind by kind: the names each torch function reads (checked here at
import, beside the source verification of ``verification.LAYER_FAMILIES``),
and the spec handed to ``_core``: torch's ``forward``, the objects the native
steps call, and the guard the native code re-checks on every call — each
global those functions read with the object torch installed there (or
``ABSENT``: the name must not be there, so the builtin is what Python finds),
class attributes, module classes, and the functions whose bodies are
reproduced (their code, defaults and closure cells as they are now).
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch._jit_internal as jit_internal
import torch.nn.functional as F
import torch.nn.modules.activation as activation
import torch.nn.modules.batchnorm as batchnorm
import torch.nn.modules.conv as conv
import torch.nn.modules.dropout as dropout
import torch.nn.modules.normalization as normalization
import torch.nn.modules.pooling as pooling
import torch.nn.modules.sparse as sparse
import torch.nn.modules.utils as utils
from torch import nn

__all__ = ["ABSENT", "CHECKS", "SPECS"]

#: The guard's marker for "this name must not be in the dict".
ABSENT = object()

_FD = F.__dict__
_BUILTINS = builtins.__dict__
_HTF1 = "has_torch_function_unary"
_HTFN = "has_torch_function_variadic"


def _names(f: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    code = f.__code__
    return code.co_names, code.co_varnames[: code.co_argcount]


def _reads(f: Any, names: set[str], args: tuple[str, ...], defaults: Any = None) -> bool:
    return (
        isinstance(f, types.FunctionType)
        and set(f.__code__.co_names) == names
        and _names(f)[1] == args
        and f.__defaults__ == defaults
        and not f.__kwdefaults__
    )


def _forward(cls: type, names: tuple[str, ...], arg: str = "input") -> bool:
    f = cls.__dict__.get("forward")
    return isinstance(f, types.FunctionType) and _names(f) == (names, ("self", arg))


def _modules_plain(*mods: Any) -> bool:
    return all(type(m) is types.ModuleType for m in mods)


def _spec(
    forward: Any,
    objs: dict[str, Any],
    guard: list[tuple[dict[str, Any], str, Any]],
    funcs: tuple[Any, ...] = (),
    types_: list[tuple[type, str, Any]] | None = None,
    classes: list[tuple[Any, type]] | None = None,
) -> dict[str, Any]:
    return {
        "forward": forward,
        "objs": objs,
        "guard": guard,
        "funcs": list(funcs),
        "types": types_ or [],
        "classes": classes or [],
    }


def _f(module: Any, name: str) -> list[tuple[dict[str, Any], str, Any]]:
    """``F.<name>`` read from ``module``'s globals."""
    return [(module.__dict__, "F", F), (_FD, name, _FD[name])]


def _torch_attr(g: dict[str, Any], *path: str) -> list[tuple[dict[str, Any], str, Any]]:
    """``torch.<path>`` read through plain modules from globals ``g``."""
    out = [(g, "torch", torch)]
    obj: Any = torch
    for name in path:
        out.append((obj.__dict__, name, obj.__dict__[name]))
        obj = obj.__dict__[name]
    return out


# --------------------------------------------------------------------------- checks

_HTF_BODY = {"handle_torch_function"}


def _check_identity() -> bool:
    return _forward(nn.Identity, ())


def _check_flatten() -> bool:
    return _forward(nn.Flatten, ("flatten", "start_dim", "end_dim"))


def _check_gelu() -> bool:
    return _forward(nn.GELU, ("F", "gelu", "approximate")) and F.gelu is torch._C._nn.gelu


def _check_silu() -> bool:
    return (
        _forward(nn.SiLU, ("F", "silu", "inplace"))
        and _reads(
            F.silu,
            {_HTF1, *_HTF_BODY, "silu", "torch", "_C", "_nn", "silu_"},
            ("input", "inplace"),
            (False,),
        )
        and _modules_plain(torch._C, torch._C._nn)
    )


def _check_tanh() -> bool:
    return _forward(nn.Tanh, ("torch", "tanh"))


def _check_sigmoid() -> bool:
    return _forward(nn.Sigmoid, ("torch", "sigmoid"))


def _check_softmax() -> bool:
    return _forward(nn.Softmax, ("F", "softmax", "dim")) and _reads(
        F.softmax,
        {_HTF1, *_HTF_BODY, "softmax", "_get_softmax_dim", "dim"},
        ("input", "dim", "_stacklevel", "dtype"),
        (None, 3, None),
    )


_VF = F.__dict__["_VF"]
_VF_CLASS = type(_VF)
_VF_GETATTR = _VF_CLASS.__dict__.get("__getattr__")
_VF_FUNCS = type(torch._C._VariableFunctions)


def _check_vf() -> bool:
    return (
        _VF_CLASS.__mro__ == (_VF_CLASS, types.ModuleType, object)
        and isinstance(_VF_GETATTR, types.FunctionType)
        and _VF_GETATTR.__code__.co_qualname == "VFModule.__getattr__"
        and _names(_VF_GETATTR) == (("getattr", "vf"), ("self", "name"))
        and _VF.__dict__.get("vf") is torch._C._VariableFunctions
        and _VF_FUNCS.__mro__ == (_VF_FUNCS, object)
        and type(_VF_FUNCS) is type
    )


_DROPOUTS = {
    # kind: (class, F function, op name, the F function's names, forward reads inplace)
    "dropout": (nn.Dropout, "dropout", "dropout", {"ValueError"}, True),
    "alpha_dropout": (nn.AlphaDropout, "alpha_dropout", "alpha_dropout", {"ValueError"}, False),
    "feature_alpha_dropout": (
        nn.FeatureAlphaDropout,
        "feature_alpha_dropout",
        "feature_alpha_dropout",
        {"ValueError"},
        False,
    ),
    "dropout1d": (
        nn.Dropout1d,
        "dropout1d",
        "feature_dropout",
        {"ValueError", "dim", "RuntimeError", "unsqueeze_", "unsqueeze", "squeeze_", "squeeze"},
        True,
    ),
    "dropout2d": (
        nn.Dropout2d,
        "dropout2d",
        "feature_dropout",
        {"ValueError", "dim", "warnings", "warn"},
        True,
    ),
    "dropout3d": (
        nn.Dropout3d,
        "dropout3d",
        "feature_dropout",
        {"ValueError", "dim", "warnings", "warn", "unsqueeze_", "unsqueeze", "squeeze_", "squeeze"},
        True,
    ),
}


def _check_dropout(kind: str) -> Callable[[], bool]:
    cls, fname, op, extra, with_inplace = _DROPOUTS[kind]

    def check() -> bool:
        reads = (
            ("F", fname, "p", "training", "inplace")
            if with_inplace
            else ("F", fname, "p", "training")
        )
        defaults = (0.5, False, False) if fname.endswith("alpha_dropout") else (0.5, True, False)
        return (
            _forward(cls, reads)
            and _reads(
                _FD[fname],
                {_HTF1, *_HTF_BODY, fname, "_VF", op + "_", op, *extra},
                ("input", "p", "training", "inplace"),
                defaults,
            )
            and _check_vf()
        )

    return check


def _check_layer_norm() -> bool:
    return _forward(
        nn.LayerNorm, ("F", "layer_norm", "normalized_shape", "weight", "bias", "eps")
    ) and _reads(
        F.layer_norm,
        {_HTFN, *_HTF_BODY, "layer_norm", "torch", "backends", "cudnn", "enabled"},
        ("input", "normalized_shape", "weight", "bias", "eps"),
        (None, None, 1e-05),
    )


def _check_rms_norm() -> bool:
    return _forward(
        nn.RMSNorm, ("F", "rms_norm", "normalized_shape", "weight", "eps"), "x"
    ) and _reads(
        F.rms_norm,
        {_HTFN, *_HTF_BODY, "rms_norm", "torch"},
        ("input", "normalized_shape", "weight", "eps"),
        (None, None),
    )


def _check_embedding() -> bool:
    return _forward(
        nn.Embedding,
        (
            "F",
            "embedding",
            "weight",
            "padding_idx",
            "max_norm",
            "norm_type",
            "scale_grad_by_freq",
            "sparse",
        ),
    ) and _reads(
        F.embedding,
        {
            _HTFN,
            *_HTF_BODY,
            "embedding",
            "size",
            "AssertionError",
            "contiguous",
            "_no_grad_embedding_renorm_",
            "torch",
        },
        ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"),
        (None, None, 2.0, False, False),
    )


def _check_conv(n: int) -> Callable[[], bool]:
    cls = {1: nn.Conv1d, 2: nn.Conv2d}[n]
    helper = {1: "_single", 2: "_pair"}[n]

    def check() -> bool:
        fwd = cls.__dict__.get("_conv_forward")
        return (
            _forward(cls, ("_conv_forward", "weight", "bias"))
            and _reads(
                fwd,
                {
                    "padding_mode",
                    "F",
                    f"conv{n}d",
                    "pad",
                    "_reversed_padding_repeated_twice",
                    "stride",
                    helper,
                    "dilation",
                    "groups",
                    "padding",
                },
                ("self", "input", "weight", "bias"),
            )
            and getattr(F, f"conv{n}d") is getattr(torch, f"conv{n}d")
        )

    return check


_BN_FORWARD_NAMES = (
    "_check_input_dim",
    "momentum",
    "training",
    "track_running_stats",
    "num_batches_tracked",
    "add_",
    "float",
    "running_mean",
    "running_var",
    "F",
    "batch_norm",
    "weight",
    "bias",
    "eps",
)


def _check_batch_norm() -> bool:
    f = batchnorm._BatchNorm.__dict__.get("forward")
    return (
        all(
            "forward" not in cls.__dict__
            and cls.__mro__[1] is batchnorm._BatchNorm
            and _reads(
                cls.__dict__.get("_check_input_dim"), {"dim", "ValueError"}, ("self", "input")
            )
            for cls in (nn.BatchNorm1d, nn.BatchNorm2d)
        )
        and isinstance(f, types.FunctionType)
        and _names(f) == (_BN_FORWARD_NAMES, ("self", "input"))
        and _reads(
            F.batch_norm,
            {
                _HTFN,
                *_HTF_BODY,
                "batch_norm",
                "_verify_batch_size",
                "size",
                "ValueError",
                "torch",
                "backends",
                "cudnn",
                "enabled",
            },
            (
                "input",
                "running_mean",
                "running_var",
                "weight",
                "bias",
                "training",
                "momentum",
                "eps",
            ),
            (None, None, False, 0.1, 1e-05),
        )
        and _reads(F._verify_batch_size, {"range", "len", "ValueError"}, ("size",))
    )


def _check_max_pool2d() -> bool:
    fn = F.max_pool2d
    cells = dict(
        zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=True)
    )
    return (
        _forward(
            nn.MaxPool2d,
            (
                "F",
                "max_pool2d",
                "kernel_size",
                "stride",
                "padding",
                "dilation",
                "ceil_mode",
                "return_indices",
            ),
        )
        and isinstance(fn, types.FunctionType)
        and fn.__code__ in jit_internal.boolean_dispatch.__code__.co_consts
        and cells
        == {
            "arg_index": 6,
            "arg_name": "return_indices",
            "default": False,
            "if_true": F.max_pool2d_with_indices,
            "if_false": F._max_pool2d,
        }
        and _reads(
            F._max_pool2d,
            {_HTF1, *_HTF_BODY, "max_pool2d", "torch", "jit", "annotate", "list", "int"},
            (
                "input",
                "kernel_size",
                "stride",
                "padding",
                "dilation",
                "ceil_mode",
                "return_indices",
            ),
            (None, 0, 1, False, False),
        )
    )


def _check_adaptive_avg_pool2d() -> bool:
    return (
        _forward(nn.AdaptiveAvgPool2d, ("F", "adaptive_avg_pool2d", "output_size"))
        and _reads(
            F.adaptive_avg_pool2d,
            {
                _HTF1,
                *_HTF_BODY,
                "adaptive_avg_pool2d",
                "_list_with_default",
                "size",
                "torch",
                "_C",
                "_nn",
            },
            ("input", "output_size"),
        )
        and F.__dict__["_list_with_default"] is utils._list_with_default
        and _reads(
            utils._list_with_default,
            {"torch", "isinstance", "int", "SymInt", "len", "ValueError", "zip"},
            ("out_size", "defaults"),
        )
        and _modules_plain(torch._C, torch._C._nn)
    )


CHECKS: dict[str, Callable[[], bool]] = {
    "identity": _check_identity,
    "flatten": _check_flatten,
    "gelu": _check_gelu,
    "silu": _check_silu,
    "tanh": _check_tanh,
    "sigmoid": _check_sigmoid,
    "softmax": _check_softmax,
    **{k: _check_dropout(k) for k in _DROPOUTS},
    "layer_norm": _check_layer_norm,
    "rms_norm": _check_rms_norm,
    "embedding": _check_embedding,
    "conv1d": _check_conv(1),
    "conv2d": _check_conv(2),
    "batch_norm": _check_batch_norm,
    "max_pool2d": _check_max_pool2d,
    "adaptive_avg_pool2d": _check_adaptive_avg_pool2d,
}


# --------------------------------------------------------------------------- specs


def _htf(*names: str) -> list[tuple[dict[str, Any], str, Any]]:
    return [(_FD, n, _FD[n]) for n in names]


def _no_shadow(g: dict[str, Any], *names: str) -> list[tuple[dict[str, Any], str, Any]]:
    """Builtins ``names`` as functions with globals ``g`` find them."""
    b = g["__builtins__"]
    b = b if isinstance(b, dict) else b.__dict__
    return [(g, n, ABSENT) for n in names] + [(b, n, _BUILTINS[n]) for n in names]


def _identity() -> dict[str, Any]:
    return _spec(nn.Identity.forward, {}, [])


def _flatten() -> dict[str, Any]:
    return _spec(nn.Flatten.forward, {}, [])


def _gelu() -> dict[str, Any]:
    return _spec(nn.GELU.forward, {"f": F.gelu}, _f(activation, "gelu"))


def _silu() -> dict[str, Any]:
    guard = _f(activation, "silu") + _htf(_HTF1) + _torch_attr(_FD, "_C", "_nn", "silu")
    guard.append((torch._C._nn.__dict__, "silu_", torch._C._nn.silu_))
    objs = {"f": F.silu, "op": torch._C._nn.silu, "op_": torch._C._nn.silu_}
    return _spec(nn.SiLU.forward, objs, guard, (F.silu,))


def _unary(cls: type, name: str) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        op = torch.__dict__[name]
        return _spec(cls.forward, {"op": op}, _torch_attr(activation.__dict__, name))

    return build


def _softmax() -> dict[str, Any]:
    guard = _f(activation, "softmax") + _htf(_HTF1)
    return _spec(nn.Softmax.forward, {"f": F.softmax}, guard, (F.softmax,))


def _dropout(kind: str) -> Callable[[], dict[str, Any]]:
    cls, fname, op, _, _ = _DROPOUTS[kind]

    def build() -> dict[str, Any]:
        f = _FD[fname]
        vf = torch._C._VariableFunctions
        guard = _f(dropout, fname) + _htf(_HTF1) + [(_FD, "_VF", _VF), (_VF.__dict__, "vf", vf)]
        guard += [(_VF.__dict__, n, ABSENT) for n in (op, op + "_", "__getattr__")]
        guard += _no_shadow(_VF_GETATTR.__globals__, "getattr")
        types_ = [(_VF_CLASS, n, ABSENT) for n in (op, op + "_", "vf")]
        types_.append((_VF_CLASS, "__getattr__", _VF_GETATTR))
        types_ += [(_VF_FUNCS, n, _VF_FUNCS.__dict__[n]) for n in (op, op + "_")]
        objs = {"f": f, "op": getattr(vf, op), "op_": getattr(vf, op + "_")}
        classes = [(_VF, _VF_CLASS), (vf, _VF_FUNCS)]
        return _spec(cls.forward, objs, guard, (f, _VF_GETATTR), types_, classes)

    return build


def _layer_norm() -> dict[str, Any]:
    guard = _f(normalization, "layer_norm") + _htf(_HTFN) + _torch_attr(_FD, "layer_norm")
    objs = {"f": F.layer_norm, "op": torch.layer_norm}
    return _spec(nn.LayerNorm.forward, objs, guard, (F.layer_norm,))


def _rms_norm() -> dict[str, Any]:
    guard = _f(normalization, "rms_norm") + _htf(_HTFN) + _torch_attr(_FD, "rms_norm")
    objs = {"f": F.rms_norm, "op": torch.rms_norm}
    return _spec(nn.RMSNorm.forward, objs, guard, (F.rms_norm,))


def _embedding() -> dict[str, Any]:
    guard = _f(sparse, "embedding") + _htf(_HTFN) + _torch_attr(_FD, "embedding")
    objs = {"f": F.embedding, "op": torch.embedding}
    return _spec(nn.Embedding.forward, objs, guard, (F.embedding,))


def _conv(n: int) -> Callable[[], dict[str, Any]]:
    cls = {1: nn.Conv1d, 2: nn.Conv2d}[n]

    def build() -> dict[str, Any]:
        fwd = cls.__dict__["_conv_forward"]
        name = f"conv{n}d"
        objs = {"conv_forward": fwd, "op": _FD[name]}
        return _spec(cls.forward, objs, _f(conv, name), (fwd,))

    return build


def _batch_norm() -> dict[str, Any]:
    check1 = nn.BatchNorm1d.__dict__["_check_input_dim"]
    check2 = nn.BatchNorm2d.__dict__["_check_input_dim"]
    fwd = batchnorm._BatchNorm.__dict__["forward"]
    guard = _f(batchnorm, "batch_norm") + _htf(_HTFN) + _torch_attr(_FD, "batch_norm")
    guard += [(_FD, "_verify_batch_size", F._verify_batch_size)]
    guard += _no_shadow(batchnorm.__dict__, "float")
    guard += _no_shadow(_FD, "range", "len")
    objs = {"check1d": check1, "check2d": check2, "f": F.batch_norm, "op": torch.batch_norm}
    return _spec(fwd, objs, guard, (F.batch_norm, F._verify_batch_size, check1, check2))


def _max_pool2d() -> dict[str, Any]:
    guard = _f(pooling, "max_pool2d") + _htf(_HTF1) + _torch_attr(_FD, "max_pool2d")
    objs = {
        "f": F.max_pool2d,
        "if_true": F.max_pool2d_with_indices,
        "if_false": F._max_pool2d,
        "op": torch.max_pool2d,
    }
    return _spec(nn.MaxPool2d.forward, objs, guard, (F.max_pool2d, F._max_pool2d))


def _adaptive_avg_pool2d() -> dict[str, Any]:
    g = utils._list_with_default.__globals__
    guard = _f(pooling, "adaptive_avg_pool2d") + _htf(_HTF1)
    guard += [(_FD, "_list_with_default", utils._list_with_default)]
    guard += _torch_attr(_FD, "_C", "_nn", "adaptive_avg_pool2d")
    guard += _no_shadow(g, "isinstance", "int", "len", "zip", "ValueError", "__import__")
    guard += [(sys.modules, "torch", torch), (torch.__dict__, "SymInt", torch.SymInt)]
    objs = {"f": F.adaptive_avg_pool2d, "op": torch._C._nn.adaptive_avg_pool2d}
    return _spec(
        nn.AdaptiveAvgPool2d.forward, objs, guard, (F.adaptive_avg_pool2d, utils._list_with_default)
    )


SPECS: dict[str, Callable[[], dict[str, Any]]] = {
    "identity": _identity,
    "flatten": _flatten,
    "gelu": _gelu,
    "silu": _silu,
    "tanh": _unary(nn.Tanh, "tanh"),
    "sigmoid": _unary(nn.Sigmoid, "sigmoid"),
    "softmax": _softmax,
    **{k: _dropout(k) for k in _DROPOUTS},
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "embedding": _embedding,
    "conv1d": _conv(1),
    "conv2d": _conv(2),
    "batch_norm": _batch_norm,
    "max_pool2d": _max_pool2d,
    "adaptive_avg_pool2d": _adaptive_avg_pool2d,
}
