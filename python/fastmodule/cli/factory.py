"""Loading a model from a factory spec on the command line.

A spec names a callable that returns a model: ``pkg.module:factory`` (imported
like ``import pkg.module``, the current directory first on the path) or
``path/to/file.py:factory`` (that file run as a module, its directory first
on the path). The callable takes no arguments and returns a
``torch.nn.Module`` or a ``(model, example_inputs)`` tuple; the name may be
dotted (``pkg.module:Builder.small``). A spec that names a module instance
uses it as is (it is not called: that would run its forward).

Every way this can fail raises :class:`FactoryError` with a message that says
what to do; the commands print it and exit with status 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

__all__ = ["FORMAT", "FactoryError", "Loaded", "load_factory", "parse_spec"]

#: How a spec is written, for messages.
FORMAT = "pkg.module:factory or path/to/file.py:factory"


class FactoryError(Exception):
    """A factory spec that could not give a model; the text says what to do."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What a factory gave."""

    model: torch.nn.Module
    #: The example inputs of a ``(model, example_inputs)`` factory, else None.
    example_inputs: Any
    #: The spec it came from.
    spec: str


def parse_spec(spec: str) -> tuple[str, str]:
    """``"target:name"`` -> ``(target, name)``; :class:`FactoryError` if malformed."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise FactoryError(f"bad factory spec {spec!r}: expected {FORMAT}")
    if not all(part.isidentifier() for part in name.split(".")):
        raise FactoryError(
            f"bad factory spec {spec!r}: {name!r} is not a Python name (expected {FORMAT})"
        )
    return target, name


def _is_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


@contextlib.contextmanager
def _first_on_path(directory: str) -> Iterator[None]:
    """``directory`` first on ``sys.path`` for the block (as ``python script.py`` and
    ``python -m`` put it), removed after unless it was there before."""
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        yield
    finally:
        if added and directory in sys.path:
            sys.path.remove(directory)


def _raised(what: str, e: BaseException) -> FactoryError:
    # The innermost frame of the user's code, not of this loader or importlib.
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if f.filename != __file__ and not f.filename.startswith("<frozen")
    ]
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return FactoryError(f"{what} raised {type(e).__name__}: {e}{at}")


def _import_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise FactoryError(f"no such file: {path} (expected {FORMAT})")
    full = os.path.abspath(path)
    name = "_fastmodule_factory_" + "".join(c if c.isalnum() else "_" for c in full)
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise FactoryError(f"cannot load {path} as a Python module (expected {FORMAT})")
    module = importlib.util.module_from_spec(spec)
    # Registered first, as import does: dataclasses and pickling look it up.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise _raised(f"running {path}", e) from e
    return module


def _import_module(target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):
            raise FactoryError(
                f"cannot import {target!r}: no module named {e.name!r}. Run from the "
                "directory that holds it, add that directory to PYTHONPATH, or name a file "
                f"({FORMAT})"
            ) from e
        raise _raised(f"importing {target!r}", e) from e
    except Exception as e:
        raise _raised(f"importing {target!r}", e) from e


def _attribute(module: ModuleType, target: str, name: str) -> Any:
    obj: Any = module
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            have = sorted(k for k in vars(module) if not k.startswith("_"))
            raise FactoryError(
                f"{target!r} has no attribute {name!r} (it has: {', '.join(have[:12]) or 'none'}"
                f"{', ...' if len(have) > 12 else ''})"
            ) from None
    return obj


def load_factory(spec: str) -> Loaded:
    """Import the factory ``spec`` names, call it, and check what it returned.

    Raises:
        FactoryError: the spec is malformed, the module or file cannot be
            imported, the name is missing or not callable, the call raised, or
            it returned something other than a model or ``(model, inputs)``.
    """
    target, name = parse_spec(spec)
    directory = os.path.dirname(os.path.abspath(target)) if _is_file(target) else os.getcwd()
    with _first_on_path(directory):
        module = _import_file(target) if _is_file(target) else _import_module(target)
        factory = _attribute(module, target, name)
        if isinstance(factory, torch.nn.Module):
            return Loaded(factory, None, spec)
        if not callable(factory):
            raise FactoryError(
                f"{spec}: {name} is a {type(factory).__name__}, not a callable returning a model"
            )
        try:
            made = factory()
        except Exception as e:
            raise _raised(f"calling {spec}", e) from e
    if isinstance(made, torch.nn.Module):
        return Loaded(made, None, spec)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        return Loaded(made[0], made[1], spec)
    raise FactoryError(
        f"{spec} returned {type(made).__name__}: expected a torch.nn.Module or a "
        "(model, example_inputs) tuple"
    )
