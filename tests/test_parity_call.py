"""Module calls: fast path and hand-over to torch's _call_impl, compared with stock."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as torch_module

import fastmodule
from tests.conftest import BASES, NATIVE, outcome


def make(base: type[nn.Module], log: list[Any]) -> nn.Module:
    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            log.append(("forward", scale))
            return x * self.w * scale

    return Leaf()


def norm(v: Any) -> Any:
    """Tensors as nested lists, recursively, so results compare with ==."""
    if isinstance(v, torch.Tensor):
        return v.detach().tolist()
    if isinstance(v, (tuple, list)):
        return type(v)(norm(e) for e in v)
    return v


def both(scenario: Any) -> tuple[Any, Any]:
    """Run scenario(base, log) on stock and fast; return both (result, log)."""
    out = []
    for b in BASES:
        log: list[Any] = []
        r = outcome(lambda b=b, log=log: norm(scenario(b, log)))
        out.append((r, log))
    return out[0], out[1]


def test_call_equals_forward(base: type[nn.Module]) -> None:
    m = make(base, [])
    x = torch.arange(3.0)
    assert torch.equal(m(x), m.forward(x))
    assert torch.equal(m(x, scale=2.0), m.forward(x, 2.0))
    assert torch.equal(m(x, 3.0), m.forward(x, scale=3.0))


def test_call_argument_errors_match() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        return make(b, log)(torch.ones(3), 1.0, 2.0)

    stock, fast = both(sc)
    assert stock == fast

    def sc2(b: type[nn.Module], log: list[Any]) -> Any:
        return make(b, log)(torch.ones(3), nope=1)

    stock, fast = both(sc2)
    assert stock == fast


def test_many_args_and_kwargs(base: type[nn.Module]) -> None:
    class Many(base):  # type: ignore[misc, valid-type]
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return args, kwargs

    m = Many()
    args = tuple(range(20))
    assert m(*args, a=1, b=2) == (args, {"a": 1, "b": 2})
    assert m() == ((), {})


def test_forward_hooks_order_prepend_kwargs_always_call() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m.register_forward_pre_hook(lambda mod, a: log.append("pre1"))
        m.register_forward_pre_hook(lambda mod, a: log.append("pre0"), prepend=True)
        m.register_forward_pre_hook(
            lambda mod, a, k: (log.append(("prek", k)), (a, {"scale": 2.0}))[1], with_kwargs=True
        )
        m.register_forward_hook(lambda mod, a, o: log.append("post1"))
        m.register_forward_hook(lambda mod, a, o: log.append("post0"), prepend=True)
        m.register_forward_hook(
            lambda mod, a, k, o: (log.append(("postk", k)), o + 1)[1], with_kwargs=True
        )
        m.register_forward_hook(lambda mod, a, o: log.append("always"), always_call=True)
        return m(torch.ones(3), scale=1.0)

    stock, fast = both(sc)
    assert stock == fast
    assert stock[1]


def test_always_call_hook_runs_on_exception() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        class Boom(b):  # type: ignore[misc, valid-type]
            def forward(self, x: Any) -> Any:
                raise ValueError("boom")

        m = Boom()
        m.register_forward_hook(lambda mod, a, o: log.append("always"), always_call=True)
        m.register_forward_hook(lambda mod, a, o: log.append("normal"))
        return m(1)

    stock, fast = both(sc)
    assert stock == fast
    assert stock[1] == ["always"]


def test_global_hooks() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        hs = [
            torch_module.register_module_forward_pre_hook(lambda m, a: log.append("gpre")),
            torch_module.register_module_forward_hook(lambda m, a, o: log.append("gpost")),
        ]
        try:
            m = make(b, log)
            m.register_forward_hook(lambda mod, a, o: log.append("local"))
            return m(torch.ones(3))
        finally:
            for h in hs:
                h.remove()

    stock, fast = both(sc)
    assert stock == fast
    assert "gpre" in stock[1]


def test_global_hook_dict_written_directly() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m(torch.ones(3))
        torch_module._global_forward_hooks[10**9] = lambda mod, a, o: log.append("direct")
        try:
            return m(torch.ones(3))
        finally:
            del torch_module._global_forward_hooks[10**9]

    stock, fast = both(sc)
    assert stock == fast
    assert "direct" in stock[1]


def test_instance_hook_dict_written_directly() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m(torch.ones(3))
        m._forward_hooks[123] = lambda mod, a, o: log.append("direct")
        r1 = m(torch.ones(3))
        m._forward_hooks.clear()
        m._forward_pre_hooks = OrderedDict({5: lambda mod, a: log.append("pre")})
        r2 = m(torch.ones(3))
        return r1, r2

    stock, fast = both(sc)
    assert stock == fast
    assert "direct" in stock[1] and "pre" in stock[1]


def test_hook_removal_restores_fast_path(base: type[nn.Module]) -> None:
    log: list[Any] = []
    m = make(base, log)
    h = m.register_forward_hook(lambda mod, a, o: log.append("h"))
    m(torch.ones(3))
    h.remove()
    m(torch.ones(3))
    assert log.count("h") == 1


def test_full_backward_hooks() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m.register_full_backward_pre_hook(lambda mod, go: log.append(("bpre", len(go))))
        m.register_full_backward_hook(
            lambda mod, gi, go: log.append(("bhook", [g is None for g in gi]))
        )
        x = torch.ones(3, requires_grad=True)
        m(x).sum().backward()
        return x.grad

    stock, fast = both(sc)
    assert stock == fast
    assert any(e[0] == "bhook" for e in stock[1] if isinstance(e, tuple))


def test_reentrant_self_call(base: type[nn.Module]) -> None:
    class Rec(base):  # type: ignore[misc, valid-type]
        def forward(self, n: int) -> int:
            return 0 if n == 0 else 1 + self(n - 1)

    assert Rec()(50) == 50


def test_forward_replaced_on_instance(base: type[nn.Module]) -> None:
    m = make(base, [])
    m.forward = lambda x: ("instance", x)  # type: ignore[method-assign]
    assert m(1) == ("instance", 1)
    del m.forward
    assert torch.equal(m(torch.ones(3)), torch.ones(3))


def test_forward_property_and_missing_forward() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        class Prop(b):  # type: ignore[misc, valid-type]
            @property
            def forward(self) -> Any:
                log.append("prop")
                return lambda x: x + 1

        return Prop()(1)

    stock, fast = both(sc)
    assert stock == fast

    def sc2(b: type[nn.Module], log: list[Any]) -> Any:
        class NoForward(b):  # type: ignore[misc, valid-type]
            pass

        return NoForward()(1)

    stock, fast = both(sc2)
    assert stock[0][:2] == fast[0][:2]


def test_compiled_call_impl_is_honoured(base: type[nn.Module]) -> None:
    m = make(base, [])
    m._compiled_call_impl = lambda *a, **k: "compiled"
    assert m(torch.ones(3)) == "compiled"
    m._compiled_call_impl = None
    assert torch.equal(m(torch.ones(3)), torch.ones(3))


def test_call_without_init() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        class NoInit(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                pass

            def forward(self, x: Any) -> Any:
                return x

        return NoInit()(1)

    stock, fast = both(sc)
    assert stock == fast


def test_subclass_with_own_call_and_getattr_keeps_them(base: type[nn.Module]) -> None:
    class OwnCall(base):  # type: ignore[misc, valid-type]
        def __call__(self, *a: Any) -> Any:
            return ("own", super().__call__(*a))

        def forward(self, x: Any) -> Any:
            return x

    class OwnGetattr(base):  # type: ignore[misc, valid-type]
        def __getattr__(self, name: str) -> Any:
            if name == "magic":
                return 42
            return super().__getattr__(name)

    assert OwnCall()(1) == ("own", 1)
    g = OwnGetattr()
    g.sub = nn.Identity()
    assert g.magic == 42
    assert isinstance(g.sub, nn.Identity)
    assert outcome(lambda: g.nothing)[0] == "raised"
    if base is fastmodule.Module:
        assert fastmodule.slots_of(OwnCall)[0] is False
        assert fastmodule.slots_of(OwnGetattr)[1] is False


def test_patched_base_call_is_used_then_restored(base: type[nn.Module]) -> None:
    """Tools patch nn.Module.__call__ for a while (FX does); the patch must be seen."""
    m = make(base, [])
    orig = nn.Module.__call__
    seen: list[Any] = []

    def patched(self: nn.Module, *a: Any, **k: Any) -> Any:
        seen.append(type(self).__name__)
        return orig(self, *a, **k)

    nn.Module.__call__ = patched  # type: ignore[method-assign]
    try:
        m(torch.ones(3))
    finally:
        nn.Module.__call__ = orig  # type: ignore[method-assign]
    assert seen == ["Leaf"]
    m(torch.ones(3))
    assert seen == ["Leaf"]
    if base is fastmodule.Module:  # (no slot where no native path is on)
        assert fastmodule.slots_of(type(m)) == (NATIVE, NATIVE, NATIVE)


def _jit_traced(base: type[nn.Module]) -> tuple[Any, list[tuple[type, str]]]:
    class Inner(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    class Outer(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(Outer(), torch.ones(2))
    return traced, [(w.category, str(w.message)) for w in caught]


def test_jit_trace_uses_slow_forward(base: type[nn.Module]) -> None:
    traced, warned = _jit_traced(base)
    # The same warnings as stock in the running torch (2.15 deprecates jit.trace with
    # a FutureWarning, 2.11 does not).
    assert warned == _jit_traced(nn.Module)[1]
    # _slow_forward records the submodule scope in the trace.
    assert "inner" in str(traced.inlined_graph) or "Inner" in str(traced.inlined_graph)
    assert torch.equal(traced(torch.ones(2)), torch.full((2,), 3.0))


def test_native_tracing_probe_is_used() -> None:
    assert fastmodule._core.native_tracing_probe() in (True, False)


def test_exception_from_forward_propagates(base: type[nn.Module]) -> None:
    class Bad(base):  # type: ignore[misc, valid-type]
        def forward(self) -> None:
            raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        Bad()()
