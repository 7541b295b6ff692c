"""fastmodule: ``torch.nn.Module`` with its hot paths in Rust, exactly stock semantics.

Swap the base class, or accelerate a model you already have::

    import fastmodule

    class Net(fastmodule.Module):
        ...

    model = fastmodule.accelerate(model)  # any torch.nn.Module tree, in place

``from fastmodule import nn`` is a drop-in for ``torch.nn``, and
``fastmodule.install()`` (or ``python -m fastmodule run script.py``)
accelerates every module class in the process.

``fastmodule.diagnostics()`` (or ``python -m fastmodule doctor``) lists which
native paths are on for this interpreter and torch, and why any is off.

``with fastmodule.disabled():`` (or ``FASTMODULE_DISABLE=1`` in the environment)
runs torch's own code on every path: rule fastmodule in or out in one line.

``fastmodule.audit(model)`` (or ``python -m fastmodule audit pkg.module:factory``)
reports modules, parameters and tensors a model silently does not register.

``fastmodule.check(model, *example_args)`` (or ``python -m fastmodule check
pkg.module:factory``) compares the model stock and accelerated, exactly, and times both.

``with fastmodule.strict():`` (or ``python -m fastmodule run --strict script.py``) warns at
each assignment of an unregistered module, parameter or tensor to a module attribute.

``fastmodule.report()`` (or ``python -m fastmodule run --report script.py``) counts every
module call of the program and tells which ran torch's path instead of the native one,
by class and why; ``with fastmodule.reporting() as calls:`` does it for one block.
"""

import importlib as _importlib
import warnings as _warnings
from typing import TYPE_CHECKING as _TYPE_CHECKING

from fastmodule import _startup
from fastmodule.acceleration import (
    accelerate,
    accelerated,
    install,
    installed,
    is_accelerated,
    restore,
    uninstall,
)
from fastmodule.module import Module, slots_of
from fastmodule.native_paths import PathStatus, diagnostics, unverified_message
from fastmodule.switch import disabled
from fastmodule.verification import UnverifiedWarning

__all__ = [
    "Module",
    "CallReport",
    "PathStatus",
    "StrictRegistrationError",
    "StrictRegistrationInfo",
    "StrictRegistrationWarning",
    "UnverifiedWarning",
    "__version__",
    "accelerate",
    "accelerated",
    "audit",
    "check",
    "diagnostics",
    "disabled",
    "install",
    "installed",
    "is_accelerated",
    "report",
    "reporting",
    "restore",
    "slots_of",
    "strict",
    "strict_enabled",
    "uninstall",
]
__version__ = "0.1.0"

# What import installs (the native core's configuration, torch's routed methods, the
# switch), in order: fastmodule._startup.
_startup.start()

# Once per process (module code runs once), attributed to the importing line.
_unverified = unverified_message()
if _unverified is not None:
    _warnings.warn(_unverified, UnverifiedWarning, stacklevel=2)
del _unverified

# The user tools are imported on first use (``import fastmodule`` stays what the
# native paths need).
_TOOLS = {
    "audit": "fastmodule.tools.audit",
    "check": "fastmodule.tools.check",
    "report": "fastmodule.tools.report",
    "reporting": "fastmodule.tools.report",
    "CallReport": "fastmodule.tools.report",
    "strict": "fastmodule.tools.strict",
    "strict_enabled": "fastmodule.tools.strict",
    "StrictRegistrationError": "fastmodule.tools.strict",
    "StrictRegistrationInfo": "fastmodule.tools.strict",
    "StrictRegistrationWarning": "fastmodule.tools.strict",
}

if _TYPE_CHECKING:
    from fastmodule.tools.audit import audit
    from fastmodule.tools.check import check
    from fastmodule.tools.report import CallReport, report, reporting
    from fastmodule.tools.strict import (
        StrictRegistrationError,
        StrictRegistrationInfo,
        StrictRegistrationWarning,
        strict,
        strict_enabled,
    )


def __dir__() -> list[str]:
    # The tools imported on first use are attributes too (dir(), completion).
    return sorted({*globals(), *_TOOLS})


def __getattr__(name: str) -> object:
    module = _TOOLS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastmodule' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value
