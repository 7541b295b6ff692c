"""``load_state_dict`` edge cases of the native ``_load_from_state_dict`` path.

The native path covers the common case only; each test here sits on one of its
borders (the flags, modes, tensor kinds and errors that make it hand over to
torch's code) and compares everything observable with stock, using the helpers
of ``test_parity_load_state_dict``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tests.conftest import BASES
from tests.test_parity_load_state_dict import Base, Ctx, check, classes, fresh


def net(base: Base) -> nn.Module:
    return classes(base).Net()


def test_dtype_casting_copies() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        for k, v in sd.items():
            if v.is_floating_point():
                sd[k] = v.double()
        return m.load_state_dict(sd)

    check(net, act)


def test_copy_error_message() -> None:
    """A meta tensor in the checkpoint: copy_ raises, torch reports it in its message."""

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        sd["lin.weight"] = torch.empty(3, 2, device="meta")
        return m.load_state_dict(sd, strict=False)

    check(net, act)


def test_meta_parameters_warn() -> None:
    def build(base: Base) -> nn.Module:
        with torch.device("meta"):
            return classes(base).Net()

    def act(m: nn.Module, ctx: Ctx) -> Any:
        src = classes(nn.Module).Net()
        return m.load_state_dict(ctx.track(src.state_dict()))

    check(build, act)


def test_scalar_from_one_element() -> None:
    """torch's 0.3 compatibility: a 0-dim entry loads from a 1-element checkpoint tensor."""

    def build(base: Base) -> nn.Module:
        class Scalar(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("s", torch.tensor(1.0))
                self.lin = nn.Linear(1, 1)

        return Scalar()

    def act(m: nn.Module, ctx: Ctx) -> Any:
        return m.load_state_dict(
            ctx.track(OrderedDict(s=torch.tensor([3.0]), **{"lin.weight": torch.ones(1, 1)})),
            strict=False,
        )

    check(build, act)


def test_non_tensor_and_subclass_entries() -> None:
    class Sub(torch.Tensor):
        pass

    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        sd["lin.bias"] = [1.0, 2.0, 3.0]
        sd["bn.weight"] = sd["bn.weight"].as_subclass(Sub)
        return m.load_state_dict(sd, strict=False)

    check(net, act)


def test_swap_flag_set_by_a_pre_hook() -> None:
    """torch reads the flag per module: a hook that flips it changes later modules."""

    def act(m: nn.Module, ctx: Ctx) -> Any:
        def flip(*args: Any) -> None:
            torch.__future__.set_swap_module_params_on_conversion(True)

        m.inner._register_load_state_dict_pre_hook(flip)
        try:
            return m.load_state_dict(fresh(m, ctx))
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)

    check(net, act)


@pytest.mark.parametrize("flag", [False, True])
def test_swap_flag(flag: bool) -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        torch.__future__.set_swap_module_params_on_conversion(flag)
        try:
            return m.load_state_dict(fresh(m, ctx))
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)

    check(net, act)


def test_torch_function_mode_sees_the_same_calls() -> None:
    seen: dict[str, list[str]] = {}

    class Log(TorchFunctionMode):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.setdefault(self.name, []).append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    results = []
    for name, base in zip(("stock", "fast"), BASES, strict=True):
        torch.manual_seed(0)
        m = classes(base).Net()
        sd = fresh(m)
        with Log(name):
            results.append(repr(m.load_state_dict(sd)))
    assert results[0] == results[1]
    assert seen["stock"] == seen["fast"]


def test_unexpected_keys_and_extra_state_key() -> None:
    def act(m: nn.Module, ctx: Ctx) -> Any:
        sd = fresh(m, ctx)
        sd["inner._extra_state"] = 1
        sd["inner.nope"] = torch.ones(1)
        sd["inner.np"] = torch.ones(2)  # a non-persistent buffer: unexpected
        sd["inner.ghost.x"] = torch.ones(1)
        sd["lin.weight.x"] = torch.ones(1)
        sd["seq.0.weight.y"] = torch.ones(1)
        del sd["seq.1.b"]
        return m.load_state_dict(sd, strict=False)

    check(net, act)
    check(net, lambda m, ctx: m.load_state_dict(fresh(m, ctx) | {"x": torch.ones(1)}))


def test_parameter_subclass_and_plain_tensor_parameter() -> None:
    class MyParam(nn.Parameter):
        pass

    def build(base: Base) -> nn.Module:
        m = classes(base).Net()
        m.inner._parameters["p"] = MyParam(torch.randn(2))
        m.seq[1]._parameters["p"] = torch.randn(2)
        return m

    check(build, lambda m, ctx: m.load_state_dict(fresh(m, ctx)))


def test_load_from_state_dict_shadowed_on_the_instance() -> None:
    def build(base: Base) -> nn.Module:
        m = classes(base).Net()
        log = m.inner.__dict__.setdefault("count", [])
        orig = m.inner._load_from_state_dict

        def shadow(*args: Any) -> None:
            log.append(args[1])
            orig(*args)

        m.inner._load_from_state_dict = shadow
        return m

    check(build, lambda m, ctx: m.load_state_dict(fresh(m, ctx)))


def test_requires_grad_and_versions_after_load() -> None:
    versions = []
    for base in BASES:
        torch.manual_seed(0)
        m = classes(base).Net()
        m.lin.weight.requires_grad_(False)
        m.load_state_dict(fresh(m))
        versions.append(
            [(n, p.requires_grad, p._version) for n, p in m.named_parameters()]
            + [(n, t._version) for n, t in m.named_buffers()]
        )
    assert versions[0] == versions[1]
