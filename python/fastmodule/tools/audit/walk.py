"""The traversal behind ``fastmodule.audit``.

It reads only what torch keeps on each module — the instance ``__dict__``
(read with ``object.__getattribute__``, so no class code runs), the
registries ``_parameters``, ``_buffers``, ``_modules`` in it, and the class
MRO — and plain containers through their base types' own methods. It never
calls a module's methods, runs a forward or changes anything, so a stock
model and the same model accelerated by fastmodule give the same findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from fastmodule.tools.audit.findings import KINDS, Finding

__all__ = ["Walk", "elements", "instance_dict", "native_limits", "walk"]

_REGISTRIES = ("_parameters", "_buffers", "_modules")
# The instance-dict entries torch itself keeps on every module; none holds a
# module or tensor the user put there.
_TORCH_KEYS = frozenset(
    (
        *_REGISTRIES,
        "training",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    )
)
_CONTAINERS = (list, tuple, dict, set, frozenset)
# Values that are never a module, a tensor or a container (skipped fast).
_ATOMS = frozenset((int, float, str, bool, bytes, type(None)))
# Nested containers deeper than this are not looked into.
_MAX_DEPTH = 32
# How many places a message names before "...".
_SHOWN = 3


def instance_dict(obj: object) -> dict[str, Any]:
    """``obj.__dict__`` without running class code (empty if it has none)."""
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {}
    return d if isinstance(d, dict) else {}


def _registry(d: dict[str, Any], name: str) -> dict[str, Any]:
    reg = d.get(name)
    return dict.copy(reg) if isinstance(reg, dict) else {}


def _qualname(cls: type) -> str:
    return getattr(cls, "__qualname__", cls.__name__)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _shown(names: list[str]) -> str:
    more = f", ... ({len(names)} in all)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _key(k: object) -> str:
    # repr of a str/int/... runs no user code; other keys are named by type.
    if type(k) in (str, int, float, bool) or k is None:
        return repr(k)
    return f"<{type(k).__name__}>"


def _children(c: Any) -> Iterator[tuple[object, Any]]:
    """``(key, item)`` of a container (the key None for a set), read through its
    base type's own methods so no code of a subclass runs."""
    if isinstance(c, dict):
        return dict.items(c).__iter__()
    if isinstance(c, list | tuple):
        base = list if isinstance(c, list) else tuple
        return enumerate(base.__iter__(c))
    items = set.__iter__(c) if isinstance(c, set) else frozenset.__iter__(c)
    return ((None, v) for v in items)


def _suffix(c: Any, key: object) -> str:
    if isinstance(c, dict):
        return f"[{_key(key)}]"
    return "{}" if isinstance(c, set | frozenset) else f"[{key}]"


def contents(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Every module and tensor inside a plain container, with where it is
    (``name[0]['k']``), each container entered once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    while stack:
        where, c, depth = stack.pop()
        if id(c) in seen or depth > _MAX_DEPTH:
            continue
        seen.add(id(c))
        found = []
        for key, item in _children(c):
            if type(item) in _ATOMS:
                continue
            if isinstance(item, torch.nn.Module | torch.Tensor):
                yield where + _suffix(c, key), item
            elif isinstance(item, _CONTAINERS):
                found.append((where + _suffix(c, key), item, depth + 1))
        stack.extend(reversed(found))


def _lazy(t: torch.Tensor) -> bool:
    return isinstance(t, torch.nn.parameter.UninitializedTensorMixin)


def _shape(t: torch.Tensor) -> str:
    return "(uninitialized)" if _lazy(t) else str(tuple(t.shape))


def elements(tensors: Iterator[torch.Tensor]) -> int:
    """How many numbers the tensors hold (uninitialized lazy ones count 0)."""
    return sum(0 if _lazy(t) else t.numel() for t in tensors)


def _class_attribute(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO whose dict defines ``name``, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _resolved(cls: type, name: str) -> Any:
    owner = _class_attribute(cls, name)
    return None if owner is None else vars(owner)[name]


def native_limits(cls: type) -> list[str]:
    """Why fastmodule leaves some of its paths to torch's code for every instance of
    ``cls`` (empty: none). Read from the class alone, the way fastmodule decides."""
    module = torch.nn.Module
    out = []

    def owner(name: str) -> str:
        klass = _class_attribute(cls, name)
        return f"{_qualname(klass)}.{name}" if klass is not None else name

    # ParameterList/ParameterDict define __call__ only to refuse being called.
    refuses = (vars(torch.nn.ParameterList)["__call__"], vars(torch.nn.ParameterDict)["__call__"])
    if _resolved(cls, "__call__") not in (vars(module)["__call__"], *refuses):
        out.append(f"module calls run {owner('__call__')}")
    if _resolved(cls, "__getattribute__") is not vars(object)["__getattribute__"]:
        out.append(f"attribute reads run {owner('__getattribute__')}")
    elif _resolved(cls, "__getattr__") is not vars(module)["__getattr__"]:
        out.append(f"registered names are read through {owner('__getattr__')}")
    for name, statement in (("__setattr__", "m.x = v"), ("__delattr__", "del m.x")):
        if _resolved(cls, name) is not vars(module)[name]:
            out.append(f"{statement} runs {owner(name)}")
    mro = cls.__mro__
    if module in mro:
        # torch's __setattr__/__delattr__ end in super(): the native paths need it
        # to reach object's. Mixins after torch.nn.Module that define neither
        # (Hugging Face's PreTrainedModel, GenerationMixin) lose nothing.
        after = mro[mro.index(module) + 1 :]
        for name in ("__setattr__", "__delattr__"):
            owner_ = next((k for k in after if name in vars(k)), object)
            if owner_ is not object:
                out.append(
                    "registration and torch's whole-tree methods (state_dict, parameters, "
                    f"train, ...) run torch's code (super().{name} after torch.nn.Module "
                    f"is {_qualname(owner_)}'s)"
                )
                break
    return out


@dataclasses.dataclass
class _Node:
    module: torch.nn.Module
    paths: list[str]
    d: dict[str, Any]


@dataclasses.dataclass
class Walk:
    """What the audit walked: every registered module once, with all its paths,
    and every registered tensor with all its names."""

    nodes: list[_Node]
    #: id of a registered module -> its node.
    modules: dict[int, _Node]
    #: id of a registered parameter -> (names, parameter).
    parameters: dict[int, tuple[list[str], torch.Tensor]]
    #: id of a registered buffer -> (names, buffer).
    buffers: dict[int, tuple[list[str], torch.Tensor]]
    findings: list[Finding] = dataclasses.field(default_factory=list)

    def add(self, code: str, node: _Node | None, attribute: str, message: str, **say: str) -> None:
        """Record a finding of kind ``code`` on ``node`` (None: the model)."""
        kind = KINDS[code]
        module = (node or self.nodes[0]).module
        self.findings.append(
            Finding(
                code=code,
                severity=kind.severity,
                path=node.paths[0] if node else "",
                attribute=attribute,
                cls=_qualname(type(module)),
                message=message,
                why=say.get("why", kind.why),
                fix=say.get("fix", kind.fix),
            )
        )


def _tree(model: torch.nn.Module) -> Walk:
    nodes: list[_Node] = []
    modules: dict[int, _Node] = {}
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        path, m = stack.pop()
        node = modules.get(id(m))
        if node is not None:
            node.paths.append(path)
            continue
        node = _Node(m, [path], instance_dict(m))
        modules[id(m)] = node
        nodes.append(node)
        children = [
            (_join(path, name), child)
            for name, child in _registry(node.d, "_modules").items()
            if isinstance(child, torch.nn.Module)
        ]
        stack.extend(reversed(children))
    walk = Walk(nodes, modules, {}, {})
    for node in nodes:
        for reg, into in (("_parameters", walk.parameters), ("_buffers", walk.buffers)):
            for name, t in _registry(node.d, reg).items():
                if isinstance(t, torch.Tensor):
                    into.setdefault(id(t), ([], t))[0].append(_join(node.paths[0], name))
    return walk


def _registries(walk: Walk, node: _Node) -> None:
    for name in _REGISTRIES:
        reg = node.d.get(name)
        if reg is not None and type(reg) is not dict:
            blind = "" if isinstance(reg, dict) else " (nor a dict subclass: not audited inside)"
            walk.add(
                "FM017", node, name, f"{name} is a {type(reg).__name__}, not a plain dict{blind}"
            )


def _shadows(walk: Walk, node: _Node) -> None:
    cls = type(node.module)
    for reg, what in (
        ("_parameters", "parameter"),
        ("_buffers", "buffer"),
        ("_modules", "submodule"),
    ):
        for name, registered in _registry(node.d, reg).items():
            if name in node.d:
                value = node.d[name]
                if value is registered:
                    walk.add(
                        "FM008",
                        node,
                        name,
                        f"instance attribute '{name}' caches the registered {what} '{name}'",
                    )
                else:
                    walk.add(
                        "FM007",
                        node,
                        name,
                        f"instance attribute '{name}' ({type(value).__name__}) shadows the "
                        f"registered {what} '{name}'",
                        fix=f"remove it (del self.__dict__[{name!r}]) or rename one of the two",
                    )
                continue
            owner = _class_attribute(cls, name)
            if owner is not None:
                walk.add(
                    "FM007",
                    node,
                    name,
                    f"class attribute {_qualname(owner)}.{name} shadows the registered "
                    f"{what} '{name}'",
                    fix=f"remove {name} from the class body, or rename one of the two",
                )


def _plain_attributes(walk: Walk, node: _Node) -> None:
    registered = {n for reg in _REGISTRIES for n in _registry(node.d, reg)}
    for name, value in dict.items(node.d):
        if name in _TORCH_KEYS or name in registered:
            continue
        if isinstance(value, torch.nn.Module | torch.Tensor):
            _single(walk, node, name, value)
        elif isinstance(value, _CONTAINERS):
            _container(walk, node, name, value)


def _recomputed(node: _Node, name: str) -> bool:
    """Is the plain tensor attribute ``name`` what torch's weight_norm or
    spectral_norm recompute before each forward (from registered parameters)?"""
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    hooks = node.d.get("_forward_pre_hooks")
    if not isinstance(hooks, dict):
        return False
    return any(
        isinstance(h, WeightNorm | SpectralNorm) and vars(h).get("name") == name
        for h in dict.values(hooks)
    )


def _single(walk: Walk, node: _Node, name: str, value: Any) -> None:
    if isinstance(value, torch.nn.Module):
        other = walk.modules.get(id(value))
        if other is not None:
            walk.add(
                "FM014",
                node,
                name,
                f"plain attribute '{name}' refers to the registered module "
                f"'{other.paths[0] or '(root)'}'",
            )
        else:
            walk.add(
                "FM006",
                node,
                name,
                f"{type(value).__name__} module kept as a plain attribute '{name}'",
            )
    elif _recomputed(node, name):
        return
    elif isinstance(value, torch.nn.Parameter) or id(value) in walk.parameters:
        names = walk.parameters.get(id(value))
        if names is not None:
            walk.add(
                "FM014",
                node,
                name,
                f"plain attribute '{name}' refers to the registered parameter '{names[0][0]}'",
            )
        else:
            walk.add(
                "FM004",
                node,
                name,
                f"parameter of shape {_shape(value)} kept as a plain attribute '{name}'",
                fix=f"assign it normally (self.{name} = nn.Parameter(...)), not through "
                "object.__setattr__ or __dict__",
            )
    elif value.grad_fn is not None:
        walk.add(
            "FM015",
            node,
            name,
            f"tensor of shape {_shape(value)} computed by autograd kept as a plain "
            f"attribute '{name}'",
        )
    else:
        buffer = walk.buffers.get(id(value))
        stale = (
            f" (it is the buffer '{buffer[0][0]}' today, but .to() replaces that buffer, "
            "not this attribute)"
            if buffer is not None
            else ""
        )
        walk.add(
            "FM005",
            node,
            name,
            f"tensor of shape {_shape(value)} kept as a plain attribute '{name}'{stale}",
            fix=f"self.register_buffer({name!r}, tensor) (persistent=False if it should not "
            "be saved)",
        )


def _container(walk: Walk, node: _Node, name: str, value: Any) -> None:
    kind = type(value).__name__
    modules: dict[int, list[str]] = {}
    params: dict[int, list[str]] = {}
    tensors: dict[int, list[str]] = {}
    computed: list[str] = []
    aliases: list[tuple[str, str]] = []
    for where, item in contents(name, value):
        if isinstance(item, torch.nn.Module):
            if id(item) in walk.modules:
                aliases.append(("module", where))
            else:
                modules.setdefault(id(item), []).append(where)
        elif isinstance(item, torch.nn.Parameter) or id(item) in walk.parameters:
            if id(item) in walk.parameters:
                aliases.append(("parameter", where))
            else:
                params.setdefault(id(item), []).append(where)
        elif item.grad_fn is not None:
            computed.append(where)
        else:
            tensors.setdefault(id(item), []).append(where)
    holder = f"plain {kind} attribute '{name}'"
    is_dict = isinstance(value, dict)

    def places(found: dict[int, list[str]]) -> str:
        return _shown([w for ws in found.values() for w in ws])

    if modules:
        fix = "use nn.ModuleDict" if is_dict else "use nn.ModuleList"
        walk.add(
            "FM001",
            node,
            name,
            f"{_plural(len(modules), 'module')} in a {holder} ({places(modules)})",
            fix=fix + _nesting(modules, name),
        )
    if params:
        fix = "use nn.ParameterDict" if is_dict else "use nn.ParameterList"
        walk.add(
            "FM002",
            node,
            name,
            f"{_plural(len(params), 'parameter')} in a {holder} ({places(params)})",
            fix=fix + _nesting(params, name),
        )
    if tensors:
        walk.add(
            "FM003",
            node,
            name,
            f"{_plural(len(tensors), 'tensor')} in a {holder} ({places(tensors)})",
        )
    if computed:
        walk.add(
            "FM015",
            node,
            name,
            f"{_plural(len(computed), 'tensor')} computed by autograd in a {holder} "
            f"({_shown(computed)})",
        )
    if aliases:
        walk.add(
            "FM014",
            node,
            name,
            f"{holder} refers to {_aliases(aliases)} registered under other names "
            f"({_shown([w for _, w in aliases])})",
        )


def _aliases(found: list[tuple[str, str]]) -> str:
    counts = {what: sum(w == what for w, _ in found) for what in ("module", "parameter")}
    return " and ".join(_plural(n, what) for what, n in counts.items() if n)


def _nesting(found: dict[int, list[str]], name: str) -> str:
    """A hint for containers inside containers."""
    deep = any(w.count("[") + w.count("{") > 1 for ws in found.values() for w in ws)
    return " (nested: nest the nn containers the same way)" if deep else ""


def _buffers_with_grad(walk: Walk, node: _Node) -> None:
    for name, b in _registry(node.d, "_buffers").items():
        if isinstance(b, torch.Tensor) and b.requires_grad:
            walk.add("FM011", node, name, f"buffer '{name}' requires grad")


def _model_wide(walk: Walk) -> None:
    tensors = [(names[0], t) for names, t in [*walk.parameters.values(), *walk.buffers.values()]]
    by_device: dict[str, list[str]] = {}
    by_dtype: dict[str, list[str]] = {}
    for name, t in tensors:
        by_device.setdefault(str(t.device), []).append(name)
        if t.is_floating_point():
            by_dtype.setdefault(str(t.dtype).removeprefix("torch."), []).append(name)
    for code, groups, what in (("FM009", by_device, "devices"), ("FM010", by_dtype, "dtypes")):
        if len(groups) > 1:
            parts = [
                f"{key}: {_plural(len(names), 'tensor')} (e.g. {names[0]})"
                for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1]))
            ]
            walk.add(code, None, "", f"{len(groups)} {what}: " + "; ".join(parts))


def _sharing(walk: Walk) -> None:
    by_path = {node.paths[0]: node for node in walk.nodes}
    for node in walk.nodes:
        if len(node.paths) > 1:
            others = ", ".join(repr(p) for p in node.paths[1:])
            walk.add(
                "FM013",
                node,
                "",
                f"{type(node.module).__name__} module also reachable as {others}",
            )
    for registry, what in ((walk.parameters, "parameter"), (walk.buffers, "buffer")):
        for names, _ in registry.values():
            if len(names) > 1:
                first, *rest = names
                path, _, attr = rest[0].rpartition(".")
                owner = by_path[path]
                walk.add(
                    "FM012",
                    owner,
                    attr,
                    f"{what} '{rest[0]}' is the same tensor as '{first}'"
                    + (f" (and {', '.join(repr(n) for n in rest[1:])})" if rest[1:] else ""),
                )


def _classes(walk: Walk) -> None:
    seen: set[type] = set()
    for node in walk.nodes:
        cls = type(node.module)
        if cls in seen:
            continue
        seen.add(cls)
        limits = native_limits(cls)
        if limits:
            walk.add("FM016", node, "", f"class {_qualname(cls)}: " + "; ".join(limits))


def walk(model: torch.nn.Module) -> Walk:
    """Walk ``model``'s registered tree once and collect every finding."""
    w = _tree(model)
    for node in w.nodes:
        _registries(w, node)
        _shadows(w, node)
        _plain_attributes(w, node)
        _buffers_with_grad(w, node)
    _sharing(w)
    _classes(w)
    _model_wide(w)
    return w
