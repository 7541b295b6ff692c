"""What the caches remember about a module's dicts is dropped by every change
(``fastmodule._core.cache_validity``: dict version tags on 3.11, a dict watcher
from 3.12 on), and when no dict-watcher slot is free the caches are off and
behaviour is stock."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import fastmodule
from fastmodule import _core


def test_cache_validity_is_on_here() -> None:
    """This interpreter has a way to know dicts unchanged (the suite's own setup
    takes no dict-watcher slot)."""
    how = _core.cache_validity()
    if sys.version_info < (3, 12):
        assert how == "dict version tags (CPython 3.11)"
    else:
        assert how.startswith("dict watcher "), how


def test_every_instance_dict_store_changes_its_version() -> None:
    """White box: plain attribute stores, adds and deletes on a module the caches
    have seen change its instance dict's version (CPython 3.13.0 does not report
    stores into inline values shared with a materialised ``__dict__``; fastmodule
    gives such dicts their own values first)."""

    class Net(fastmodule.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    m = Net()
    m(torch.ones(2))
    d = m.__dict__
    seen = [_core.dict_version(d)]
    m.scale = 1
    seen.append(_core.dict_version(d))
    m.scale = 2
    seen.append(_core.dict_version(d))
    object.__setattr__(m, "scale", 3)
    seen.append(_core.dict_version(d))
    del m.scale
    seen.append(_core.dict_version(d))
    assert len(set(seen)) == len(seen), seen
    assert m.__dict__ is d


def _rebinding_scenario(base: type[torch.nn.Module]) -> list[Any]:
    """Calls cached, then instance attributes stored the ways user code stores
    them: each call must see the change."""

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    torch.manual_seed(0)
    m = Net()
    x = torch.ones(1, 2)
    out = [m(x).tolist(), m(x).tolist()]
    m.forward = lambda x: x * 2  # instance attribute shadows the class forward
    out.append(m(x).tolist())
    object.__setattr__(m, "forward", lambda x: x * 3)
    out.append(m(x).tolist())
    del m.forward
    out.append(m(x).tolist())
    m.training = False
    out.append(m(x).tolist())
    m.lin.weight = torch.nn.Parameter(torch.zeros(2, 2))
    out.append(m(x).tolist())
    m.lin.__dict__["bias"] = None  # shadows the registered bias
    out.append(m(x).tolist())
    return out


def test_calls_see_every_rebinding() -> None:
    """Stock against fast (and accelerated stock): the call cache never serves a
    forward or a weight that an attribute store replaced."""
    stock = _rebinding_scenario(torch.nn.Module)
    assert _rebinding_scenario(fastmodule.Module) == stock


_FULL_SLOTS = textwrap.dedent(
    """
    import ctypes, sys
    import torch  # takes a slot of its own (torch >= 2.12 on 3.13) before they are filled
    CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_void_p)
    keep = CB(lambda *a: 0)
    add = ctypes.pythonapi.PyDict_AddWatcher
    add.argtypes = [CB]
    add.restype = ctypes.c_int
    taken = []
    while True:
        try:
            taken.append(add(keep))
        except RuntimeError:
            break
    import fastmodule
    from fastmodule import _core
    print("TAKEN", len(taken))
    print("VALIDITY", _core.cache_validity())
    from tests.cache_validity_scenario import scenario
    print("SAME", scenario(torch.nn.Module) == scenario(fastmodule.Module))
    print("PLANS", _core.eager_plan_stats(), _core.plan_stats())
    """
)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="dict watchers exist from 3.12 on")
def test_no_free_watcher_slot_means_caches_off_and_stock_behaviour() -> None:
    """Every dict-watcher slot left after torch's import taken before fastmodule's
    import: fastmodule says the caches are off, records no plan, and behaves as
    stock (fresh interpreter)."""
    r = subprocess.run(
        [sys.executable, "-c", _FULL_SLOTS],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(__import__("pathlib").Path(__file__).parent.parent),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert int(lines["TAKEN"]) >= 1
    assert lines["VALIDITY"].startswith("off: all 8 dict-watcher slots were taken"), lines
    assert lines["SAME"] == "True"
    assert lines["PLANS"] == "(0, 0) (0, 0)", lines
