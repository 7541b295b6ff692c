"""``fastmodule.strict()``: a warning (or an error) at the line that assigns a value
torch will not register to a module attribute.

``self.layers = [nn.Linear(16, 16)]`` or ``self.mask = torch.ones(16)`` is accepted
silently by ``nn.Module.__setattr__``: the layers are not trained, saved, moved or
switched by ``train()``/``eval()``, the mask is not moved or saved (the silent kinds
``fastmodule.audit`` reports as FM001-FM003 and FM005). While strict mode is on,
``torch.nn.Module.__setattr__`` is a checking wrapper around torch's own function, so
every module class (stock, accelerated or ``fastmodule.Module``) is checked; off, torch's
function object is put back as it was, so the assignment path is exactly what it was
before (nothing is left in it to cost anything).

When a value is judged:

- A plain tensor is reported at its assignment.
- A plain list, tuple, dict or set assigned while the module is being built (inside
  its ``__init__``) is judged when the outermost ``__init__`` of the module returns,
  by what it holds then: ``self.blocks = []`` followed by
  ``self.blocks.append(nn.Linear(...))`` is reported (at the line of the assignment),
  and ``self.blocks = [Block() for ...]`` followed by
  ``self.seq = nn.Sequential(*self.blocks)`` is not (the blocks are registered by
  then, the list is only another reference). For that, while strict is on, the
  ``__init__`` of each module class outside torch and fastmodule (defined before or
  after strict was switched on) is wrapped in a function that counts how deep the
  instance's construction is; switching strict off puts every original back. Under
  ``strict(error=True)`` the error is raised when that ``__init__`` returns.
- A container assigned at any other time is judged at its assignment.
- Anything assigned during a module's forward (an attention map kept for inspection,
  a cache for the next call, a helper made lazily) is reported as
  :class:`StrictRegistrationInfo`, never raised: what a forward keeps is most often
  not state, and strict is no place to fail a forward.

Only assignments made by code outside torch and fastmodule are checked (torch's own
modules keep derived values as plain attributes on purpose, e.g. ``weight_norm``'s
recomputed weight or the RNNs' ``_flat_weights`` list), and a module or tensor already
registered in the module's tree (an alias such as ``self.first = self.blocks[0]``
inside a list) is not reported.

Only a value torch itself keeps as a plain attribute is checked: strict never reports
where torch registers the value (a module, a parameter, an ``nn.Buffer``, a buffer's or
a registered name's new value), hands it to a data descriptor of the class (a property
with a setter decides what happens to it) or raises its own error (a tensor or list
assigned to a parameter's or child module's name, a module or parameter assigned before
``nn.Module.__init__``), so what torch does, and the text of what it raises, stay
torch's. Lightning's ``self.example_input_array = torch.randn(...)`` (an example input
for summaries, not state) is not reported. An assignment made before
``nn.Module.__init__`` has run (``self.cfg = ...`` ahead of ``super().__init__()``) is
not reported whatever it holds: the module has no registries yet, nothing could have
been registered there, and torch keeps (or refuses) the value exactly as it would
without strict. A tensor or a list of modules left that way stays unregistered after
``__init__``; ``fastmodule.audit`` reports it on the finished model.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from fastmodule.tools.audit.findings import KINDS
from fastmodule.tools.audit.walk import EXAMPLE_INPUTS, class_attribute, contents, instance_dict

__all__ = [
    "StrictRegistrationError",
    "StrictRegistrationInfo",
    "StrictRegistrationWarning",
    "strict",
    "strict_enabled",
]


class StrictRegistrationWarning(UserWarning):
    """A value torch will not register was assigned to a module attribute."""


class StrictRegistrationError(TypeError):
    """Raised instead of :class:`StrictRegistrationWarning` under ``strict(error=True)``."""


class StrictRegistrationInfo(UserWarning):
    """Tensors torch will not register were assigned to a module attribute during a
    forward: most often a value kept for inspection or for the next call, not state.

    Not a :class:`StrictRegistrationWarning` (filters on that category leave it alone)
    and never raised, also under ``strict(error=True)``; hide it with
    ``warnings.filterwarnings("ignore", category=fastmodule.StrictRegistrationInfo)``.
    """


@dataclass(frozen=True)
class _Config:
    error: bool


@dataclass(frozen=True)
class _Site:
    """Where an assignment was made (what a warning at that line needs)."""

    filename: str
    lineno: int
    module: str | None
    globals: dict[str, Any]

    @classmethod
    def of(cls, frame: types.FrameType) -> _Site:
        return cls(
            frame.f_code.co_filename,
            frame.f_lineno,
            frame.f_globals.get("__name__"),
            frame.f_globals,
        )


@dataclass
class _Build:
    """One module under construction: how deep its ``__init__`` calls are, and the
    containers assigned meanwhile (name -> where), judged when the outermost returns."""

    depth: int = 0
    pending: dict[str, _Site] = field(default_factory=dict)


#: The active configuration (None: off) and torch's own ``__setattr__`` while on.
_config: _Config | None = None
_torch_setattr: Any = None
#: ``builtins.__build_class__`` as it was before strict was switched on.
_build_class_before: Any = None
#: Module classes looked at (their ``__init__`` wrapped if they have one of their own),
#: and those whose ``__init__`` is a wrapper; emptied when strict is switched off.
_seen: dict[type, None] = {}
_wrapped: list[type] = []
#: id of a module whose wrapped ``__init__`` is running -> its construction.
_building: dict[int, _Build] = {}

#: Code in these folders is torch's or fastmodule's own: its assignments are not checked.
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (torch.__file__, os.path.dirname(os.path.dirname(__file__)))
)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_CHECKED = (torch.Tensor, *_CONTAINERS)
#: Names of functions whose frame means "a module's forward is running".
_FORWARD = frozenset(("forward", "_call_impl", "_wrapped_call_impl"))
#: How many frames up the forward is looked for.
_FORWARD_DEPTH = 64


@functools.lru_cache(maxsize=4096)
def _own_file(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_OWN_DIRS)


def strict_enabled() -> bool:
    """Is strict mode on in this process?"""
    return _config is not None


class strict:  # noqa: N801 - used like a function, as torch.set_grad_enabled is
    """Turn strict registration on (or off with ``strict(False)``) for the process; as a
    context manager, the previous setting comes back when the block ends.

    ``fastmodule.strict()`` warns with :class:`StrictRegistrationWarning` at each
    assignment of a value ``torch.nn.Module.__setattr__`` keeps as a plain attribute
    although it holds modules, parameters or tensors; ``strict(error=True)`` raises
    :class:`StrictRegistrationError` there instead. The warning points at the
    assigning line of the user's code. Containers assigned inside a module's
    ``__init__`` are judged when that ``__init__`` returns (see the module docstring);
    tensors assigned during a forward are :class:`StrictRegistrationInfo`.
    """

    def __init__(self, enabled: bool = True, *, error: bool = False) -> None:
        self._previous = _config
        _switch(_Config(error) if enabled else None)

    def __enter__(self) -> strict:
        return self

    def __exit__(self, *exc: object) -> None:
        _switch(self._previous)


def _switch(config: _Config | None) -> None:
    global _config, _torch_setattr, _build_class_before
    module_class = torch.nn.Module
    if config is not None and _config is None:
        _torch_setattr = module_class.__dict__["__setattr__"]
        module_class.__setattr__ = _checked_setattr  # type: ignore[method-assign]
        _build_class_before = builtins.__build_class__
        builtins.__build_class__ = _build_class
        _config = config
        for cls in _subclasses(module_class):
            _watch(cls)
    elif config is None and _config is not None:
        # Only if still ours: someone may have patched it meanwhile, and theirs stays.
        if module_class.__dict__.get("__setattr__") is _checked_setattr:
            module_class.__setattr__ = _torch_setattr  # type: ignore[method-assign]
        _torch_setattr = None
        if builtins.__build_class__ is _build_class:
            builtins.__build_class__ = _build_class_before
        _build_class_before = None
        _unwrap_all()
    _config = config


def _subclasses(root: type) -> list[type]:
    out: list[type] = []
    stack, seen = [root], {root}
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                out.append(sub)
                stack.append(sub)
    return out


# --------------------------------------------------------------- the end of __init__


def _build_class(func: Any, name: str, /, *bases: Any, **kwds: Any) -> Any:
    """``builtins.__build_class__`` while strict is on: a module class defined now has
    its ``__init__`` wrapped like those defined before."""
    build = _build_class_before if _build_class_before is not None else _original_build_class
    cls = build(func, name, *bases, **kwds)
    if _config is not None and isinstance(cls, type) and torch.nn.Module in cls.__mro__:
        _watch(cls)
    return cls


_original_build_class = builtins.__build_class__


def _watch(cls: type) -> None:
    """Wrap ``cls.__init__`` (its own, a Python function outside torch and fastmodule)
    so the module's containers are judged when its construction ends."""
    if cls in _seen:
        return
    _seen[cls] = None
    init = vars(cls).get("__init__")
    if type(init) is not types.FunctionType or hasattr(init, "__fastmodule_strict__"):
        return
    if _own_file(init.__code__.co_filename):
        return
    try:
        type.__setattr__(cls, "__init__", _wrap(init))
    except (TypeError, AttributeError):
        return  # a class that refuses new attributes: its containers are judged at once
    _wrapped.append(cls)


def _watch_mro(cls: type) -> None:
    for klass in cls.__mro__:
        if klass is torch.nn.Module:
            break
        _watch(klass)


def _unwrap_all() -> None:
    for cls in _wrapped:
        wrapper = vars(cls).get("__init__")
        original = getattr(wrapper, "__fastmodule_strict__", None)
        if original is not None:
            type.__setattr__(cls, "__init__", original)
    _wrapped.clear()
    _seen.clear()


def _wrap(init: types.FunctionType) -> Any:
    @functools.wraps(init)
    def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        if _config is None:
            # Strict is off: only where a class decorator wrapped this wrapper while it
            # was on (the original cannot be put back from inside theirs).
            init(self, *args, **kwargs)
            return
        key = id(self)
        build = _building.get(key)
        if build is None:
            build = _building[key] = _Build()
        build.depth += 1
        try:
            init(self, *args, **kwargs)
        finally:
            build.depth -= 1
            if build.depth == 0:
                del _building[key]
        if build.depth == 0 and build.pending:
            _built(self, build)

    __init__.__fastmodule_strict__ = init  # type: ignore[attr-defined]
    return __init__


def _built(self: torch.nn.Module, build: _Build) -> None:
    """The outermost ``__init__`` of ``self`` returned: judge the containers assigned
    during it by what they hold now."""
    config = _config
    if config is None:
        return
    d = instance_dict(self)
    for name, site in build.pending.items():
        value = d.get(name)
        if not isinstance(value, _CONTAINERS) or not _kept_plain(d, name, value):
            continue  # replaced since, or its name registered meanwhile
        found = _diagnosis(self, name, value)
        if found is None:
            continue
        code, what, fix = found
        what += f" at the end of {type(self).__qualname__}.__init__"
        message = _message(f"{type(self).__qualname__}.{name}", what, code, fix)
        if config.error:
            raise StrictRegistrationError(f"{message} [assigned at {site.filename}:{site.lineno}]")
        _warn_at(site, message, StrictRegistrationWarning)


# --------------------------------------------------------------- the assignment


def _checked_setattr(self: torch.nn.Module, name: str, value: Any) -> None:
    config = _config
    original = _torch_setattr
    if config is not None and type(name) is str:
        cls = type(self)
        if cls not in _seen:
            _watch_mro(cls)  # a class made without a class statement (type(...))
        if isinstance(value, _CHECKED):
            frame = _assigning_frame(sys._getframe(1))
            if frame is not None:
                _check(config, self, name, value, frame)
    if original is None:  # switched off by another thread meanwhile
        original = torch.nn.Module.__dict__["__setattr__"]
    original(self, name, value)


def _check(
    config: _Config, self: torch.nn.Module, name: str, value: Any, frame: types.FrameType
) -> None:
    if not _kept_plain(instance_dict(self), name, value) or _exempt(type(self), name):
        return
    build = _building.get(id(self))
    if build is not None and not isinstance(value, torch.Tensor):
        build.pending[name] = _Site.of(frame)  # judged when __init__ returns
        return
    found = _diagnosis(self, name, value)
    if found is None:
        return
    code, what, fix = found
    info = _in_forward(frame)
    if info:
        what += " during a forward"
        fix = "nothing if it is kept for inspection or for the next call; else " + (
            fix or KINDS[code].fix
        )
    message = _message(f"{type(self).__qualname__}.{name}", what, code, fix)
    if info:
        _warn_at(_Site.of(frame), message, StrictRegistrationInfo)
    elif config.error:
        raise StrictRegistrationError(message)
    else:
        _warn_at(_Site.of(frame), message, StrictRegistrationWarning)


def _assigning_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The frame of the assignment, or None when torch's or fastmodule's own code made
    it (a subclass's ``__setattr__`` calling ``super().__setattr__`` is looked through)."""
    while frame is not None and frame.f_code.co_name == "__setattr__":
        frame = frame.f_back
    if frame is None or _own_file(frame.f_code.co_filename):
        return None
    return frame


def _in_forward(frame: types.FrameType | None) -> bool:
    """Is the assignment made while a module's forward runs (and not while a module is
    being built there)?"""
    for _ in range(_FORWARD_DEPTH):
        if frame is None:
            return False
        name = frame.f_code.co_name
        if name == "__init__":
            return False
        if name in _FORWARD:
            return True
        frame = frame.f_back
    return False


def _exempt(cls: type, name: str) -> bool:
    """Names strict leaves alone: Lightning's example input, and a name the class
    defines as a data descriptor (torch hands the value to it: a property's setter
    decides where it goes, and its own assignments are checked)."""
    if name in EXAMPLE_INPUTS:
        return True
    owner = class_attribute(cls, name)
    return owner is not None and hasattr(type(vars(owner)[name]), "__set__")


def _warn_at(site: _Site, message: str, category: type[Warning]) -> None:
    # No module_globals: from 3.13 on warn_explicit refuses globals whose __spec__ has
    # no loader (a script run by runpy); the source line is read from the file.
    registry = site.globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message,
        category,
        site.filename,
        site.lineno,
        module=site.module,
        registry=registry,
    )


_REGISTRIES = ("_parameters", "_buffers", "_modules")


def _registered(module: torch.nn.Module) -> set[int]:
    """ids of every module, parameter and buffer registered in ``module``'s tree now.

    Walks the ``_modules`` registries in the instance dicts (no method of the user's
    classes runs, and a child whose ``__init__`` has not run is only counted itself)."""
    seen: set[int] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        d = instance_dict(m)
        for registry in _REGISTRIES:
            entries = d.get(registry)
            if not isinstance(entries, dict):
                continue
            for v in dict.values(entries):
                if v is None:
                    continue
                if registry == "_modules":
                    stack.append(v)
                else:
                    seen.add(id(v))
    return seen


def _kept_plain(d: dict[str, Any], name: str, value: Any) -> bool:
    """Does ``torch.nn.Module.__setattr__`` keep ``value`` as a plain attribute (its
    last branch)? Not where it registers the value, raises its own error, or the
    module's ``__init__`` has not made the registries yet (nothing can be registered)."""
    if isinstance(value, torch.nn.Module | torch.nn.Parameter | torch.nn.Buffer):
        return False  # registered, or refused before __init__, by torch itself
    for registry in _REGISTRIES:
        entries = d.get(registry)
        if not isinstance(entries, dict) or name in entries:
            return False  # before __init__, or a registered name: torch's to handle
    return True


def _diagnosis(self: torch.nn.Module, name: str, value: Any) -> tuple[str, str, str | None] | None:
    """What assigning ``value`` to ``self.name`` leaves unregistered, as ``(code, what,
    fix)`` (``fix`` None: the kind's own), or None."""
    if isinstance(value, torch.Tensor):
        return "FM005", f"a tensor of shape {tuple(value.shape)}", None
    found = list(contents(name, value))
    if not found:
        return None
    registered = _registered(self)
    unregistered = [(w, v) for w, v in found if id(v) not in registered]
    if not unregistered:
        return None  # aliases of what the tree registers
    kind = type(value).__name__
    keyed = isinstance(value, dict)
    modules = [w for w, v in unregistered if isinstance(v, torch.nn.Module)]
    params = [w for w, v in unregistered if isinstance(v, torch.nn.Parameter)]
    if modules:
        fix = "use nn.ModuleDict" if keyed else "use nn.ModuleList"
        return "FM001", f"a plain {kind} with {_count(modules, 'module')}", fix
    if params:
        fix = "use nn.ParameterDict" if keyed else "use nn.ParameterList"
        return "FM002", f"a plain {kind} with {_count(params, 'parameter')}", fix
    return "FM003", f"a plain {kind} with {_count(unregistered, 'tensor')}", None


def _count(items: list[Any], word: str) -> str:
    return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"


def _message(where: str, what: str, code: str, fix: str | None = None) -> str:
    kind = KINDS[code]
    return f"{where} = {what}: {kind.why}; {fix or kind.fix} ({code}, fastmodule.strict)"
