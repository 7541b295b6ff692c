"""fastmodule: ``torch.nn.Module`` with its hot paths in Rust, exactly stock semantics.

Swap the base class, or accelerate a model you already have::

    import fastmodule

    class Net(fastmodule.Module):
        ...

    model = fastmodule.accelerate(model)  # any torch.nn.Module tree, in place

``from fastmodule import nn`` is a drop-in for ``torch.nn``, and
``fastmodule.install()`` (or ``python -m fastmodule run script.py``)
accelerates every module class in the process.
"""

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

__all__ = [
    "Module",
    "__version__",
    "accelerate",
    "accelerated",
    "install",
    "installed",
    "is_accelerated",
    "restore",
    "slots_of",
    "uninstall",
]
__version__ = "0.1.0"
