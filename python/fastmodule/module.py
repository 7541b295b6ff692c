"""``fastmodule.Module``: a ``torch.nn.Module`` whose hot paths run in Rust."""

from __future__ import annotations

from typing import Any

import torch

from fastmodule import _core
from fastmodule._methods import conversion, loading, saving, walks
from fastmodule._methods import dispatch as _dispatch
from fastmodule._methods import dotted_paths as paths
from fastmodule._verified import verification

__all__ = ["Module", "slots_of"]


class Module(torch.nn.Module):
    """Drop-in base class for ``torch.nn.Module``.

    Calling the module, reading registered parameters/buffers/submodules,
    registering them, and the whole-tree walks (``named_modules``,
    ``named_parameters``, ``parameters``, ``buffers``, ``children``, ``train``,
    ``eval``, ``requires_grad_``, ``zero_grad``, ``apply``) run in Rust with
    exactly stock semantics, and ``load_state_dict`` runs in linear time. For
    the call, attribute and registration paths nothing Python-visible changes:
    ``type(m).__call__`` is ``torch.nn.Module.__call__`` and the registries are
    the usual dicts, so ``torch.compile``, FX, export and tools that patch
    ``torch.nn.Module`` see a stock module. The walk methods and
    ``load_state_dict`` are defined here with torch's signatures and docstrings
    and run torch's own code under ``torch.compile`` or when patched. Any case a
    fast path does not cover (hooks, jit tracing, ``module.compile()``, an
    overridden ``__call__``/``__getattr__``/``__setattr__``, a patched base
    class) runs torch's own code.
    """

    # Whole-tree methods: same signatures and docstrings as torch's, walked in Rust.
    named_modules = walks.named_modules
    modules = walks.modules
    named_children = walks.named_children
    children = walks.children
    named_parameters = walks.named_parameters
    parameters = walks.parameters
    named_buffers = walks.named_buffers
    buffers = walks.buffers
    train = walks.train
    eval = walks.eval
    requires_grad_ = walks.requires_grad_
    zero_grad = walks.zero_grad
    apply = walks.apply
    # state_dict walked natively.
    state_dict = saving.state_dict
    # Linear-time load_state_dict (torch's per-module loading, bucketed keys).
    load_state_dict = loading.load_state_dict
    # Dotted paths: get_submodule & co.
    get_submodule = paths.get_submodule
    set_submodule = paths.set_submodule
    get_parameter = paths.get_parameter
    get_buffer = paths.get_buffer
    # Behind .to()/.float()/.half()/.cuda()/...: converted in Rust.
    _apply = conversion.apply_fn

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Slots are per class; CPython recomputes them for each new subclass.
        if NATIVE:
            _core.install_class(cls)


def _inherit_stock_methods() -> None:
    """A method whose native body is off is torch's own, inherited (so a patch
    of torch.nn.Module's reaches fastmodule.Module too, as for any subclass)."""
    for name in _dispatch.STOCK:
        delattr(Module, name)


_inherit_stock_methods()

#: Whether any native path is on in this process (see fastmodule._verified.verification).
NATIVE = verification.native_problem() is None


def slots_of(cls: type) -> tuple[bool, bool, bool]:
    """Which native slots (call, getattr, setattr) ``cls`` carries right now."""
    if not NATIVE:
        return (False, False, False)
    return _core.installed(cls)
