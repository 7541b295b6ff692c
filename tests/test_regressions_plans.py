"""Regressions of recorded plans, their replays, ``state_dict`` and ``load_state_dict``
(issue 17, item 0): code that runs where the native paths assumed none could
(a colliding key's or set element's ``__eq__``, a swapped ``__dict__``), local
metadata, a parameter and a buffer of one name, warning attribution.

Every scenario runs on stock ``torch.nn.Module`` and on ``fastmodule.Module`` and
the two are compared. Scenarios that crashed run in a fresh interpreter (under
CPython's debug allocator, both sides in turn), so a segfault fails the test
instead of ending the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core

from .conftest import outcome
from .fresh_sides import run_python

# --- running a scenario on both sides ------------------------------------------------

_HEADER = """
import gc, sys, torch, torch.nn as nn, fastmodule
from collections import OrderedDict
from fastmodule import _core
"""

_FOOTER = """
SIDES = {sides!r}
for side, Base in (("stock", nn.Module), ("fast", fastmodule.Module)):
    if side not in SIDES:
        continue
    print(side, repr(run(Base)), flush=True)
gc.collect()
print("done", flush=True)
"""


def in_subprocess(body: str, sides: tuple[str, ...] = ("stock", "fast")) -> dict[str, str]:
    """Run ``body`` (defining ``run(Base)``) in a fresh interpreter on each of ``sides``
    (stock, then fast), under the debug allocator: the printed results (a crash fails)."""
    script = _HEADER + textwrap.dedent(body) + _FOOTER.replace("{sides!r}", repr(sides))
    rc, stdout, stderr = run_python(["-c", script])
    assert rc == 0, stdout[-2000:] + stderr[-4000:]
    out = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    assert stdout.rstrip().endswith("done"), stdout[-2000:]
    return {side: out[side] for side in sides}


def assert_same_in_subprocess(body: str) -> None:
    out = in_subprocess(body)
    assert out["fast"] == out["stock"]


def colliding_key(name: str, calls: list[Any], action: Any = None) -> Any:
    """A non-str key that hashes as ``name``: a lookup of ``name`` in a dict or set
    holding it calls its ``__eq__`` (recorded in ``calls``, then ``action()``)."""

    class Key:
        def __hash__(self) -> int:
            return hash(name)

        def __eq__(self, other: object) -> bool:
            calls.append(name)
            if action is not None:
                action()
            return False

    return Key()


def put_first(d: dict[Any, Any], key: Any, value: Any, name: str) -> None:
    """Insert ``key`` into ``d`` ahead of ``name``'s entry (so a lookup of ``name``
    meets it first)."""
    missing = object()
    old = d.pop(name, missing)
    d[key] = value
    if old is not missing:
        d[name] = old


# --- the reproducers -----------------------------------------------------------------


def _assign_metadata(base: type[nn.Module], child_level: bool) -> list[Any]:
    torch.manual_seed(0)

    class Lin(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(2, 3))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.fc = Lin()
            self.register_buffer("b", torch.zeros(2))

    sd = Net().state_dict()
    if child_level:
        sd._metadata["fc"]["assign_to_params_buffers"] = True  # type: ignore[attr-defined]
    else:
        Net().load_state_dict(sd, assign=True)  # torch writes the flag into sd._metadata
    m = Net()
    out = []
    for _ in range(3):  # live (records), then replays
        w, b = m.fc.weight, m.b
        out.append(outcome(lambda: str(m.load_state_dict(sd))))
        out.append(
            (m.fc.weight is w, m.b is b, m.fc.weight.data_ptr() == sd["fc.weight"].data_ptr())
        )
    return out


@pytest.mark.parametrize("child_level", [False, True], ids=["assign_written_by_torch", "child"])
def test_load_honours_assign_in_local_metadata(child_level: bool) -> None:
    """Repro 01: ``assign_to_params_buffers`` in a module's ``_metadata`` entry assigns."""
    stock = _assign_metadata(nn.Module, child_level)
    assert _assign_metadata(fastmodule.Module, child_level) == stock
    assert stock[1][0] is False  # stock assigned: the parameter object was replaced


def _local_metadata_values(base: type[nn.Module]) -> list[Any]:
    class M(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

    m = M()
    out = []
    for local in (None, 3, {"assign_to_params_buffers": False}, {"assign_to_params_buffers": 0}):
        for _ in range(3):
            sd = OrderedDict(w=torch.ones(2))
            sd._metadata = {"": local}  # type: ignore[attr-defined]
            w = m.w
            out.append((outcome(lambda sd=sd: str(m.load_state_dict(sd))), m.w is w))
    return out


def test_load_non_dict_local_metadata_as_torch() -> None:
    """Repro 02: a local metadata entry that is not a dict raises as torch does."""
    assert _local_metadata_values(fastmodule.Module) == _local_metadata_values(nn.Module)


def _same_name(base: type[nn.Module], buffer_first: bool) -> list[Any]:
    class M(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            if buffer_first:
                self._buffers["x"] = torch.zeros(2)
                self._parameters["x"] = nn.Parameter(torch.zeros(2))
            else:
                self.x = nn.Parameter(torch.zeros(2))
                self._buffers["x"] = torch.zeros(2)

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.c = M()

    m = Net()
    out = []
    for sd in (
        {"c.x": torch.ones(2)},
        {"c.x": torch.ones(2)},
        {"c.x": torch.full((2,), 7.0), "c.y": torch.ones(2)},
        {"c.x": torch.full((2,), 5.0)},
    ):
        out.append(outcome(lambda sd=sd: str(m.load_state_dict(sd))))
        out.append((m.c._parameters["x"].tolist(), m.c._buffers["x"].tolist()))
    return out


@pytest.mark.parametrize("buffer_first", [False, True])
def test_load_parameter_and_buffer_of_one_name(buffer_first: bool) -> None:
    """Repro 03: torch's ``local_state`` has one key for the name (the buffer)."""
    assert _same_name(fastmodule.Module, buffer_first) == _same_name(nn.Module, buffer_first)


def test_load_replay_set_element_frees_modules() -> None:
    """Repro 04: a non-persistent set element's ``__eq__`` frees a subtree while the
    load replay checks (a segfault)."""
    assert_same_in_subprocess(
        """
        class Evil:
            armed = False
            root = None
            def __hash__(self): return hash("b")
            def __eq__(self, other):
                if Evil.armed:
                    Evil.armed = False
                    del Evil.root.child
                return False

        def run(Base):
            torch.manual_seed(0)
            class Leaf(Base):
                def __init__(self):
                    super().__init__()
                    self.w = nn.Parameter(torch.randn(4))
                    self.register_buffer("b", torch.randn(4))
                    self.register_buffer("b2", torch.randn(4))
            class Net(Base):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("b", torch.zeros(2))
                    self.child = Leaf()
            m = Net()
            m._non_persistent_buffers_set.add(Evil())
            sd = {k: v.clone() for k, v in m.state_dict().items()}
            out = [str(m.load_state_dict(sd))]
            Evil.root, Evil.armed = m, True
            for _ in range(2):
                try:
                    out.append(str(m.load_state_dict(sd)))
                except Exception as e:
                    out.append((type(e).__name__, str(e)))
            return out, [n for n, _ in m.named_modules()]
        """
    )


def test_state_dict_replay_set_element_changes_tree() -> None:
    """Repro 05: a set element's ``__eq__`` changes a later module during the
    ``state_dict`` replay: the replay must see it, as torch's walk does."""
    assert_same_in_subprocess(
        """
        class Evil:
            armed = False
            root = None
            def __hash__(self): return hash("b")
            def __eq__(self, other):
                if Evil.armed:
                    Evil.armed = False
                    Evil.root.child.register_parameter("extra", nn.Parameter(torch.ones(1)))
                    del Evil.root.child.w
                return False

        def run(Base):
            class Leaf(Base):
                def __init__(self):
                    super().__init__()
                    self.w = nn.Parameter(torch.zeros(2))
            class Net(Base):
                def __init__(self):
                    super().__init__()
                    self.register_buffer("b", torch.zeros(2))
                    self.child = Leaf()
            m = Net()
            m._non_persistent_buffers_set.add(Evil())
            first = list(m.state_dict())
            Evil.root, Evil.armed = m, True
            later = [list(m.state_dict(keep_vars=k)) for k in (False, True, False)]
            return first, later
        """
    )


def test_walk_recorded_while_root_dict_swapped() -> None:
    """Repro 06: a walk recorded while the root's ``__dict__`` was swapped kept the
    other dict's ``_modules`` (stale replay, then a freed dict)."""
    assert_same_in_subprocess(
        """
        def run(Base):
            class Leaf(Base):
                pass
            class Net(Base):
                def __init__(self):
                    super().__init__()
                    self.a = Leaf(); self.b = Leaf()
            m = Net()
            other = Leaf()
            d1 = m.__dict__
            it = m.named_modules()
            next(it)
            d2 = dict(d1); d2["_modules"] = {"x": other}
            m.__dict__ = d2
            first = [next(it)[0]]
            m.__dict__ = d1
            del d2
            spare = [{} for _ in range(8)]
            first += [n for n, _ in it]
            del spare
            return [first] + [[n for n, _ in m.named_modules()] for _ in range(3)]
        """
    )


def test_member_walk_recorded_while_module_dict_swapped() -> None:
    """Repro 06's member-walk form: a module's ``__dict__`` swapped between two of
    ``named_parameters``' yields, restored before the walk ends."""
    assert_same_in_subprocess(
        """
        def run(Base):
            class Leaf(Base):
                def __init__(self):
                    super().__init__(); self.w = nn.Parameter(torch.zeros(1))
            class Mid(Base):
                def __init__(self):
                    super().__init__()
                    self.p = nn.Parameter(torch.zeros(1)); self.l1 = Leaf(); self.l2 = Leaf()
            class Net(Base):
                def __init__(self):
                    super().__init__(); self.mid = Mid()
            m = Net(); mid = m.mid; other = Leaf()
            d1 = mid.__dict__
            it = m.named_parameters()
            first = [next(it)[0]]
            d2 = dict(d1); d2["_modules"] = {"x": other}
            mid.__dict__ = d2
            first.append(next(it)[0])
            mid.__dict__ = d1
            del d2
            spare = [{} for _ in range(8)]
            first += [n for n, _ in it]
            del spare
            return [first] + [[n for n, _ in m.named_parameters()] for _ in range(3)]
        """
    )


def test_train_replay_colliding_key_frees_child() -> None:
    """Repro 14: setting ``training`` runs a colliding key's ``__eq__``, which drops a
    child the replay still pointed at."""
    assert_same_in_subprocess(
        """
        def run(Base):
            class M(Base):
                pass
            root = M(); root.child = M(); root.child.child = M()
            class Key:
                armed = False
                def __hash__(self): return hash("training")
                def __eq__(self, other):
                    if Key.armed:
                        Key.armed = False
                        del root._modules["child"]
                    return False
            t = root.__dict__.pop("training")
            root.__dict__[Key()] = None
            root.__dict__["training"] = t
            root.train()
            Key.armed = True
            root.eval()
            root.train()
            return root.training, list(root._modules)
        """
    )


def test_train_replay_colliding_key_in_child_dict() -> None:
    """Repro 14 one level down: the key is in a child's instance dict, and its
    ``__eq__`` drops the child's sibling."""
    assert_same_in_subprocess(
        """
        def run(Base):
            class M(Base):
                pass
            root = M(); root.a = M(); root.b = M(); root.b.c = M()
            calls = []
            class Key:
                armed = False
                def __hash__(self): return hash("training")
                def __eq__(self, other):
                    calls.append(1)
                    if Key.armed:
                        Key.armed = False
                        del root._modules["b"]
                    return False
            d = root.a.__dict__
            t = d.pop("training"); d[Key()] = None; d["training"] = t
            out = []
            for i in range(4):
                Key.armed = i == 2
                try:
                    root.train(i % 2 == 0)
                except RuntimeError as e:
                    out.append(str(e))
                out.append([m.__dict__["training"] for m in root.modules()])
            return out, len(calls)
        """
    )


@pytest.mark.requires_native("the native walk's replay (_core.walk) holding its root")
def test_private_walk_holds_its_root() -> None:
    """Repro 17: ``_core.walk`` set up to replay keeps its root alive."""
    script = _HEADER + textwrap.dedent(
        """
        class Leaf(fastmodule.Module): pass
        class Net(fastmodule.Module):
            def __init__(self):
                super().__init__(); self.a = Leaf(); self.b = Leaf()
                self.w = torch.nn.Parameter(torch.zeros(1))
        out = []
        walks = (("named_modules", (None, "", True)), ("named_parameters", ("", True, True)))
        for method, args in walks:
            m = Net(); m.tag = "original"
            list(getattr(m, method)())
            it = _core.walk(method, m, *args)
            del m
            junk = [Net() for _ in range(20)]
            for j in junk: j.tag = "junk"
            out.append([n for n, _ in it])
        m = Net(); m.tag = "original"
        list(m.named_modules())
        it = _core.walk("named_modules", m, None, "", True)
        del m
        junk = [Net() for _ in range(20)]
        for j in junk: j.tag = "junk"
        out.append([(n, x.__dict__.get("tag")) for n, x in it])
        print(out)
        gc.collect()
        print("done")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONMALLOC="debug"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[0] == repr(
        [["", "a", "b"], ["w"], [("", "original"), ("a", None), ("b", None)]]
    )


def _meta_warnings(make: Any) -> list[Any]:
    m = make()
    sd = {k: torch.ones_like(v, device="cpu") for k, v in m.state_dict().items()}
    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.load_state_dict(sd)
    out.append(sorted((w.filename, w.lineno, w.category.__name__) for w in caught))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings(
            "ignore", category=UserWarning, module=r"torch\.nn\.modules\.module"
        )
        m.load_state_dict(sd)
    out.append(len(caught))
    return out


def test_load_warning_attributed_to_torch() -> None:
    """Repro 22: torch's ``_load_from_state_dict`` warning (meta parameters) carries
    torch's file, line and module, so module-keyed filters match."""

    def make(base: type[nn.Module]) -> Any:
        class Lin(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.weight = nn.Parameter(torch.empty(2, 2, device="meta"))

        class Net(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.lin = Lin()
                self.bias = nn.Parameter(torch.empty(2, device="meta"))

        return Net

    stock = _meta_warnings(make(nn.Module))
    assert stock[1] == 0 and stock[0]
    assert _meta_warnings(make(fastmodule.Module)) == stock
    stock_class = make(nn.Module)

    def accelerated() -> Any:
        m = stock_class()
        with fastmodule.accelerated(m):
            return _meta_warnings(lambda: m)

    assert accelerated() == stock


# --- audited risks ---------------------------------------------------------------------

WALKS = {
    "named_modules": lambda m: [n for n, _ in m.named_modules()],
    "named_parameters": lambda m: [n for n, _ in m.named_parameters()],
    "parameters": lambda m: len(list(m.parameters())),
    "buffers": lambda m: len(list(m.buffers())),
    "children": lambda m: len(list(m.children())),
    "state_dict": lambda m: list(m.state_dict()),
    "train": lambda m: (m.train(), m.eval(), [x.__dict__.get("training") for x in m.modules()])[-1],
    "float": lambda m: (m.float() is m, [str(p.dtype) for p in m.parameters()]),
    "load": lambda m: str(m.load_state_dict({k: v.clone() for k, v in m.state_dict().items()})),
    "apply": lambda m: m.apply(lambda x: None) is m,
}


def _tree(base: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))
            self.register_buffer("np", torch.randn(2), persistent=False)
            self.inner = nn.Linear(2, 2)

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Leaf()
            self.c = Leaf()

    return Net()


# From CPython 3.12 on, specialised attribute reads find a name at the position they
# remember in an instance dict, skipping a colliding key's `__eq__` depending on how
# warm torch's bytecode is: stock's own count of `__eq__` calls for one scenario then
# varies from run to run (measured on 3.12.1: 14, 17, 11, 12), and so does the point
# where an `__eq__` that changes the tree runs. Counts and such changes are compared
# where they are stock's behaviour (3.11); from 3.12 on these tests check that nothing
# crashes and that results agree apart from the counts.
EQ_CALLS_ARE_STOCK_BEHAVIOUR = sys.version_info < (3, 12)
# CPython 3.12.1's specialised attribute read also turns an exception raised by such
# an `__eq__` into this SystemError, torch or not: the stock side is then no reference.
CPYTHON_EQ_BUG = "returned a result with an exception set"


def comparable(eq_calls: tuple[Any, int]) -> Any:
    """An ``_eq_calls`` result with its count where the count is stock's behaviour."""
    results, count = eq_calls
    return (results, count) if EQ_CALLS_ARE_STOCK_BEHAVIOUR else results


def _eq_calls(base: type[nn.Module], where: str, name: str, walk: str) -> Any:
    m = _tree(base)
    calls: list[Any] = []
    key = colliding_key(name, calls)
    if where == "root":
        put_first(m.__dict__, key, 1, name)
    elif where == "child":
        put_first(m.a.__dict__, key, 1, name)
    elif where == "set":
        m.a._non_persistent_buffers_set.add(key)
    else:
        put_first(m.a.__dict__[where], key, None, name)
    results = [outcome(lambda: WALKS[walk](m)) for _ in range(4)]
    return results, len(calls)


INSTANCE_KEYS = [
    "_modules",
    "_parameters",
    "_buffers",
    "_non_persistent_buffers_set",
    "_version",
    "training",
    "named_modules",
    "children",
    "named_children",
    "train",
    "state_dict",
    "_save_to_state_dict",
    "_load_from_state_dict",
    "_apply",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
]


@pytest.mark.parametrize("where", ["root", "child"])
@pytest.mark.parametrize("walk", sorted(WALKS))
def test_walks_make_torchs_lookups_in_instance_dicts(where: str, walk: str) -> None:
    """A colliding key placed ahead of every name torch looks up in an instance dict:
    each walk, live or replayed, makes torch's lookups (same ``__eq__`` calls) and
    finds the same (a replay skipped them; a remembered registry skipped them)."""
    for name in INSTANCE_KEYS:
        stock = comparable(_eq_calls(nn.Module, where, name, walk))
        assert comparable(_eq_calls(fastmodule.Module, where, name, walk)) == stock, name


@pytest.mark.parametrize("where", ["_parameters", "_buffers", "_modules", "set"])
@pytest.mark.parametrize("walk", sorted(WALKS))
def test_walks_make_torchs_lookups_in_registries(where: str, walk: str) -> None:
    """The same in the registries and the non-persistent set (``"training" in
    self._parameters``, ``name not in self._non_persistent_buffers_set``, ...)."""
    for name in ["w", "b", "np", "inner", "training", "_extra_state"]:
        stock = comparable(_eq_calls(nn.Module, where, name, walk))
        assert comparable(_eq_calls(fastmodule.Module, where, name, walk)) == stock, name


_MUTATING = """
WHERE, NAMES, ACTIONS = {where!r}, {names!r}, {actions!r}
OPS = {{
    "named_modules": lambda m: [n for n, _ in m.named_modules()],
    "named_parameters": lambda m: [n for n, _ in m.named_parameters()],
    "buffers": lambda m: len(list(m.buffers())),
    "children": lambda m: len(list(m.children())),
    "state_dict": lambda m: list(m.state_dict()),
    "train": lambda m: (m.train(), m.eval(), [x.__dict__.get("training") for x in m.modules()])[-1],
    "float": lambda m: (m.float() is m, [str(p.dtype) for p in m.parameters()]),
    "load": lambda m: str(m.load_state_dict({{k: v.clone() for k, v in m.state_dict().items()}})),
    "apply": lambda m: m.apply(lambda x: None) is m,
}}

def once(Base, name, op, ACTION):
    torch.manual_seed(0)
    class Leaf(Base):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))
            self.register_buffer("np", torch.randn(2), persistent=False)
            self.inner = nn.Linear(2, 2)
    class Net(Base):
        def __init__(self):
            super().__init__()
            self.a = Leaf(); self.c = Leaf()
    m = Net()
    A, C, MODS = m.a, m.c, m._modules
    state = {{"armed": False, "calls": 0}}
    def act():
        if ACTION == "del_child": MODS.pop("a", None)
        elif ACTION == "del_grandchild":
            A.__dict__["_modules"].pop("inner", None); C.__dict__["_modules"].pop("inner", None)
        elif ACTION == "new_parameters":
            A.__dict__["_parameters"] = {{"z": nn.Parameter(torch.ones(3))}}
        elif ACTION == "new_modules": A.__dict__["_modules"] = {{}}
        elif ACTION == "del_parameter":
            A.__dict__["_parameters"].pop("w", None); C.__dict__["_parameters"].pop("w", None)
        elif ACTION == "swap_dict": A.__dict__ = dict(A.__dict__)
    class Key:
        def __hash__(self): return hash(name)
        def __eq__(self, other):
            state["calls"] += 1
            if state["armed"]:
                state["armed"] = False
                act()
            return False
    k = Key()
    def first(d, value):
        missing = object()
        old = d.pop(name, missing); d[k] = value
        if old is not missing: d[name] = old
    if WHERE == "root": first(m.__dict__, 1)
    elif WHERE == "child": first(A.__dict__, 1)
    elif WHERE == "set": A._non_persistent_buffers_set.add(k)
    else: first(A.__dict__[WHERE], None)
    out = []
    for i in range(4):
        state["armed"] = i >= 1
        try: out.append(op(m))
        except Exception as e: out.append((type(e).__name__, str(e)))
    return out, state["calls"]

# train() on a child whose "training" lookup swaps the child's __dict__: CPython's own
# object.__setattr__ stores into the dict it no longer holds and crashes, stock
# included (module.py's `super().__setattr__`), so that one case is not run.
CPYTHON_CRASHES = {{("child", "train", "training", "swap_dict")}}

def run(Base):
    return [once(Base, n, op, a) for a in ACTIONS for n in NAMES for k, op in OPS.items()
            if (WHERE, k, n, a) not in CPYTHON_CRASHES]
"""

_MUTATING_NAMES = {
    "root": [
        "_modules",
        "_parameters",
        "_buffers",
        "training",
        "named_modules",
        "train",
        "children",
        "state_dict",
        "_load_from_state_dict",
        "_apply",
    ],
    "child": [
        "_modules",
        "_parameters",
        "_buffers",
        "training",
        "named_modules",
        "train",
        "children",
        "named_children",
        "_save_to_state_dict",
        "_load_from_state_dict",
        "_non_persistent_buffers_set",
    ],
    "_parameters": ["w", "inner", "_extra_state"],
    "_buffers": ["b", "np", "training"],
    "_modules": ["inner", "w"],
    "set": ["b", "np"],
}


_ACTIONS = [
    "del_child",
    "del_grandchild",
    "new_parameters",
    "new_modules",
    "del_parameter",
    "swap_dict",
]


@pytest.mark.parametrize("where", sorted(_MUTATING_NAMES))
def test_walks_with_lookups_that_change_the_tree(where: str) -> None:
    """A colliding key whose ``__eq__`` changes the tree (drops a child, replaces a
    registry or the instance dict): every walk, its recording and its replay, runs
    it where torch does and sees its change, without a crash (but for the one case
    where CPython itself crashes on stock, see ``CPYTHON_CRASHES``)."""
    body = _MUTATING.format(where=where, names=_MUTATING_NAMES[where], actions=_ACTIONS)
    if EQ_CALLS_ARE_STOCK_BEHAVIOUR:
        assert_same_in_subprocess(body)
    else:
        # No reference to compare with, and CPython's own specialised reads can crash
        # on stock here (3.13: a `__dict__` swapped during `self._modules`' lookup in
        # torch's named_modules): fastmodule must not crash.
        in_subprocess(body, sides=("fast",))


def _raising_lookup(base: type[nn.Module], name: str, walk: str) -> Any:
    m = _tree(base)

    class Boom(Exception):
        pass

    class Key:
        armed = False

        def __hash__(self) -> int:
            return hash(name)

        def __eq__(self, other: object) -> bool:
            if Key.armed:
                raise Boom("from __eq__")
            return False

    put_first(m.a.__dict__, Key(), 1, name)
    out = [outcome(lambda: WALKS[walk](m))]
    Key.armed = True
    out += [outcome(lambda: WALKS[walk](m)) for _ in range(2)]
    Key.armed = False
    out.append(outcome(lambda: WALKS[walk](m)))
    return [(r[0], getattr(r[1], "__name__", r[1]), *r[2:]) for r in out]


@pytest.mark.parametrize("walk", sorted(WALKS))
def test_lookup_raising_in_instance_dict_raises_as_torch(walk: str) -> None:
    """A colliding key whose ``__eq__`` raises: the walks raise that error where torch
    does (a native lookup read the failure as "absent", an exception pending)."""
    for name in [
        "named_modules",
        "children",
        "train",
        "state_dict",
        "_load_from_state_dict",
        "_apply",
        "_modules",
        "_parameters",
    ]:
        stock = _raising_lookup(nn.Module, name, walk)
        if CPYTHON_EQ_BUG in repr(stock):
            continue
        fast = _raising_lookup(fastmodule.Module, name, walk)
        if EQ_CALLS_ARE_STOCK_BEHAVIOUR:
            assert fast == stock, name
            continue
        # From 3.12 on, whether a read of torch's code meets the key at all depends on
        # how CPython specialised that read in earlier runs (a cached index skips the
        # probe): an armed walk may raise Boom or not on stock alike. Unarmed walks
        # agree exactly; an armed one agrees or raises Boom, as the generic read does.
        boom = ("raised", "Boom", "from __eq__")
        assert fast[0] == stock[0] and fast[3] == stock[3], name
        for f, s in zip(fast[1:3], stock[1:3], strict=True):
            assert f == s or f == boom, name


def _load_dicts(base: type[nn.Module], case: str) -> Any:
    torch.manual_seed(0)

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))
            self.register_buffer("b", torch.randn(2))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Leaf()
            self.register_buffer("r", torch.zeros(1))

    m = Net()
    calls: list[Any] = []
    saved = m.state_dict()
    out = []
    for i in range(4):  # live, recorded, replayed...
        sd: Any = OrderedDict((k, v.clone()) for k, v in saved.items())
        sd._metadata = OrderedDict((k, dict(v)) for k, v in saved._metadata.items())
        if case == "str_subclass_key":

            class K(str):
                def __hash__(self) -> int:
                    return hash("r")

                def __eq__(self, other: object) -> bool:
                    calls.append(1)
                    return str.__eq__(self, other)

            sd[K("zz")] = torch.ones(1)
        elif case == "metadata_colliding_key":
            sd._metadata[colliding_key("a", calls)] = {}
        elif case == "local_metadata_colliding_key":
            sd._metadata["a"][colliding_key("assign_to_params_buffers", calls)] = 1
        elif case == "metadata_get_attribute":
            md = sd._metadata

            def get(k: Any, d: Any = None, md: Any = md) -> Any:
                calls.append(k)
                return OrderedDict.get(md, k, d)

            md.get = get
        elif case == "local_metadata_ordered_with_get":
            local = OrderedDict(sd._metadata["a"])
            sd._metadata["a"] = local

            def get_local(k: Any, d: Any = None, local: Any = local) -> Any:
                calls.append(k)
                return OrderedDict.get(local, k, d)

            local.get = get_local
        elif case == "state_dict_keys_attribute":

            def keys(sd: Any = sd) -> Any:
                calls.append("keys")
                return OrderedDict.keys(sd)

            sd.keys = keys
        elif case == "metadata_plain_dict":
            sd._metadata = dict(sd._metadata)
        elif case == "local_metadata_ordered":
            sd._metadata["a"] = OrderedDict(sd._metadata["a"])
        elif case == "set_element_colliding" and i == 0:
            m.a._non_persistent_buffers_set.add(colliding_key("b", calls))
        elif case == "meta_parameter_and_set_element" and i == 0:
            m.a._parameters["w"] = nn.Parameter(torch.empty(2, device="meta"))
            m.a._non_persistent_buffers_set.add(colliding_key("b", calls))
        w = m.a.w
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = outcome(lambda sd=sd: str(m.load_state_dict(sd, strict=False)))
        out.append((r, m.a.w is w))
    return out, len(calls), [str(c) for c in calls]


@pytest.mark.parametrize(
    "case",
    [
        "str_subclass_key",
        "metadata_colliding_key",
        "local_metadata_colliding_key",
        "metadata_get_attribute",
        "local_metadata_ordered_with_get",
        "state_dict_keys_attribute",
        "metadata_plain_dict",
        "local_metadata_ordered",
        "set_element_colliding",
        "meta_parameter_and_set_element",
    ],
)
def test_load_reads_dicts_as_torch(case: str) -> None:
    """``load_state_dict``, live and replayed: what torch's code calls on the given
    dict, its ``_metadata`` and the local metadata (``keys``/``get``, an instance's
    own, a colliding key's ``__eq__``) is called as often as in torch."""
    assert _load_dicts(fastmodule.Module, case) == _load_dicts(nn.Module, case)


def _apply_buffer_store(base: type[nn.Module]) -> Any:
    class M(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))

    m = M()
    calls: list[Any] = []
    m._buffers[colliding_key("b", calls)] = None
    m._buffers["b"] = torch.zeros(2)
    out = [(m.float() is m, m.double() is m, m.double() is m, m.cpu() is m) for _ in range(3)]
    return out, len(calls)


def test_apply_stores_buffers_as_torch() -> None:
    """``_apply`` with a conversion that leaves a buffer as it is: torch still stores
    it (``self._buffers[key] = buf``), a lookup that runs a colliding key's ``__eq__``."""
    assert _apply_buffer_store(fastmodule.Module) == _apply_buffer_store(nn.Module)


@pytest.mark.requires_native("counts the native walks' replays (_core.*_plan_stats)")
def test_replays_still_replay() -> None:
    """The quietness checks refuse only what they must: plain trees still replay."""
    # A refusal is kept per root address for a few attempts: an earlier test's
    # refused root at the address this tree's root gets must not count here.
    _core.clear_plans()
    m = _tree(fastmodule.Module)
    sd = m.state_dict()
    stats = (
        _core.plan_stats,
        _core.eager_plan_stats,
        _core.state_dict_plan_stats,
        _core.load_plan_stats,
    )
    before = [s()[1] for s in stats]
    for _ in range(3):
        list(m.named_parameters())
    for _ in range(3):
        m.train()
        m.eval()
    for _ in range(3):
        m.state_dict()
    for _ in range(3):
        m.load_state_dict(sd)
    after = [s()[1] for s in stats]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def _metadata_edits(base: type[nn.Module]) -> Any:
    torch.manual_seed(0)

    class Leaf(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(2))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.a = Leaf()
            self.b = Leaf()

    m = Net()
    sd: Any = m.state_dict()
    md = sd._metadata
    calls: list[Any] = []

    def get(k: Any, d: Any = None) -> Any:
        calls.append(k)
        return OrderedDict.get(local, k, d)

    local = OrderedDict(md["b"])
    edits = [
        lambda: None,
        lambda: None,
        lambda: md["a"].__setitem__("assign_to_params_buffers", True),
        lambda: md["a"].pop("assign_to_params_buffers"),
        lambda: None,
        lambda: md.__setitem__("b", {"assign_to_params_buffers": True}),
        lambda: md.__setitem__("b", {"version": 1}),
        lambda: None,
        lambda: md.__setitem__("b", local),
        lambda: None,
        lambda: setattr(local, "get", get),
        lambda: None,
        lambda: md.__setitem__(colliding_key("a", calls), {}),
        lambda: None,
    ]
    out = []
    for edit in edits:
        edit()
        w = (m.a.w, m.b.w)
        r = outcome(lambda: str(m.load_state_dict(sd)))
        out.append((r, m.a.w is w[0], m.b.w is w[1]))
    return out, len(calls)


def test_load_replay_sees_metadata_edited_between_loads() -> None:
    """The same dict loaded again after its ``_metadata`` (or a module's entry) was
    edited: each load reads the metadata as it is then (the replay remembers only
    what an unchanged dict version guarantees)."""
    assert _metadata_edits(fastmodule.Module) == _metadata_edits(nn.Module)
