"""Registration through __setattr__/__delattr__ and register_*: fastmodule vs stock."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.conftest import BASES, outcome, state


def new(base: type[nn.Module]) -> nn.Module:
    class M(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any) -> Any:
            return x

    return M()


# Values are created once so stock and fast see the very same objects.
P = nn.Parameter(torch.zeros(2))
P2 = nn.Parameter(torch.ones(2))
T = torch.zeros(3)
SUB_STOCK = nn.Linear(2, 2)
NON_LEAF = nn.Parameter(torch.zeros(2)) * 2


def run_script(base: type[nn.Module], script: list[tuple[Any, ...]]) -> list[Any]:
    """Apply (op, *args) steps to a fresh module; record each outcome and the state."""
    m = new(base)
    log = []
    for op, *args in script:
        if op == "set":
            r = outcome(lambda: setattr(m, args[0], args[1]))
        elif op == "del":
            r = outcome(lambda: delattr(m, args[0]))
        elif op == "get":
            r = outcome(lambda: id(getattr(m, args[0])))
        else:
            r = outcome(lambda: getattr(m, op)(*args))
        log.append((op, args[0] if args else None, r, state(m)))
    return log


SCRIPTS = {
    "param_then_plain": [("set", "w", P), ("set", "w", 3), ("get", "w")],
    "param_then_none": [("set", "w", P), ("set", "w", None), ("get", "w")],
    "param_reassign": [("set", "w", P), ("set", "w", P2), ("get", "w")],
    "param_then_tensor": [("set", "w", P), ("set", "w", T), ("get", "w")],
    "plain_then_param": [("set", "w", 1), ("set", "w", P), ("get", "w"), ("del", "w")],
    "module_then_plain": [("set", "s", SUB_STOCK), ("set", "s", 5)],
    "module_then_none": [("set", "s", SUB_STOCK), ("set", "s", None), ("get", "s")],
    "module_over_param": [("set", "w", P), ("set", "w", SUB_STOCK)],
    "param_over_module": [("set", "s", SUB_STOCK), ("set", "s", P), ("get", "s")],
    "buffer_rules": [
        ("register_buffer", "b", T),
        ("set", "b", torch.ones(3)),
        ("set", "b", None),
        ("set", "b", 5),
        ("set", "b", T),
        ("del", "b"),
        ("get", "b"),
    ],
    "non_persistent": [
        ("register_buffer", "b", T, False),
        ("set", "b", torch.ones(3)),
        ("register_buffer", "b", T, True),
        ("register_buffer", "c", None, False),
    ],
    "buffer_object": [("set", "b", nn.Buffer(torch.zeros(1), persistent=False)), ("get", "b")],
    "plain_then_buffer": [("set", "b", 1), ("set", "b", nn.Buffer(torch.zeros(1)))],
    "list_of_modules_unregistered": [("set", "l", [SUB_STOCK]), ("set", "d", {"a": SUB_STOCK})],
    "delete_missing": [("del", "nope")],
    "delete_each": [
        ("set", "w", P),
        ("set", "s", SUB_STOCK),
        ("register_buffer", "b", T, False),
        ("set", "x", 1),
        ("del", "w"),
        ("del", "s"),
        ("del", "b"),
        ("del", "x"),
        ("del", "x"),
    ],
    "register_parameter_errors": [
        ("register_parameter", "a.b", P),
        ("register_parameter", "", P),
        ("register_parameter", 1, P),
        ("register_parameter", "training", P),
        ("register_parameter", "forward", P),
        ("register_parameter", "w", T),
        ("register_parameter", "w", 3),
        ("register_parameter", "w", NON_LEAF),
        ("register_parameter", "w", None),
        ("register_parameter", "w", P),
    ],
    "register_buffer_errors": [
        ("register_buffer", "a.b", T),
        ("register_buffer", "", T),
        ("register_buffer", 1, T),
        ("register_buffer", "training", T),
        ("register_buffer", "b", 3),
        ("register_buffer", "b", [1]),
        ("register_buffer", "b", None),
    ],
    "add_module_errors": [
        ("add_module", "a.b", SUB_STOCK),
        ("add_module", "", SUB_STOCK),
        ("add_module", 1, SUB_STOCK),
        ("add_module", "training", SUB_STOCK),
        ("add_module", "x", 3),
        ("add_module", "x", None),
        ("register_module", "y", SUB_STOCK),
        ("register_module", "a.b", SUB_STOCK),
    ],
    "set_param_on_param_slot_errors": [("set", "w", P), ("set", "w", 3), ("set", "w", SUB_STOCK)],
    "set_module_slot_errors": [("set", "s", SUB_STOCK), ("set", "s", T), ("set", "s", 3)],
    "shadow_plain_then_register": [("set", "x", 1), ("register_parameter", "x", P)],
    "class_attr_name": [("register_parameter", "dump_patches", P), ("set", "call_super_init", P)],
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_registration_scripts(name: str) -> None:
    script = SCRIPTS[name]
    stock, fast = (run_script(b, script) for b in BASES)
    assert fast == stock


def test_assignment_before_init(base: type[nn.Module]) -> None:
    class Early(base):  # type: ignore[misc, valid-type]
        def __init__(self, what: Any) -> None:
            self.early = what
            super().__init__()

    for what in (P, nn.Linear(1, 1), 3, T):
        got = outcome(lambda: Early(what))
        expected = outcome(lambda: _stock_early(what))
        assert got[0] == expected[0]
        if got[0] == "raised":
            assert got[1:] == expected[1:]


def _stock_early(what: Any) -> Any:
    class Early(nn.Module):
        def __init__(self) -> None:
            self.early = what
            super().__init__()

    return Early()


@pytest.mark.parametrize("bad", [1, None, b"x", ("t",)])
def test_non_string_names(bad: Any) -> None:
    results = []
    for b in BASES:
        m = new(b)
        results.append(
            [
                outcome(lambda: setattr(m, bad, 1)),  # noqa: B010
                outcome(lambda: getattr(m, bad)),
                outcome(lambda: delattr(m, bad)),
                outcome(lambda: m.register_parameter(bad, P)),
                outcome(lambda: m.register_buffer(bad, T)),
                outcome(lambda: m.add_module(bad, SUB_STOCK)),
            ]
        )
    assert results[0] == results[1]


def test_registration_hooks_same_as_stock() -> None:
    from torch.nn.modules import module as torch_module

    logs = []
    for b in BASES:
        calls: list[tuple[str, str]] = []
        handles = [
            torch_module.register_module_parameter_registration_hook(
                lambda m, n, v, calls=calls: calls.append(("p", n))
            ),
            torch_module.register_module_module_registration_hook(
                lambda m, n, v, calls=calls: calls.append(("m", n))
            ),
            torch_module.register_module_buffer_registration_hook(
                lambda m, n, v, calls=calls: calls.append(("b", n))
            ),
        ]
        try:
            m = new(b)
            m.w = P
            m.s = nn.Identity()
            m.register_buffer("b", T)
            m.s = None
            m.register_parameter("q", None)
            m.add_module("t", nn.Identity())
        finally:
            for h in handles:
                h.remove()
        logs.append(calls)
    assert logs[0] == logs[1]
    assert logs[0]


def test_patched_register_parameter_is_honoured(base: type[nn.Module]) -> None:
    """Libraries patch nn.Module.register_parameter (e.g. meta-device init)."""
    seen: list[str] = []
    orig = nn.Module.register_parameter

    def patched(self: nn.Module, name: str, param: Any) -> None:
        seen.append(name)
        orig(self, name, param)

    nn.Module.register_parameter = patched  # type: ignore[method-assign]
    try:
        m = new(base)
        m.w = nn.Parameter(torch.zeros(1))
        lin = nn.Linear(1, 1)
    finally:
        nn.Module.register_parameter = orig  # type: ignore[method-assign]
    assert seen[0] == "w"
    assert "weight" in seen
    assert isinstance(lin.weight, nn.Parameter)


def test_subclass_overriding_setattr_keeps_its_own(base: type[nn.Module]) -> None:
    log: list[str] = []

    class Own(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name: str, value: Any) -> None:
            log.append(name)
            super().__setattr__(name, value)

        def __delattr__(self, name: str) -> None:
            log.append("del " + name)
            super().__delattr__(name)

    m = Own()
    m.w = P
    del m.w
    assert log[-2:] == ["w", "del w"]
    assert "w" not in m._parameters


def test_register_buffer_without_persistent_argument(base: type[nn.Module]) -> None:
    class Old(base):  # type: ignore[misc, valid-type]
        def register_buffer(self, name: str, tensor: Any) -> None:  # type: ignore[override]
            super().register_buffer(name, tensor)

    m = Old()
    m.register_buffer("b", T)
    m.b = torch.ones(3)
    assert torch.equal(m.b, torch.ones(3))


def test_registry_mutated_directly(base: type[nn.Module]) -> None:
    m = new(base)
    m._parameters["w"] = P
    assert m.w is P
    m._parameters.pop("w")
    m._buffers["b"] = T
    assert m.b is T
    m._modules["s"] = SUB_STOCK
    assert m.s is SUB_STOCK
    m.__dict__["_modules"] = {}
    assert outcome(lambda: m.s)[0] == "raised"
    m._parameters = {"z": P}
    assert m.z is P
