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

Only assignments made by code outside torch and fastmodule are checked (torch's own
modules keep derived values as plain attributes on purpose, e.g. ``weight_norm``'s
recomputed weight or the RNNs' ``_flat_weights`` list), and a module or tensor already
registered in the module's tree (an alias such as ``self.first = self.blocks[0]``
inside a list) is not reported.

Only a value torch itself keeps as a plain attribute is checked: strict never reports
where torch registers the value (a module, a parameter, an ``nn.Buffer``, a buffer's or
a registered name's new value) or raises its own error (a tensor or list assigned to a
parameter's or child module's name, a module or parameter assigned before
``nn.Module.__init__``), so what torch does, and the text of what it raises, stay
torch's. An assignment made before ``nn.Module.__init__`` has run (``self.cfg = ...``
ahead of ``super().__init__()``) is not reported whatever it holds: the module has no
registries yet, nothing could have been registered there, and torch keeps (or refuses)
the value exactly as it would without strict. A tensor or a list of modules left that
way stays unregistered after ``__init__``; ``fastmodule.audit`` reports it on the
finished model.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from fastmodule.tools.audit.findings import KINDS
from fastmodule.tools.audit.walk import contents, instance_dict

__all__ = ["StrictRegistrationError", "StrictRegistrationWarning", "strict", "strict_enabled"]


class StrictRegistrationWarning(UserWarning):
    """A value torch will not register was assigned to a module attribute."""


class StrictRegistrationError(TypeError):
    """Raised instead of :class:`StrictRegistrationWarning` under ``strict(error=True)``."""


@dataclass(frozen=True)
class _Config:
    error: bool


#: The active configuration (None: off) and torch's own ``__setattr__`` while on.
_config: _Config | None = None
_torch_setattr: Any = None

#: Code in these folders is torch's or fastmodule's own: its assignments are not checked.
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (torch.__file__, os.path.dirname(os.path.dirname(__file__)))
)


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
    assigning line of the user's code.
    """

    def __init__(self, enabled: bool = True, *, error: bool = False) -> None:
        self._previous = _config
        _switch(_Config(error) if enabled else None)

    def __enter__(self) -> strict:
        return self

    def __exit__(self, *exc: object) -> None:
        _switch(self._previous)


def _switch(config: _Config | None) -> None:
    global _config, _torch_setattr
    module_class = torch.nn.Module
    if config is not None and _config is None:
        _torch_setattr = module_class.__dict__["__setattr__"]
        module_class.__setattr__ = _checked_setattr  # type: ignore[method-assign]
    elif config is None and _config is not None:
        # Only if still ours: someone may have patched it meanwhile, and theirs stays.
        if module_class.__dict__.get("__setattr__") is _checked_setattr:
            module_class.__setattr__ = _torch_setattr  # type: ignore[method-assign]
        _torch_setattr = None
    _config = config


def _checked_setattr(self: torch.nn.Module, name: str, value: Any) -> None:
    config = _config
    original = _torch_setattr
    if config is not None and type(name) is str:
        frame = _assigning_frame(sys._getframe(1))
        if frame is not None:
            message = _problem(self, name, value)
            if message is not None:
                if config.error:
                    raise StrictRegistrationError(message)
                _warn_at(frame, message)
    if original is None:  # switched off by another thread meanwhile
        original = torch.nn.Module.__dict__["__setattr__"]
    original(self, name, value)


def _assigning_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The frame of the assignment, or None when torch's or fastmodule's own code made
    it (a subclass's ``__setattr__`` calling ``super().__setattr__`` is looked through)."""
    while frame is not None and frame.f_code.co_name == "__setattr__":
        frame = frame.f_back
    if frame is None or os.path.abspath(frame.f_code.co_filename).startswith(_OWN_DIRS):
        return None
    return frame


def _warn_at(frame: types.FrameType, message: str) -> None:
    # No module_globals: from 3.13 on warn_explicit refuses globals whose __spec__ has
    # no loader (a script run by runpy); the source line is read from the file.
    registry = frame.f_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        message,
        StrictRegistrationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__"),
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


def _problem(self: torch.nn.Module, name: str, value: Any) -> str | None:
    """Why assigning ``value`` to ``self.name`` leaves something unregistered, or None."""
    if not isinstance(value, torch.Tensor | list | tuple | dict | set | frozenset):
        return None  # None, a module, a number, ...: nothing to look into
    if not _kept_plain(instance_dict(self), name, value):
        return None
    where = f"{type(self).__qualname__}.{name}"
    if isinstance(value, torch.Tensor):
        return _message(where, f"a tensor of shape {tuple(value.shape)}", "FM005")
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
        return _message(where, f"a plain {kind} with {_count(modules, 'module')}", "FM001", fix)
    if params:
        fix = "use nn.ParameterDict" if keyed else "use nn.ParameterList"
        return _message(where, f"a plain {kind} with {_count(params, 'parameter')}", "FM002", fix)
    return _message(where, f"a plain {kind} with {_count(unregistered, 'tensor')}", "FM003")


def _count(items: list[Any], word: str) -> str:
    return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"


def _message(where: str, what: str, code: str, fix: str | None = None) -> str:
    kind = KINDS[code]
    return f"{where} = {what}: {kind.why}; {fix or kind.fix} ({code}, fastmodule.strict)"
