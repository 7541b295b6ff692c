"""Registered-attribute reads: lookup order and AttributeError texts vs stock."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import BASES, outcome


def build(base: type[nn.Module]) -> nn.Module:
    class Holder(base):  # type: ignore[misc, valid-type]
        klass = "class-attr"

        @property
        def prop(self) -> str:
            return "property"

        @property
        def broken(self) -> Any:
            raise AttributeError("from property")

        @property
        def failing(self) -> Any:
            raise RuntimeError("not an attribute error")

    m = Holder()
    m.p = nn.Parameter(torch.zeros(1))
    m.register_buffer("b", torch.ones(1))
    m.c = nn.Identity()
    m.plain = 7
    m.register_parameter("none_param", None)
    return m


NAMES = [
    "p",
    "b",
    "c",
    "plain",
    "klass",
    "prop",
    "broken",
    "failing",
    "missing",
    "none_param",
    "forward",
    "training",
    "_parameters",
    "__class__",
    "",
    "a.b",
    "é",
]


@pytest.mark.parametrize("name", NAMES)
def test_reads_match(name: str) -> None:
    results = []
    for b in BASES:
        m = build(b)
        r = outcome(lambda m=m: getattr(m, name))
        if r[0] == "ok":
            v = r[1]
            r = ("ok", type(v).__name__, v if isinstance(v, (int, str, bool)) else None)
        results.append((r, outcome(lambda m=m: hasattr(m, name))))
    assert results[0] == results[1]


def test_lookup_order_parameters_buffers_modules(base: type[nn.Module]) -> None:
    m = base()
    p, t, s = nn.Parameter(torch.zeros(1)), torch.ones(1), nn.Identity()
    m._modules["x"] = s
    assert m.x is s
    m._buffers["x"] = t
    assert m.x is t
    m._parameters["x"] = p
    assert m.x is p
    m.__dict__["x"] = "instance"
    assert m.x == "instance"


def test_error_text_uses_class_name(base: type[nn.Module]) -> None:
    class Some(base):  # type: ignore[misc, valid-type]
        pass

    with pytest.raises(AttributeError, match="^'Some' object has no attribute 'nope'$") as ei:
        Some().nope
    assert ei.value.args == ("'Some' object has no attribute 'nope'",)


def test_missing_registries_before_init() -> None:
    results = []
    for b in BASES:

        class NoInit(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                pass

        m = NoInit()
        results.append([outcome(lambda m=m: m.anything), outcome(lambda m=m: m._parameters)])
    assert results[0] == results[1]


def test_registry_replaced_by_non_dict(base: type[nn.Module]) -> None:
    class Weird(dict):
        def __contains__(self, key: object) -> bool:
            return key == "magic"

        def __getitem__(self, key: Any) -> Any:
            return "from-weird"

    m = base()
    m.__dict__["_parameters"] = Weird()
    assert m.magic == "from-weird"
    assert outcome(lambda: m.other)[0] == "raised"


def test_nested_reads(base: type[nn.Module]) -> None:
    outer = base()
    outer.inner = base()
    outer.inner.w = nn.Parameter(torch.full((1,), 3.0))
    assert outer.inner.w.item() == 3.0


def _miss(make: Any, name: Any) -> tuple[Any, ...]:
    """Everything a caller can see of one missing-attribute read."""
    m = make()
    try:
        getattr(m, name)
    except AttributeError as e:
        seen: tuple[Any, ...] = (type(e), e.args, str(e))
        if hasattr(e, "name"):  # 3.10+: set by CPython after the slot returns
            seen += (e.name, e.obj is m)
        return seen
    raise AssertionError("no AttributeError")


def test_missing_message_follows_a_renamed_class() -> None:
    """A miss's text is made from the class's name at that moment: renaming the
    class after a miss (the names of recent misses are remembered) changes it."""
    results = []
    for b in BASES:

        class Before(b):  # type: ignore[misc, valid-type]
            pass

        first = _miss(Before, "flag")
        again = _miss(Before, "flag")
        Before.__name__ = "After"
        renamed = _miss(Before, "flag")
        Before.__name__ = "Before"
        back = _miss(Before, "flag")
        results.append((first, again, renamed, back))
        assert first == again == back
        assert renamed[2] == "'After' object has no attribute 'flag'"
    assert results[0] == results[1]


def test_missing_message_many_names_and_classes() -> None:
    """Many (class, name) pairs in turn, each read twice, through every way of
    asking (more pairs than the remembered messages: entries are replaced)."""
    results = []
    for b in BASES:
        classes = [type(f"C{i}", (b,), {}) for i in range(7)]
        seen = []
        for rounds in range(2):
            for cls in classes:
                for i in range(9):
                    name = f"missing_{i}"
                    m = cls()
                    seen.append(_miss(lambda cls=cls: cls(), name)[:3])
                    seen.append((hasattr(m, name), getattr(m, name, rounds)))
        results.append(seen)
    assert results[0] == results[1]


def test_missing_message_str_subclass_name_and_metaclass_name() -> None:
    """A name given as a str subclass formats through its own ``__format__``, as
    torch's f-string does; a metaclass's ``__name__`` property is read on every miss."""

    class Loud(str):
        def __format__(self, spec: str) -> str:
            return "LOUD:" + str.__format__(self, spec)

    class Meta(type):
        calls = 0

        @property
        def __name__(cls) -> str:  # type: ignore[override]
            Meta.calls += 1
            return f"Dyn{Meta.calls}"

    results = []
    for b in BASES:
        Meta.calls = 0
        Odd = Meta("Odd", (b,), {})
        seen = [_miss(Odd, "x")[1:3], _miss(Odd, "x")[1:3], _miss(b, Loud("y"))[1:3]]
        seen.append(_miss(b, Loud("y"))[1:3])
        results.append(seen)
    assert results[0] == results[1]


def test_missing_attribute_inside_except_chains_as_stock() -> None:
    """A miss raised while another exception is handled gets it as ``__context__``."""
    results = []
    for b in BASES:
        m = b()
        try:
            try:
                raise KeyError("outer")
            except KeyError:
                m.nope
        except AttributeError as e:
            results.append((str(e), type(e.__context__), e.__context__.args))
        assert getattr(m, "nope", "default") == "default"
    assert results[0] == results[1]
