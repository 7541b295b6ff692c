"""Accelerating modules people already have, in place.

``accelerate(model)`` gives every module class in ``model``'s tree
fastmodule's native paths. Nothing Python-visible changes: classes keep their
identity, name, dict and MRO (``type(m) is torch.nn.Linear`` still holds, so
code that maps exact types, such as quantization, keeps working), instances
keep their ``__dict__``, and checkpoints and pickles are those of stock
modules. What changes is how CPython runs them: the call and attribute-read
slots of each class point at Rust, registration and ``torch.nn.Module``'s
whole-tree methods run fastmodule's native bodies for their instances.

Acceleration is per class, so it reaches every instance of an accelerated
class in the process; since behaviour is stock either way, that is only a
matter of speed. ``restore`` undoes it for the classes of a tree.

torch's whole-tree methods reach the native bodies through a statement put
in front of their code (``fastmodule._verified.inline_routes``). The classes are held
weakly: a class made at run time (``torch.fx``, parametrization) still dies
when nothing else holds it.

Where no native path is on (an interpreter fastmodule has not verified, see
``fastmodule.diagnostics()``) these functions change nothing: models run
torch's code and :func:`is_accelerated` answers False.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import torch

from fastmodule import _core
from fastmodule.module import NATIVE, Module

__all__ = [
    "accelerate",
    "accelerated",
    "install",
    "installed",
    "is_accelerated",
    "restore",
    "uninstall",
]

M = TypeVar("M", bound=torch.nn.Module)


def _classes(model: torch.nn.Module) -> list[type]:
    """The module classes in ``model``'s tree, in walk order, each once."""
    seen: dict[type, None] = {}
    for m in torch.nn.Module.modules(model):
        seen.setdefault(type(m), None)
    return list(seen)


def _check(model: Any, what: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{what}() expects a torch.nn.Module, got {type(model).__name__}")


def accelerate(model: M) -> M:
    """Give every module in ``model``'s tree fastmodule's native paths; returns ``model``.

    Idempotent, and safe on any ``torch.nn.Module`` tree: a class whose
    methods make a native path inapplicable keeps torch's code for that path
    (for example a class that overrides ``__getattr__``). If accelerating any
    class fails, the classes accelerated by this call are restored before the
    exception propagates.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    _check(model, "accelerate")
    if not NATIVE:
        return model
    done: list[type] = []
    try:
        for cls in _classes(model):
            if issubclass(cls, Module) or _core.is_accelerated_class(cls):
                continue
            _core.accelerate_class(cls)
            done.append(cls)
    except BaseException:
        for cls in done:
            _core.restore_class(cls)
        raise
    return model


@contextlib.contextmanager
def accelerated(model: M) -> Iterator[M]:
    """``with accelerated(model):`` accelerates ``model``'s classes for the block and
    restores, on exit, exactly those that were not accelerated before it (giving back
    what was kept for walks, as :func:`restore` does for its tree, when it restores any)."""
    _check(model, "accelerated")
    if not NATIVE:
        yield model
        return
    newly = [
        cls
        for cls in _classes(model)
        if not issubclass(cls, Module) and not _core.is_accelerated_class(cls)
    ]
    accelerate(model)
    try:
        yield model
    finally:
        for cls in newly:
            _core.restore_class(cls)
        if newly:
            # Everything kept, not just this tree's: the exit must not walk the tree,
            # which the block may have left unwalkable (a module's ``_modules``
            # deleted) or whose walk may run a user's ``named_modules``; an exit
            # that raised would also replace the block's own exception. Other trees
            # only record their walks again.
            _core.forget_all()


def restore(model: M) -> M:
    """Undo :func:`accelerate` for the classes in ``model``'s tree; returns ``model``.

    ``fastmodule.Module`` subclasses stay fast: that is their definition.
    What fastmodule remembered about the tree (the walks recorded for its
    modules, the names built for them) is given back.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    _check(model, "restore")
    if not NATIVE:
        return model
    modules = list(torch.nn.Module.modules(model))
    for cls in dict.fromkeys(type(m) for m in modules):
        _core.restore_class(cls)
    _core.forget_tree(modules)
    return model


def is_accelerated(module: Any) -> bool:
    """Does ``module`` take fastmodule's native paths?"""
    if not NATIVE or not isinstance(module, torch.nn.Module):
        return False
    cls = type(module)
    return issubclass(cls, Module) or _core.is_accelerated_class(cls)


def _all_subclasses(root: type) -> list[type]:
    out: list[type] = []
    stack = [root]
    seen: set[type] = set()
    while stack:
        cls = stack.pop()
        for sub in type.__subclasses__(cls):
            if sub not in seen:
                seen.add(sub)
                out.append(sub)
                stack.append(sub)
    return out


_INSTALLED: dict[str, Any] = {}


def _accelerate_new_class(cls: type, **kwargs: Any) -> None:
    """``torch.nn.Module.__init_subclass__`` while installed."""
    super(torch.nn.Module, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
    if not issubclass(cls, Module):
        _core.accelerate_class(cls)


def install() -> None:
    """Accelerate every ``torch.nn.Module`` subclass in the process, including
    classes defined later (through ``torch.nn.Module.__init_subclass__``).

    For users who cannot touch model code; ``python -m fastmodule run script.py``
    does this before running the script. Idempotent; :func:`uninstall` undoes it.
    Where no native path is on it changes nothing.
    """
    if "__init_subclass__" in _INSTALLED or not NATIVE:
        return
    if "__init_subclass__" in torch.nn.Module.__dict__:
        raise RuntimeError("torch.nn.Module already defines __init_subclass__; not installing")
    torch.nn.Module.__init_subclass__ = classmethod(_accelerate_new_class)  # type: ignore[assignment]
    _INSTALLED["__init_subclass__"] = True
    for cls in _all_subclasses(torch.nn.Module):
        if not issubclass(cls, Module):
            _core.accelerate_class(cls)


def installed() -> bool:
    """Is :func:`install` in effect?"""
    return "__init_subclass__" in _INSTALLED


def uninstall() -> None:
    """Undo :func:`install`: stop accelerating new classes and restore all (what was
    kept for any tree is given back)."""
    if _INSTALLED.pop("__init_subclass__", None) is None:
        return
    if "__init_subclass__" in torch.nn.Module.__dict__:
        del torch.nn.Module.__init_subclass__
    for cls in _all_subclasses(torch.nn.Module):
        _core.restore_class(cls)
    _core.forget_all()
