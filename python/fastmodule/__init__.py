"""fastmodule: ``torch.nn.Module`` with its hot paths in Rust, exactly stock semantics.

Swap the base class::

    import fastmodule

    class Net(fastmodule.Module):
        ...
"""

from fastmodule.module import Module, slots_of

__all__ = ["Module", "slots_of", "__version__"]
__version__ = "0.1.0"
