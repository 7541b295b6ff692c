"""Regressions found by the borrowed-reference audit of ``src/`` (issue 35, item 1).

Each scenario runs on stock ``torch.nn.Module`` and on fastmodule, each side in a
fresh interpreter under CPython's debug allocator (``tests/fresh_sides.py``); both
must exit 0 and print the same.

- Registration's ``"_parameters" in self.__dict__`` (and ``"_buffers"``) looked the
  name up in an instance dict held borrowed: a key with a colliding hash whose
  ``__eq__`` replaced ``__dict__`` freed it mid-lookup (a crash). Stock's expression
  holds ``self.__dict__``.
- torch's ``self.register_parameter(...)``/``self.add_module(...)`` calls read the
  instance dict (and a ``__getattribute__``) before the class's function; the
  native bodies looked at the class only.
- A hook ``OrderedDict`` whose keys are not all ints or strs: ``(*hooks.items(),)``
  hashes and compares each key as often as the ``OrderedDict`` iterator does; the
  native snapshot ran them more or fewer times.
- The scripts in ``tests/audit_scenarios/`` (each says what it shows at its top): a
  class change made in the middle of a native path (a ``__getattribute__`` gained in
  a kernel, a hook or ``fn``; an instance ``_call_impl``; a ``__class__`` swapped by
  a property), reads made in another order than torch's, a name freed during the
  load's key scan, a buffer registry rebound during ``_apply``, the first use of a
  path that pauses the GC handing the GIL to another thread (pyo3's ``intern!``).
"""

from __future__ import annotations

import os

import pytest

from tests.fresh_sides import assert_same, assert_same_file

SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "audit_scenarios")


@pytest.mark.parametrize("name", sorted(n[:-3] for n in os.listdir(SCENARIOS) if n.endswith(".py")))
def test_audit_scenario(name: str) -> None:
    assert_same_file(os.path.join(SCENARIOS, name + ".py"))


# A key hashing like NAME whose __eq__, armed, replaces the module's instance dict by
# a copy without the key (freeing the dict being looked up), then allocates so that
# freed memory is reused.
DICT_REPLACING_KEY = """
import functools

class W:
    armed = False

    def __hash__(self):
        return hash(NAME)

    def __eq__(self, other):
        if W.armed:
            W.armed = False
            d = {k: v for k, v in m.__dict__.items() if k is not self}
            object.__setattr__(m, "__dict__", d)
            junk = [{i: i} for i in range(2000)]
            del junk
        return False

def give_key():
    d = {W(): 1}
    d.update(m.__dict__)
    object.__setattr__(m, "__dict__", d)

m = nn.Linear(2, 2)
if fast:
    fastmodule.accelerate(m)
"""


REGISTRATIONS = {
    "register_parameter-from-C": ("_parameters", 'partial(m.register_parameter, "extra")(P)'),
    "register_buffer-from-C": ("_buffers", 'partial(m.register_buffer, "extra")(T)'),
    "register_parameter": ("_parameters", 'm.register_parameter("extra", P)'),
    "register_buffer": ("_buffers", 'm.register_buffer("extra", T)'),
}


@pytest.mark.parametrize("case", sorted(REGISTRATIONS))
def test_registration_holds_the_instance_dict_across_its_lookup(case: str) -> None:
    registry, call = REGISTRATIONS[case]
    body = (
        f"NAME = {registry!r}\n"
        + DICT_REPLACING_KEY
        + f"""
from functools import partial
P, T = nn.Parameter(torch.ones(1)), torch.ones(1)
give_key()
W.armed = True
{call}
print("after", sorted(m.{registry}), W.armed, sum(isinstance(k, W) for k in m.__dict__))
"""
    )
    assert "'extra'" in assert_same(body)


def test_setattr_parameter_after_a_finalizer_gave_the_dict_a_colliding_key() -> None:
    """``m.x = Parameter`` over a plain attribute: removing the old ``x`` runs its
    ``__del__``, which gives the module a new instance dict with a colliding key;
    the registration then looks ``_parameters`` up in it."""
    body = (
        'NAME = "_parameters"\n'
        + DICT_REPLACING_KEY
        + """
class Old:
    def __del__(self):
        give_key()
        W.armed = True

m.x = Old()
m.x = nn.Parameter(torch.ones(1))
print("after", sorted(m._parameters), W.armed, sum(isinstance(k, W) for k in m.__dict__))
"""
    )
    assert "'x'" in assert_same(body)


@pytest.mark.parametrize("root", ["accelerated", "fastmodule.Module"])
def test_registration_calls_an_instance_attribute_shadowing_the_method(root: str) -> None:
    """torch's ``self.register_parameter(name, value)`` in ``__setattr__`` and
    ``self.add_module(name, module)`` in ``register_module`` call an instance
    attribute of that name (the instance dict comes before the class)."""
    body = f"""
import functools
calls = []
if {root == "fastmodule.Module"} and fast:
    class Net(fastmodule.Module):
        pass
else:
    class Net(nn.Module):
        pass
m = Net()
m.lin = nn.Linear(2, 2)
if fast and {root == "accelerated"}:
    fastmodule.accelerate(m)
m.p0 = nn.Parameter(torch.ones(1))
m.__dict__["register_parameter"] = lambda name, value: calls.append(("rp", name))
m.__dict__["add_module"] = lambda name, value: calls.append(("am", name))
m.p = nn.Parameter(torch.ones(1))
functools.partial(m.register_module, "c")(nn.ReLU())
m.register_module("d", nn.ReLU())
del m.__dict__["register_parameter"], m.__dict__["add_module"]
m.q = nn.Parameter(torch.ones(1))
print(calls, sorted(m._parameters), sorted(m._modules))
"""
    out = assert_same(body)
    assert "('rp', 'p')" in out and "'q'" in out


# Hooks registered in an OrderedDict by hand under keys that are not ints or strs.
HOOK_KEYS = """
from collections import OrderedDict
calls = []

class W:
    def __hash__(self):
        calls.append("hash")
        return 12345

    def __eq__(self, other):
        calls.append("eq")
        return False

def h1(mod, args, out):
    calls.append("h1")

def h2(mod, args, out):
    calls.append("h2")

m = nn.Linear(2, 2)
if fast:
    fastmodule.accelerate(m)
d = OrderedDict()
"""


@pytest.mark.parametrize(
    "keys",
    [
        "d[W()] = h2",
        "d[12345] = h1; d[W()] = h2",
        "d[W()] = h2; d[12345] = h1",
        "d[1] = h1; d[2] = h1; d[W()] = h2",
    ],
    ids=["one-odd-key", "int-then-odd", "odd-then-int", "odd-third"],
)
@pytest.mark.parametrize("registry", ["_forward_hooks", "_forward_pre_hooks"])
def test_hook_registry_keys_hashed_and_compared_as_items_does(keys: str, registry: str) -> None:
    pre = registry == "_forward_pre_hooks"
    body = (
        HOOK_KEYS
        + (
            "h1 = (lambda f: lambda mod, args: f(mod, args, None))(h1)\n"
            "h2 = (lambda f: lambda mod, args: f(mod, args, None))(h2)\n"
            if pre
            else ""
        )
        + f"""
{keys}
m.{registry} = d
x = torch.ones(1, 2)
calls.clear()
m(x)
m(x)
print("calls:", calls)
"""
    )
    assert "h2" in assert_same(body)
