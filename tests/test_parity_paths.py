"""Dotted paths: ``get_submodule``, ``set_submodule``, ``get_parameter``, ``get_buffer``.

Each scenario runs on a stock tree and on a fastmodule tree; results are compared
as (kind, type name / shape) or as (exception type, message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import BASES, outcome

Base = type[nn.Module]


def build(base: Base) -> nn.Module:
    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("buf", torch.ones(1))
            self.register_buffer("gone", None)
            self.register_parameter("nothing", None)
            self.x = 3

        @property
        def prop(self) -> nn.Module:
            return self.lin

    class Root(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Block()
            self.seq = nn.Sequential(Block(), Block())
            self.md = nn.ModuleDict({"k": Block()})
            self.add_module("odd name", Block())

    return Root()


def describe(value: Any) -> Any:
    if isinstance(value, nn.Module):
        return ("module", type(value).__name__)
    if isinstance(value, torch.Tensor):
        return ("tensor", type(value).__name__, tuple(value.shape))
    return value


def both(op: Callable[[nn.Module], Any]) -> list[Any]:
    out = []
    for base in BASES:
        m = build(base)
        r = outcome(lambda m=m: op(m))
        out.append(("ok", describe(r[1])) if r[0] == "ok" else r)
    return out


TARGETS = [
    "",
    "a",
    "a.lin",
    "a.x",
    "a.zz",
    "a.prop",
    "seq.1.lin",
    "seq.5",
    "md.k.lin",
    "odd name.lin",
    "a..lin",
    ".",
    "a.lin.weight",
    "a.buf",
    "a.gone",
    "a.nothing",
    "a.training",
    "nope.w",
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("method", ["get_submodule", "get_parameter", "get_buffer"])
def test_get_paths(method: str, target: str) -> None:
    stock, fast = both(lambda m: getattr(m, method)(target))
    assert stock == fast


@pytest.mark.parametrize("target", [3, None, b"a", ["a"]])
@pytest.mark.parametrize("method", ["get_submodule", "get_parameter", "get_buffer"])
def test_non_str_targets(method: str, target: Any) -> None:
    stock, fast = both(lambda m: getattr(m, method)(target))
    assert stock == fast


class Path(str):
    """A str subclass whose split is its own."""

    def split(self, *args: Any, **kwargs: Any) -> list[str]:  # type: ignore[override]
        return ["a", "lin"]


def test_str_subclass_target() -> None:
    stock, fast = both(lambda m: m.get_submodule(Path("anything")))
    assert stock == fast


@pytest.mark.parametrize(
    "args",
    [
        ("", "relu"),
        ("a.q", "int"),
        ("a.q", "relu"),
        ("a.q", "relu", True),
        ("a.x", "relu"),
        ("a.lin", "relu", True),
        ("seq.0", "relu"),
        ("seq.9.lin", "relu"),
        ("md.k", "relu", True),
        ("a.prop", "relu"),
    ],
)
def test_set_submodule(args: tuple[Any, ...]) -> None:
    target, kind, *strict = args

    def op(m: nn.Module) -> Any:
        value = nn.ReLU() if kind == "relu" else 3
        r = m.set_submodule(target, value, *strict)
        return r, [(n, type(c).__name__) for n, c in m.named_modules()]

    stock, fast = both(op)
    assert stock == fast


def test_missing_arguments() -> None:
    for call in (
        lambda m: m.get_submodule(),
        lambda m: m.set_submodule("a"),
        lambda m: m.get_parameter(),
        lambda m: m.get_buffer(target="a.buf", extra=1),
    ):
        stock, fast = both(call)
        assert stock == fast


@pytest.mark.parametrize("base", BASES, ids=["stock", "fast"])
def test_overridden_get_submodule_is_dispatched(base: Base) -> None:
    calls: list[str] = []

    class Tracking(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def get_submodule(self, target: str) -> nn.Module:
            calls.append(target)
            return super().get_submodule(target)

    m = Tracking()
    assert m.get_parameter("inner.weight") is m.inner.weight
    assert m.get_buffer.__name__ == "get_buffer"
    m.set_submodule("inner", nn.Linear(2, 2))
    m.set_submodule("inner", nn.Linear(3, 3))
    assert calls == ["inner"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["a", "lin", "seq", "0", "1", "md", "k", "buf", "x", "", "weight", "odd name"]
        ),
        max_size=4,
    ),
    st.sampled_from(["get_submodule", "get_parameter", "get_buffer"]),
)
def test_random_paths(atoms: list[str], method: str) -> None:
    target = ".".join(atoms)
    stock, fast = both(lambda m: getattr(m, method)(target))
    assert stock == fast
