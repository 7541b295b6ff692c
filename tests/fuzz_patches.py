"""Process-wide patches of torch for the differential fuzzers (tests/test_fuzz_state_machine.py,
the layer hook programs of tests/test_parity_hooks.py).

fastmodule takes decisions once (a function recognised by identity, a layer classified
before its hooks run, a global checked at import) and must notice when what they rest on
changes later. Each patch here changes one such thing while the process runs, the way
hot-reload tools, test doubles and recording tools do, and returns its undo:

- ``swap_code``: the ``__code__`` of a torch function (a layer's ``forward``, a container
  method, a ``torch.nn.functional`` function, a ``torch.nn.Module`` method) becomes a
  variant compiled from torch's own source at torch's file and lines (what IPython's
  autoreload does): ``"count"`` notes each call, ``"plus"`` adds 100 to what it returns;
- ``patch_tensor``: a ``torch.Tensor`` method becomes a wrapper that notes the call and
  calls the original;
- ``wrap_method``: a layer's or container's method (the class attribute) becomes a
  wrapper that notes the call and calls torch's function (the everyday monkeypatch);
- ``patch_global``: a global of one of torch's modules (a function, a builtin it would find
  in ``builtins``, or a module such as ``F``/``torch``/``warnings``) becomes a wrapper or
  proxy that notes each call or attribute read and forwards it; ``warnings.warn`` itself
  notes its arguments as text;
- ``patch_defaults``: a torch function's default argument values change;
- ``patch_class_attr``: a class attribute torch's code reads (``_version``) changes.

Notes go to ``SINK[0]`` (the running world's log, or a hook program's), only while one is
set, so the same step on stock and on fastmodule must note the same calls in the same
order.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import sys
import textwrap
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.modules.activation as activation
import torch.nn.modules.batchnorm as batchnorm
import torch.nn.modules.container as container
import torch.nn.modules.conv as conv
import torch.nn.modules.dropout as dropout
import torch.nn.modules.linear as linear
import torch.nn.modules.module as module_py
import torch.nn.modules.normalization as normalization
from torch import nn

#: Where notes go: a list while a step (or hook program) runs, else None.
SINK: list[list[Any] | None] = [None]

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def note(*what: Any) -> None:
    """Log one patched call into the running step's log (nothing between steps)."""
    sink = SINK[0]
    if sink is not None:
        sink.append(("patched", *what))


def text(v: Any) -> str:
    return _ADDRESS.sub("0x?", str(v))[:200]


# --------------------------------------------------------------------------- code swaps

# torch functions whose code a hot reload may replace: name -> (owner, attribute).
CODE_TARGETS: dict[str, tuple[Any, str]] = {
    # The layer forwards fastmodule runs without frames, and what they call.
    "Linear.forward": (nn.Linear, "forward"),
    "ReLU.forward": (nn.ReLU, "forward"),
    "Sequential.forward": (nn.Sequential, "forward"),
    "LayerNorm.forward": (nn.LayerNorm, "forward"),
    "GELU.forward": (nn.GELU, "forward"),
    "Dropout.forward": (nn.Dropout, "forward"),
    "_BatchNorm.forward": (batchnorm._BatchNorm, "forward"),
    "BatchNorm1d._check_input_dim": (nn.BatchNorm1d, "_check_input_dim"),
    "Softmax.forward": (nn.Softmax, "forward"),
    "Conv1d.forward": (nn.Conv1d, "forward"),
    "Conv1d._conv_forward": (nn.Conv1d, "_conv_forward"),
    "F.relu": (F, "relu"),
    "F.dropout": (F, "dropout"),
    "F.layer_norm": (F, "layer_norm"),
    "F.softmax": (F, "softmax"),
    "F.batch_norm": (F, "batch_norm"),
    "F._verify_batch_size": (F, "_verify_batch_size"),
    # The container protocol methods served natively.
    "Sequential.__iter__": (nn.Sequential, "__iter__"),
    "Sequential.__len__": (nn.Sequential, "__len__"),
    "ModuleList.__iter__": (nn.ModuleList, "__iter__"),
    "ModuleList.__len__": (nn.ModuleList, "__len__"),
    "ModuleDict.__iter__": (nn.ModuleDict, "__iter__"),
    "ModuleDict.__len__": (nn.ModuleDict, "__len__"),
    "ModuleDict.keys": (nn.ModuleDict, "keys"),
    "ModuleDict.items": (nn.ModuleDict, "items"),
    "ModuleDict.values": (nn.ModuleDict, "values"),
}
# torch.nn.Module's own functions: the call, attribute and registration paths and the
# whole-tree methods (their routed code, inline_routes, is what a swap replaces).
MODULE_METHODS = [
    "_call_impl",
    "_wrapped_call_impl",
    "__getattr__",
    "__setattr__",
    "__delattr__",
    "register_parameter",
    "register_buffer",
    "add_module",
    "named_modules",
    "named_children",
    "children",
    "_named_members",
    "named_parameters",
    "named_buffers",
    "parameters",
    "state_dict",
    "_save_to_state_dict",
    "load_state_dict",
    "_load_from_state_dict",
    "get_extra_state",
    "train",
    "_apply",
    "zero_grad",
    "requires_grad_",
    "apply",
    "get_submodule",
]
CODE_TARGETS.update({f"Module.{n}": (nn.Module, n) for n in MODULE_METHODS})

LAYER_CODE = [k for k in CODE_TARGETS if not k.startswith(("Module.", "ModuleList", "ModuleDict"))]
CONTAINER_CODE = [k for k in CODE_TARGETS if k.startswith(("ModuleList", "ModuleDict"))] + [
    "Sequential.__iter__",
    "Sequential.__len__",
]
MODULE_CODE = [f"Module.{n}" for n in MODULE_METHODS]

# Whose result "plus" may add 100 to (tensors; lengths).
_PLUS = {
    "Linear.forward",
    "ReLU.forward",
    "Sequential.forward",
    "LayerNorm.forward",
    "GELU.forward",
    "Dropout.forward",
    "_BatchNorm.forward",
    "Softmax.forward",
    "Conv1d.forward",
    "Conv1d._conv_forward",
    "F.relu",
    "F.dropout",
    "F.layer_norm",
    "F.softmax",
    "F.batch_norm",
    "Sequential.__len__",
    "ModuleList.__len__",
    "ModuleDict.__len__",
}
VARIANTS = ("count", "plus")


def _function(name: str) -> types.FunctionType:
    owner, attr = CODE_TARGETS[name]
    f = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    assert isinstance(f, types.FunctionType), name
    return f


# The function objects as torch defines them, taken before anything is patched (a patch
# of the attribute itself, as the machine's patch_torch makes, keeps calling them).
_FUNCTIONS = {name: _function(name) for name in CODE_TARGETS}


def function(name: str) -> types.FunctionType:
    return _FUNCTIONS[name]


class _PlusReturns(ast.NodeTransformer):
    """``return x`` -> ``return x + 100`` in the function itself (not nested ones)."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return node  # nested: untouched (the outer def is visited through its body)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]
    visit_Lambda = visit_FunctionDef  # type: ignore[assignment]

    def visit_Return(self, node: ast.Return) -> Any:
        if node.value is None:
            return node
        new = ast.BinOp(left=node.value, op=ast.Add(), right=ast.Constant(100))
        return ast.copy_location(ast.Return(value=ast.copy_location(new, node.value)), node)


_VARIANT_CACHE: dict[tuple[str, str], types.CodeType] = {}


def variant_code(name: str, how: str) -> types.CodeType:
    """torch's function ``name`` recompiled from its source at its file and lines, with
    a note of each call (``count``) or 100 added to what it returns (``plus``)."""
    key = (name, how)
    if key in _VARIANT_CACHE:
        return _VARIANT_CACHE[key]
    f = function(name)
    code = f.__code__
    lines, first = inspect.getsourcelines(f)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    fdef = tree.body[0]
    assert isinstance(fdef, ast.FunctionDef) and fdef.name == code.co_name, name
    fdef.decorator_list = []
    if how == "count":
        call = ast.parse(f"__import__('tests.fuzz_patches').fuzz_patches.note('code', {name!r})")
        stmt = call.body[0]
        at = fdef.body[0]
        for node in ast.walk(stmt):
            ast.copy_location(node, at)
        doc = isinstance(at, ast.Expr) and isinstance(getattr(at, "value", None), ast.Constant)
        fdef.body.insert(1 if doc else 0, stmt)
    else:
        assert name in _PLUS, name
        _PlusReturns().generic_visit(fdef)  # the def's own body; nested defs stay
    ast.increment_lineno(tree, first - 1)
    body: list[ast.stmt] = [fdef]
    if "." in code.co_qualname:  # a method: in a class body, for super()'s __class__ cell
        cls = code.co_qualname.rsplit(".", 1)[0]
        body = [ast.ClassDef(name=cls, bases=[], keywords=[], body=body, decorator_list=[])]
        ast.copy_location(body[0], fdef)
    mod = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    compiled = compile(mod, code.co_filename, "exec", dont_inherit=True)

    def find(c: types.CodeType) -> types.CodeType | None:
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                if k.co_name == code.co_name:
                    return k
                found = find(k)
                if found is not None:
                    return found
        return None

    new = find(compiled)
    assert new is not None, name
    new = new.replace(co_qualname=code.co_qualname)
    assert new.co_freevars == code.co_freevars, (name, new.co_freevars, code.co_freevars)
    _VARIANT_CACHE[key] = new
    return new


def plus_allowed(name: str) -> bool:
    return name in _PLUS


def swap_code(name: str, how: str) -> Callable[[], None]:
    """Replace the code of torch's function ``name`` with its ``how`` variant; the undo."""
    if how == "plus" and name not in _PLUS:
        how = "count"
    f = function(name)
    old = f.__code__
    f.__code__ = variant_code(name, how)

    def undo() -> None:
        f.__code__ = old

    return undo


# --------------------------------------------------------------------------- methods wrapped

#: The class-owned targets a wrapper may replace (``torch.nn.Module``'s own methods are
#: the state machine's ``patch_torch``).
WRAP_TARGETS = [
    k for k, (cls, _) in CODE_TARGETS.items() if isinstance(cls, type) and cls is not nn.Module
]


def wrap_method(name: str) -> Callable[[], None]:
    """The class attribute of ``name`` becomes a wrapper noting each call; the undo."""
    owner, attr = CODE_TARGETS[name]
    original = owner.__dict__[attr]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        note("wrapped", name)
        return original(self, *args, **kwargs)

    method.__name__ = attr
    setattr(owner, attr, method)
    return lambda: setattr(owner, attr, original)


# --------------------------------------------------------------------------- defaults

#: Default values a patch gives torch's functions: name -> (attribute, value).
DEFAULTS: dict[str, tuple[str, Any]] = {
    "F.softmax": ("__defaults__", (None, 3, torch.float64)),
    "F.relu": ("__defaults__", (True,)),
    "F.layer_norm": ("__defaults__", (None, None, 10.0)),
    "Module.train": ("__defaults__", (False,)),
    "Module.zero_grad": ("__defaults__", (False,)),
    "Module.requires_grad_": ("__defaults__", (False,)),
    "Module.named_modules": ("__defaults__", (None, "d", True)),
    "Module.named_parameters": ("__defaults__", ("d", True, True)),
    "Module.named_buffers": ("__defaults__", ("d", False, True)),
    "Module.parameters": ("__defaults__", (False,)),
    "Module.state_dict": (
        "__kwdefaults__",
        {"destination": None, "prefix": "d.", "keep_vars": True},
    ),
    "Module.load_state_dict": ("__defaults__", (False, False)),
    "Module.register_buffer": ("__defaults__", (False,)),
}


def patch_defaults(name: str) -> Callable[[], None]:
    f = function(name)
    attr, value = DEFAULTS[name]
    old = getattr(f, attr)
    setattr(f, attr, value)
    return lambda: setattr(f, attr, old)


# --------------------------------------------------------------------------- class attributes

#: Class attributes torch's code reads, and a value a patch gives them.
CLASS_ATTRS: dict[str, tuple[type, str, Any]] = {
    "Module._version": (nn.Module, "_version", 7),
    "Linear._version": (nn.Linear, "_version", 8),
    "_BatchNorm._version": (batchnorm._BatchNorm, "_version", 1),
    "Module.call_super_init": (nn.Module, "call_super_init", True),
}


def patch_class_attr(name: str) -> Callable[[], None]:
    cls, attr, value = CLASS_ATTRS[name]
    had = attr in cls.__dict__
    old = cls.__dict__.get(attr)
    setattr(cls, attr, value)

    def undo() -> None:
        if had:
            setattr(cls, attr, old)
        else:
            delattr(cls, attr)

    return undo


# --------------------------------------------------------------------------- tensor methods

TENSOR_METHODS = [
    # What layer forwards and torch's functional code call on tensors.
    "dim",
    "size",
    "add_",
    "softmax",
    "relu",
    # What torch's whole-tree methods call on each tensor.
    "detach",
    "copy_",
    "float",
    "is_floating_point",
    "requires_grad_",
    "zero_",
]


def patch_tensor(name: str) -> Callable[[], None]:
    """``torch.Tensor.<name>`` becomes a wrapper that notes each call; the undo."""
    had = name in torch.Tensor.__dict__
    own = torch.Tensor.__dict__.get(name)
    original = getattr(torch.Tensor, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        note("Tensor", name)
        return original(self, *args, **kwargs)

    method.__name__ = name
    setattr(torch.Tensor, name, method)

    def undo() -> None:
        if had:
            setattr(torch.Tensor, name, own)
        else:
            delattr(torch.Tensor, name)

    return undo


# --------------------------------------------------------------------------- globals


class Proxy(types.ModuleType):
    """A module standing in for ``target`` as a global: notes every attribute read."""

    def __init__(self, label: str, target: types.ModuleType) -> None:
        super().__init__(target.__name__)
        self.__dict__["_fz_label"] = label
        self.__dict__["_fz_target"] = target

    def __getattr__(self, name: str) -> Any:
        note("global", self.__dict__["_fz_label"], name)
        return getattr(self.__dict__["_fz_target"], name)


def _warn_wrapper(original: Callable[..., Any], bridge: bool) -> Callable[..., Any]:
    """``warnings.warn`` replaced: notes each call's message and category. ``bridge``
    (a logging bridge that keeps the attribution) also notes its ``stacklevel`` and the
    frame that called it, and forwards with one level more for its own frame; otherwise
    the warning is attributed to this wrapper, wherever it was called from."""

    def warn(message: Any, category: Any = None, stacklevel: int = 1, *rest: Any, **kw: Any) -> Any:
        cat = type(message) if isinstance(message, Warning) else category or UserWarning
        what = ("warnings.warn", text(message), getattr(cat, "__name__", text(cat)))
        if not bridge:
            note(*what)
            return original(message, category, 1, *rest, **kw)
        caller = sys._getframe(1).f_code
        note(*what, stacklevel, caller.co_filename, caller.co_name)
        return original(message, category, stacklevel + 1, *rest, **kw)

    return warn


# name -> (module, global name). A global absent from the module is a builtin the code
# finds in ``builtins`` (the patch shadows it there).
GLOBAL_TARGETS: dict[str, tuple[types.ModuleType, str]] = {
    "warnings.warn": (warnings, "warn"),
    "warnings.warn_bridge": (warnings, "warn"),
    "module.warnings": (module_py, "warnings"),
    "module.torch": (module_py, "torch"),
    "linear.F": (linear, "F"),
    "activation.F": (activation, "F"),
    "normalization.F": (normalization, "F"),
    "batchnorm.F": (batchnorm, "F"),
    "dropout.F": (dropout, "F"),
    "conv.F": (conv, "F"),
    "F.torch": (F, "torch"),
    "F._VF": (F, "_VF"),
    "F.has_torch_function_unary": (F, "has_torch_function_unary"),
    "F.has_torch_function_variadic": (F, "has_torch_function_variadic"),
    "F._verify_batch_size": (F, "_verify_batch_size"),
    "F._get_softmax_dim": (F, "_get_softmax_dim"),
    "F.len": (F, "len"),
    "F.relu": (F, "relu"),
    "F.linear": (F, "linear"),
    "F.dropout": (F, "dropout"),
    "F.layer_norm": (F, "layer_norm"),
    "F.softmax": (F, "softmax"),
    "F.batch_norm": (F, "batch_norm"),
    "F.gelu": (F, "gelu"),
    "F.conv1d": (F, "conv1d"),
    "batchnorm.float": (batchnorm, "float"),
    "container.iter": (container, "iter"),
    "container.len": (container, "len"),
}

_ABSENT = object()


def patch_global(name: str) -> Callable[[], None]:
    """Global ``name`` of a torch module becomes a noting wrapper or proxy; the undo."""
    mod, attr = GLOBAL_TARGETS[name]
    own = mod.__dict__.get(attr, _ABSENT)
    original = own if own is not _ABSENT else getattr(builtins, attr)
    new: Any
    if mod is warnings:
        new = _warn_wrapper(original, bridge=name.endswith("bridge"))
    elif isinstance(original, types.ModuleType):
        new = Proxy(name, original)
    else:

        def new(*args: Any, **kwargs: Any) -> Any:
            note("global", name)
            return original(*args, **kwargs)

    setattr(mod, attr, new)

    def undo() -> None:
        if own is _ABSENT:
            delattr(mod, attr)
        else:
            setattr(mod, attr, own)

    return undo


# --------------------------------------------------------------------------- one name

#: Every patch by one name: "code:<target>:<variant>", "wrap:<target>", "tensor:<method>",
#: "global:<name>", "defaults:<function>", "classattr:<name>".
PATCHES: list[str] = (
    [f"code:{t}:{v}" for t in CODE_TARGETS for v in VARIANTS if v == "count" or t in _PLUS]
    + [f"wrap:{t}" for t in WRAP_TARGETS]
    + [f"tensor:{m}" for m in TENSOR_METHODS]
    + [f"global:{g}" for g in GLOBAL_TARGETS]
    + [f"defaults:{d}" for d in DEFAULTS]
    + [f"classattr:{c}" for c in CLASS_ATTRS]
)


def target(patch: str) -> str:
    """What a patch replaces (two variants of one code swap, or two wrappers of one
    global, replace the same thing)."""
    kind, rest = patch.split(":", 1)
    if kind == "code":
        return f"code:{rest.rsplit(':', 1)[0]}"
    if kind == "global":
        mod, attr = GLOBAL_TARGETS[rest]
        return f"global:{mod.__name__}.{attr}"
    return patch


def apply(patch: str) -> Callable[[], None]:
    """Apply a patch named as in ``PATCHES``; returns its undo."""
    kind, rest = patch.split(":", 1)
    if kind == "code":
        name, how = rest.rsplit(":", 1)
        return swap_code(name, how)
    if kind == "wrap":
        return wrap_method(rest)
    if kind == "tensor":
        return patch_tensor(rest)
    if kind == "defaults":
        return patch_defaults(rest)
    if kind == "classattr":
        return patch_class_attr(rest)
    return patch_global(rest)


def check_variants() -> None:
    """Every code variant compiles (run at import of the fuzzers: a torch that moved a
    function fails here, not in the middle of a run)."""
    for t in CODE_TARGETS:
        for v in VARIANTS:
            if v == "count" or t in _PLUS:
                variant_code(t, v)


# --------------------------------------------------------------------------- during a call

#: torch.nn.Module's functions a module call runs (or reproduces).
CALL_PATH = ("_call_impl", "_wrapped_call_impl", "__getattr__", "__setattr__")
#: What a forward pre-hook may patch for the rest of a call (an always_call forward hook
#: takes it back), and what may be patched around a layer's call: everything but
#: torch.nn.Module's whole-tree methods.
DURING_CALL = [
    p
    for p in PATCHES
    if not p.startswith("code:Module.") or p.split(":")[1][len("Module.") :] in CALL_PATH
]

#: What layer calls rest on most: their own code and their functionals', Tensor methods,
#: warnings.warn (the fuzzers draw half their patches from here).
FOCUS = [
    p
    for p in DURING_CALL
    if p.startswith(("tensor:", "global:warnings.warn"))
    or p.startswith("code:")
    and p.split(":")[1] in LAYER_CODE
]

# Patches applied by hooks during a call, innermost last.
_STACK: list[tuple[object, Callable[[], None]]] = []


def push(patch: str) -> object:
    """Apply ``patch`` for the rest of the running call; a token for ``pop``."""
    token = object()
    _STACK.append((token, apply(patch)))
    return token


def pop(token: object) -> None:
    """Take back the patch of ``token`` if it is the innermost one (a hook that failed
    before its push leaves the others to ``unwind``)."""
    if _STACK and _STACK[-1][0] is token:
        _STACK.pop()[1]()


def unwind() -> None:
    """Take back every patch hooks left applied (at the end of each step)."""
    while _STACK:
        _STACK.pop()[1]()
