"""Random names, values and registry mutations applied to stock and fast side by side."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import BASES, outcome, state

VALUES: list[Any] = [
    nn.Parameter(torch.zeros(1)),
    nn.Parameter(torch.ones(1)),
    torch.zeros(2),
    nn.Buffer(torch.zeros(1)),
    nn.Buffer(torch.zeros(1), persistent=False),
    nn.Identity(),
    nn.Linear(1, 1),
    None,
    0,
    "text",
    [nn.Identity()],
]

names = st.one_of(
    st.sampled_from(
        [
            "w",
            "b",
            "s",
            "x",
            "training",
            "forward",
            "_parameters",
            "_modules",
            "",
            "a.b",
            "T_0",
            "dump_patches",
        ]
    ),
    st.text(min_size=0, max_size=6),
)
ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "set",
                "del",
                "get",
                "register_parameter",
                "register_buffer",
                "register_buffer_np",
                "add_module",
                "registry_pop",
                "call",
            ]
        ),
        names,
        st.integers(min_value=0, max_value=len(VALUES) - 1),
    ),
    max_size=25,
)


def describe(v: Any) -> Any:
    """One of VALUES by position, anything else by type (bound methods are fresh)."""
    for i, known in enumerate(VALUES):
        if v is known:
            return ("value", i)
    return ("other", type(v).__name__)


def apply(base: type[nn.Module], script: list[tuple[str, str, int]]) -> list[Any]:
    class M(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any) -> Any:
            return x

    m = M()
    log = []
    for op, name, vi in script:
        v = VALUES[vi]
        if op == "set":
            r = outcome(lambda: setattr(m, name, v))
        elif op == "del":
            r = outcome(lambda: delattr(m, name))
        elif op == "get":
            r = outcome(lambda: describe(getattr(m, name)))
        elif op == "register_buffer_np":
            r = outcome(lambda: m.register_buffer(name, v, persistent=False))
        elif op == "registry_pop":
            r = outcome(lambda: [d.pop(name, None) for d in (m._parameters, m._buffers)] and None)
        elif op == "call":
            r = outcome(lambda: m(vi))
        else:
            r = outcome(lambda: getattr(m, op)(name, v))
        try:
            snapshot = state(m)
        except Exception as e:  # noqa: BLE001 - a broken registry is itself an outcome
            snapshot = (type(e), str(e))
        log.append((op, name, r, snapshot))
    return log


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_scripts_match(script: list[tuple[str, str, int]]) -> None:
    stock, fast = (apply(b, script) for b in BASES)
    assert fast == stock
