"""The traversal behind ``fastmodule.audit``.

It reads only what torch keeps on each module — the instance ``__dict__``
(read with ``object.__getattribute__``, so no class code runs), the
registries ``_parameters``, ``_buffers``, ``_modules`` in it, and the class
MRO — plain containers through their base types' own methods, and plain helper
objects (two levels of attributes, objects of the user's own code or of the
holding module's package only) through their ``__dict__`` and slot descriptors.
It never calls a module's or a helper's methods, runs a forward or changes
anything, so a stock model and the same model accelerated by fastmodule give the
same findings. Where a finding comes from in the source (and whether the code
silences it) is read from the classes' source files (:mod:`.source`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import site
import sys
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

import torch

from fastmodule.tools.audit import source
from fastmodule.tools.audit.findings import KINDS, Finding

__all__ = [
    "EXAMPLE_INPUTS",
    "Walk",
    "class_attribute",
    "contents",
    "elements",
    "instance_dict",
    "native_limits",
    "walk",
]

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
# Lightning's example input (``self.example_input_array = ...``, kept by its property
# under the second name): an input for summaries and graphs, not state.
EXAMPLE_INPUTS = frozenset(("example_input_array", "_example_input_array"))
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


def class_attribute(cls: type, name: str) -> type | None:
    """The class in ``cls``'s MRO whose dict defines ``name``, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _resolved(cls: type, name: str) -> Any:
    owner = class_attribute(cls, name)
    return None if owner is None else vars(owner)[name]


def native_limits(cls: type) -> list[str]:
    """Why fastmodule leaves some of its paths to torch's code for every instance of
    ``cls`` (empty: none). Read from the class alone, the way fastmodule decides."""
    module = torch.nn.Module
    out = []

    def owner(name: str) -> str:
        klass = class_attribute(cls, name)
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
    #: Findings the code silences (a comment or ``__fastmodule_ignore__``).
    suppressed: list[Finding] = dataclasses.field(default_factory=list)

    def add(self, code: str, node: _Node | None, attribute: str, message: str, **say: str) -> None:
        """Record a finding of kind ``code`` on ``node`` (None: the model)."""
        kind = KINDS[code]
        cls = type((node or self.nodes[0]).module)
        if attribute:
            location = source.attribute_site(cls, attribute)
        elif code == "FM016":
            location = source.class_site(cls)
        else:
            location = None
        finding = Finding(
            code=code,
            severity=kind.severity,
            path=node.paths[0] if node else "",
            attribute=attribute,
            cls=_qualname(cls),
            message=message,
            why=say.get("why", kind.why),
            fix=say.get("fix", kind.fix),
            file=location.file if location else None,
            line=location.line if location else None,
        )
        if source.silenced(cls, code, attribute, location):
            self.suppressed.append(finding)
        else:
            self.findings.append(finding)


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
            owner = class_attribute(cls, name)
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
        if name in _TORCH_KEYS or name in registered or name in EXAMPLE_INPUTS:
            continue
        if type(value) in _ATOMS:
            continue
        if isinstance(value, torch.nn.Module | torch.Tensor):
            _single(walk, node, name, value)
        elif isinstance(value, _CONTAINERS):
            _container(walk, node, name, value)
        elif _enterable(value, type(node.module)):
            _helper(walk, node, name, value)


# ------------------------------------------------------------------ plain helper objects

# Packages whose objects are never looked into: torch's (graphs, optimizers,
# distributions: torch keeps what it needs) and fastmodule's own.
_NOT_HELPERS = frozenset(("torch", "fastmodule"))


def _top(cls: type) -> str:
    return str(getattr(cls, "__module__", "")).partition(".")[0]


@functools.cache
def _installed_dirs() -> tuple[str, ...]:
    paths = {*site.getsitepackages(), site.getusersitepackages()}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            paths.add(sysconfig.get_paths()[key])
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


@functools.lru_cache(maxsize=1024)
def _installed(module_name: str) -> bool:
    """Is the module part of Python or of an installed distribution, rather than the
    user's own code (a script, a project on the path, an editable install)?"""
    if module_name == "__main__":
        return False
    top = module_name.partition(".")[0]
    if top == "builtins" or top in sys.stdlib_module_names:
        return True
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not isinstance(file, str):
        return False
    return os.path.realpath(file).startswith(_installed_dirs())


def _enterable(value: Any, holder: type) -> bool:
    """Is ``value`` a plain helper object the audit looks into: an instance of a class
    of the user's own code, or of the package of the module class holding it (the
    objects of other libraries, configs, tokenizers, trainers, are theirs), with
    attributes? Never torch's or fastmodule's, nor a class, function or Python module."""
    cls = type(value)
    top = _top(cls)
    if top in _NOT_HELPERS or isinstance(value, type | types.ModuleType):
        return False
    if top != _top(holder) and _installed(str(getattr(cls, "__module__", ""))):
        return False
    return bool(instance_dict(value)) or bool(_slot_names(cls))


@functools.lru_cache(maxsize=1024)
def _slot_names(cls: type) -> tuple[str, ...]:
    """The names of the slots ``cls`` and its bases declare (``__dict__`` and
    ``__weakref__`` left out)."""
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            descriptor = vars(klass).get(name)
            if (
                isinstance(name, str)
                and name not in ("__dict__", "__weakref__")
                and type(descriptor) is types.MemberDescriptorType
            ):
                names.append(name)
    return tuple(dict.fromkeys(names))


def _attributes(obj: Any) -> Iterator[tuple[str, Any]]:
    """An object's instance attributes (its ``__dict__``, then its slots), read without
    running code of its class."""
    yield from dict.items(instance_dict(obj))
    cls = type(obj)
    for name in _slot_names(cls):
        for klass in cls.__mro__:
            descriptor = vars(klass).get(name)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    yield name, descriptor.__get__(obj, cls)
                except AttributeError:
                    pass  # an empty slot
                break


#: How many levels of plain objects the audit looks through (``self.a.b.linear``: 2).
_HELPER_LEVELS = 2


def _held(
    holder: type, where: str, obj: Any, level: int = 1, seen: set[int] | None = None
) -> Iterator[tuple[str, Any]]:
    """Every module and parameter a plain object holds (in its attributes, containers
    in them, and plain objects in them up to :data:`_HELPER_LEVELS` levels), with
    where (``helper.sub.proj``), in attribute order, each object entered once."""
    seen = {id(obj)} if seen is None else seen
    for name, value in _attributes(obj):
        if type(value) in _ATOMS:
            continue
        place = f"{where}.{name}"
        if isinstance(value, torch.nn.Module | torch.nn.Parameter):
            yield place, value
        elif isinstance(value, _CONTAINERS):
            for inner, item in contents(place, value):
                if isinstance(item, torch.nn.Module | torch.nn.Parameter):
                    yield inner, item
        elif (
            level < _HELPER_LEVELS
            and id(value) not in seen
            and not isinstance(value, torch.Tensor)
            and _enterable(value, holder)
        ):
            seen.add(id(value))
            yield from _held(holder, place, value, level + 1, seen)


def _helper(walk: Walk, node: _Node, name: str, value: Any) -> None:
    modules: dict[int, str] = {}
    params: dict[int, str] = {}
    for where, item in _held(type(node.module), name, value):
        if isinstance(item, torch.nn.Module):
            if id(item) not in walk.modules:
                modules.setdefault(id(item), where)
        elif id(item) not in walk.parameters:
            params.setdefault(id(item), where)
    kind = _qualname(type(value))
    holder = f"a plain {kind} object in attribute '{name}'"
    fix = (
        f"make {kind} an nn.Module (then self.{name} = {kind}(...) registers what it "
        "holds), or assign them to this module"
    )
    if modules:
        walk.add(
            "FM018",
            node,
            name,
            f"{_plural(len(modules), 'module')} held by {holder} "
            f"({_shown(list(modules.values()))})",
            fix=fix,
        )
    if params:
        walk.add(
            "FM019",
            node,
            name,
            f"{_plural(len(params), 'parameter')} held by {holder} "
            f"({_shown(list(params.values()))})",
            fix=fix,
        )


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
