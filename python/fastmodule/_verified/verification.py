"""What fastmodule checks at import before it turns a native path on.

Each native path reproduces torch's Python code for it step by step, so it is
right only for the code it was written and tested against. At import every
torch function a path reproduces is compared with the ones fastmodule verified
(``fastmodule._verified.verified_torch``): a source file known whole by its hash, or else
the function's own source, compared as syntax (comments, docstrings,
annotations and line numbers left out, so an unrelated edit elsewhere in
torch's file changes nothing). The function must also be the one that file
defines (its code object's file and qualified name), so a function patched
before ``import fastmodule`` is not taken for torch's.

A path whose functions do not all match stays torch's: ``fastmodule.Module``
and accelerated classes run torch's own code for it, exactly as stock.
Likewise on an interpreter fastmodule was not verified on (other than CPython
3.11-3.14 with the GIL) no native path is switched on at all.
``fastmodule.diagnostics()`` lists what is on and why anything is off;
``import fastmodule`` warns once (``fastmodule.UnverifiedWarning``) naming what it
could not verify.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import os
import sys
import sysconfig
import types
from collections.abc import Iterable

import torch

from fastmodule._verified.verified_torch import FILES, FUNCTIONS

__all__ = [
    "CONTAINER_METHODS",
    "CONVERSIONS",
    "CORE_PATHS",
    "HOOK_FUNCTIONS",
    "LAYER_FAMILIES",
    "LAYER_FUNCTIONS",
    "METHOD_PATHS",
    "SUPPORTED_PYTHON",
    "UNVERIFIED_ENV_VAR",
    "all_functions",
    "display",
    "fingerprint",
    "function_problem",
    "interpreter_problem",
    "method_problem",
    "native_problem",
    "path_problem",
    "torch_function",
]

#: CPython versions whose internals the native core was verified against.
SUPPORTED_PYTHON = ((3, 11), (3, 12), (3, 13), (3, 14))


_MODULE = "torch.nn.modules.module:Module."

#: Native paths served through torch's own functions' entry points and the
#: classes' C slots, with the torch functions each reproduces.
CORE_PATHS: dict[str, tuple[str, ...]] = {
    "call": (_MODULE + "_wrapped_call_impl", _MODULE + "_call_impl"),
    "getattr": (_MODULE + "__getattr__",),
    "registration": tuple(
        _MODULE + n
        for n in (
            "__setattr__",
            "__delattr__",
            "register_parameter",
            "register_buffer",
            "add_module",
            "register_module",
        )
    ),
}

# Whole-tree methods: the torch methods each native body runs natively
# (itself, and those it dispatches to natively for a module that does not
# override them).
_NAMED_MODULES = ("named_modules",)
_CHILDREN = ("children", "named_children")
_MEMBERS = ("_named_members", *_NAMED_MODULES)
_PARAMETERS = ("parameters", "named_parameters", *_MEMBERS)
_TRAIN = ("train", *_CHILDREN)
_METHOD_DEPS: dict[str, tuple[str, ...]] = {
    "named_modules": _NAMED_MODULES,
    "modules": ("modules", *_NAMED_MODULES),
    "named_children": ("named_children",),
    "children": _CHILDREN,
    "named_parameters": ("named_parameters", *_MEMBERS),
    "parameters": _PARAMETERS,
    "named_buffers": ("named_buffers", *_MEMBERS),
    "buffers": ("buffers", "named_buffers", *_MEMBERS),
    "train": _TRAIN,
    "eval": ("eval", *_TRAIN),
    "requires_grad_": ("requires_grad_", *_PARAMETERS),
    "zero_grad": ("zero_grad", *_PARAMETERS),
    "apply": ("apply", *_CHILDREN),
    "_apply": ("_apply", *_CHILDREN),
    "state_dict": ("state_dict", "_save_to_state_dict"),
    "load_state_dict": ("load_state_dict", "_load_from_state_dict"),
    "get_submodule": ("get_submodule",),
    "set_submodule": ("set_submodule",),
    "get_parameter": ("get_parameter", "get_submodule"),
    "get_buffer": ("get_buffer", "get_submodule"),
}
#: Whole-tree methods and the torch functions their native bodies reproduce.
#: ``train`` (and so ``eval``) sets ``training`` with the native ``__setattr__``.
METHOD_PATHS: dict[str, tuple[str, ...]] = {
    name: tuple(_MODULE + d for d in deps)
    + (CORE_PATHS["registration"] if name in ("train", "eval") else ())
    for name, deps in _METHOD_DEPS.items()
}

#: The functions ``_call_impl`` calls on its way to the hooks, which the native
#: hook dispatch reproduces besides the call path's (``fastmodule._verified.hook_dispatch``).
HOOK_FUNCTIONS: tuple[str, ...] = (
    "torch.compiler:is_compiling",
    "torch._jit_internal:is_scripting",
)

#: torch's layer code the call path runs without frames (``fastmodule._verified.layers``).
LAYER_FUNCTIONS: tuple[str, ...] = (
    "torch.nn.modules.linear:Linear.forward",
    "torch.nn.modules.activation:ReLU.forward",
    "torch.nn.modules.container:Sequential.forward",
    "torch.nn.modules.container:Sequential.__iter__",
    "torch.nn.functional:relu",
)

_M = "torch.nn.modules."
_FN = "torch.nn.functional:"
_DROPOUT_CLASSES = {
    "dropout": "Dropout",
    "dropout1d": "Dropout1d",
    "dropout2d": "Dropout2d",
    "dropout3d": "Dropout3d",
    "alpha_dropout": "AlphaDropout",
    "feature_alpha_dropout": "FeatureAlphaDropout",
}
_BATCH_NORM = (_M + "batchnorm:_BatchNorm.forward", _FN + "batch_norm", _FN + "_verify_batch_size")

#: The further layer kinds the call path runs without frames
#: (``fastmodule._verified.layer_specs``), each with the torch functions it reproduces.
LAYER_FAMILIES: dict[str, tuple[str, ...]] = {
    "identity": (_M + "linear:Identity.forward",),
    "flatten": (_M + "flatten:Flatten.forward",),
    "gelu": (_M + "activation:GELU.forward",),
    "silu": (_M + "activation:SiLU.forward", _FN + "silu"),
    "tanh": (_M + "activation:Tanh.forward",),
    "sigmoid": (_M + "activation:Sigmoid.forward",),
    "softmax": (_M + "activation:Softmax.forward", _FN + "softmax"),
    **{kind: (f"{_M}dropout:{cls}.forward", _FN + kind) for kind, cls in _DROPOUT_CLASSES.items()},
    "layer_norm": (_M + "normalization:LayerNorm.forward", _FN + "layer_norm"),
    "rms_norm": (_M + "normalization:RMSNorm.forward", _FN + "rms_norm"),
    "embedding": (_M + "sparse:Embedding.forward", _FN + "embedding"),
    "conv1d": (_M + "conv:Conv1d.forward", _M + "conv:Conv1d._conv_forward"),
    "conv2d": (_M + "conv:Conv2d.forward", _M + "conv:Conv2d._conv_forward"),
    "batch_norm": (
        *_BATCH_NORM,
        _M + "batchnorm:BatchNorm1d._check_input_dim",
        _M + "batchnorm:BatchNorm2d._check_input_dim",
    ),
    "max_pool2d": (
        _M + "pooling:MaxPool2d.forward",
        "torch._jit_internal:boolean_dispatch",
        _FN + "_max_pool2d",
    ),
    "adaptive_avg_pool2d": (
        _M + "pooling:AdaptiveAvgPool2d.forward",
        _FN + "adaptive_avg_pool2d",
        "torch.nn.modules.utils:_list_with_default",
    ),
}

#: Container protocol methods served natively (``fastmodule._verified.layers``).
CONTAINER_METHODS: tuple[str, ...] = tuple(
    f"torch.nn.modules.container:{cls}.{name}"
    for cls, names in (
        ("ModuleList", ("__iter__", "__len__")),
        ("Sequential", ("__iter__", "__len__")),
        ("ModuleDict", ("__iter__", "__len__", "keys", "values", "items")),
    )
    for name in names
)

#: torch's conversion methods whose closures the native ``_apply`` recognises.
CONVERSIONS: tuple[str, ...] = tuple(
    _MODULE + n for n in ("float", "double", "half", "bfloat16", "cpu", "to")
)


def all_functions() -> list[str]:
    """Every torch function some native path reproduces."""
    groups = [*CORE_PATHS.values(), *METHOD_PATHS.values()]
    groups += [HOOK_FUNCTIONS, LAYER_FUNCTIONS, CONTAINER_METHODS, CONVERSIONS]
    groups += list(LAYER_FAMILIES.values())
    return sorted({f for group in groups for f in group})


#: Set (``1``/``true``/``yes``/``on``) when fastmodule is imported: the running
#: interpreter is treated as one fastmodule did not verify, so the process runs the
#: stock fallback an unknown CPython gets (how the test suite checks that mode).
UNVERIFIED_ENV_VAR = "FASTMODULE_UNVERIFIED"


@functools.cache
def interpreter_problem() -> str | None:
    """Why this interpreter is not one fastmodule verified, or None if it is
    (answered once: at import)."""
    if os.environ.get(UNVERIFIED_ENV_VAR, "").strip().lower() in {"1", "true", "yes", "on"}:
        return f"{UNVERIFIED_ENV_VAR} is set: this interpreter is treated as unverified"
    impl = sys.implementation.name
    if impl != "cpython":
        return f"{impl} is not CPython"
    version = sys.version_info[:2]
    if version not in SUPPORTED_PYTHON:
        known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_PYTHON)
        return f"CPython {version[0]}.{version[1]} is not one fastmodule verified ({known})"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "a free-threaded CPython build"
    return None


@functools.cache
def native_problem() -> str | None:
    """Why no native path is switched on in this process, or None: the
    interpreter is not one fastmodule verified, or the trace/profile fields of
    its thread state (which the native paths read to step aside for debuggers
    and profilers, ``fastmodule._verified.tracer_probe``) were not found."""
    problem = interpreter_problem()
    if problem is None:
        from fastmodule._verified import tracer_probe

        if not tracer_probe.probe():
            problem = "this CPython's trace/profile fields were not found"
    return problem


def torch_function(qualified: str) -> object:
    """The object ``"module:Qual.name"`` names, read from class dicts (no
    descriptor runs), or None."""
    module_name, _, qualname = qualified.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError:
        return None
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)
        if not isinstance(namespace, types.MappingProxyType | dict) or part not in namespace:
            return None
        obj = namespace[part]
    return obj


_SKIPPED_FIELDS = frozenset({"annotation", "returns", "type_comment", "type_params"})


def _canonical(node: object) -> str:
    """A node as text: its type and every field that is set, recursively,
    without locations, annotations or empty fields (whose presence differs
    between CPython versions)."""
    if isinstance(node, ast.AST):
        fields = []
        for field in node._fields:
            if field in _SKIPPED_FIELDS:
                continue
            value = getattr(node, field, None)
            if value is None or value == []:
                continue
            fields.append(f"{field}={_canonical(value)}")
        return f"{type(node).__name__}({' '.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


def fingerprint(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """A function's source as syntax, hashed: its decorators, signature and body
    without the docstring."""
    node = copy.copy(fn)
    if ast.get_docstring(fn, clean=False) is not None:
        node.body = fn.body[1:]
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:16]


@functools.cache
def _source(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


@functools.cache
def _file_hash(path: str) -> str | None:
    data = _source(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


@functools.cache
def _definitions(path: str) -> dict[tuple[str, int], ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function defined in the file: (qualified name, first line) -> node."""
    data = _source(path)
    if data is None:
        return {}
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return {}
    out: dict[tuple[str, int], ast.FunctionDef | ast.AsyncFunctionDef] = {}
    stack: list[tuple[str, Iterable[ast.stmt]]] = [("", tree.body)]
    while stack:
        prefix, body = stack.pop()
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                line = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                out[(prefix + node.name, line)] = node
                stack.append((f"{prefix}{node.name}.<locals>.", node.body))
            elif isinstance(node, ast.ClassDef):
                stack.append((f"{prefix}{node.name}.", node.body))
    return out


_TORCH_DIR = os.path.dirname(torch.__file__)


def source_hash(path: str) -> str | None:
    """The SHA-256 of a source file's bytes (None if it cannot be read)."""
    return _file_hash(path)


@functools.cache
def _relative(path: str) -> str:
    """``path`` relative to torch's package folder, with ``/`` separators."""
    return os.path.relpath(path, os.path.dirname(_TORCH_DIR)).replace(os.sep, "/")


@functools.cache
def function_problem(qualified: str) -> str | None:
    """Why torch's function ``"module:Qual.name"`` is not one fastmodule
    verified, or None if it is."""
    obj = torch_function(qualified)
    _, _, qualname = qualified.partition(":")
    if not isinstance(obj, types.FunctionType):
        return "not a Python function" if obj is not None else "missing"
    code = obj.__code__
    if code.co_qualname != qualname:
        return f"replaced (its code is {code.co_qualname!r})"
    path = code.co_filename
    if _file_hash(path) in FILES.get(_relative(path), ()):
        return None
    node = _definitions(path).get((qualname, code.co_firstlineno))
    if node is None:
        return "source not found" if _source(path) is None else "not defined in its file"
    if fingerprint(node) not in FUNCTIONS.get(qualified, ()):
        return "source differs from the verified versions"
    return None


def _problems(functions: Iterable[str]) -> list[str]:
    out = []
    for f in functions:
        problem = function_problem(f)
        if problem is not None:
            out.append(f"{display(f)}: {problem}")
    return out


def display(qualified: str) -> str:
    """``"torch.nn.modules.module:Module.x"`` as people write it: ``nn.Module.x``."""
    module_name, _, qualname = qualified.partition(":")
    if module_name.startswith("torch.nn.modules."):
        return "nn." + qualname
    if module_name == "torch.nn.functional":
        return "F." + qualname
    return f"{module_name}.{qualname}"


def path_problem(functions: Iterable[str]) -> str | None:
    """Why a path reproducing ``functions`` stays torch's, or None."""
    problems = _problems(functions)
    return "; ".join(problems) if problems else None


def method_problem(name: str) -> str | None:
    """Why the native body of whole-tree method ``name`` stays off, or None."""
    deps = METHOD_PATHS.get(name)
    if deps is None:
        return "not a whole-tree method fastmodule serves"
    return path_problem(deps)
