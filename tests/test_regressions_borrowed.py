"""Regressions: borrowed pointers held across code that can run Python (issue 35).

Native paths read objects without holding them wherever no Python code can run
before they are used. Three kinds of code did run there:

- a lookup in a class dict with a key that is not a ``str`` (reproducer 33: the
  mixin check read a class's MRO borrowed across such a lookup; the key's
  ``__eq__`` reassigned ``__bases__`` and freed it). The same lookups backed
  every ``type_lookup`` of the native paths: of the module's class (the call's
  checks), of an assigned value's class (``m.x = v``);
- Python code the call path runs for itself: a ``forward`` whose code object is
  new is classified by ``fastmodule._verified.frame_counting``, whose
  allocations may run the cyclic GC's finalizers, while the class function,
  the instance dict and its hook registries were held borrowed;
- a lookup in an instance dict that a forward pre-hook made non-quiet, made by
  a native layer step before it handed the call to torch's ``forward`` (which
  makes it again: a colliding key's ``__eq__`` ran twice).

Each scenario is a script run in a fresh interpreter per side, under CPython's
debug allocator (freed memory is poisoned, so a use after free crashes), on
stock ``torch.nn.Module`` and on fastmodule; both must exit 0 and print the
same. Where the code in the middle is a finalizer that only fastmodule's own
classification can trigger, the stock side runs it just before the call (a
finalizer may run at any allocation: that is one order stock can show).
"""

from __future__ import annotations

import pytest

from tests.fresh_sides import assert_same, run_side

# --- lookups in class dicts with a key that is not a str -------------------------

# Reproducer 33, counting the key's `__eq__` calls: stock's `super().__setattr__`
# looks `__setattr__` up after nn.Module on every assignment, so a class after
# nn.Module whose dict could run code keeps torch's code (and its lookups).
MIXIN_KEY_REASSIGNS_BASES = """
calls = []

class W:
    armed = False

    def __hash__(self):
        return hash("__setattr__")

    def __eq__(self, other):
        calls.append(1)
        if W.armed:
            W.armed = False
            junk = [tuple([i, i, i, i]) for i in range(4000)]
            del junk
            M.__bases__ = (nn.Module,)
            junk2 = [object() for _ in range(2000)]  # noqa: F841
        return False

Mixin = type("Mixin", (), {W(): 1})

class M(nn.Module, Mixin):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

m = M()
if fast:
    fastmodule.accelerate(m)
m.a = 1
m.b = 2
print("before", len(calls))
M.zz = 1
W.armed = True
m.c = 3
m.d = 4
print("after", len(calls), [c.__name__ for c in type(m).__mro__], m.c, m.d)
"""


def test_mixin_key_reassigning_bases_during_the_mixin_check() -> None:
    out = assert_same(MIXIN_KEY_REASSIGNS_BASES)
    assert "['M', 'Module', 'object'] 3 4" in out


# `m.x = V()` where V's dict has a key hashing like "__class__": looking
# `__class__` up on V (the native `__setattr__`'s classification; stock's
# isinstance checks) runs its `__eq__`, which replaces the module's instance
# dict. The old one is freed, and the next dict made (CPython reuses freed
# dicts) has a `_parameters` holding "x": code still reading the old dict
# finds a parameter slot named "x" that stock never sees.
VALUE_CLASS_KEY_REPLACES_DICT = """
calls = []
keep = []

class K:
    armed = True

    def __hash__(self):
        return hash("__class__")

    def __eq__(self, other):
        calls.append(1)
        if K.armed:
            K.armed = False
            new = dict(m.__dict__)
            m.__dict__ = new
            d = {}
            d["_parameters"] = {"x": None}
            keep.append(d)
        return False

V = type("V", (), {K(): 1})

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1))

m = M()
if fast:
    fastmodule.accelerate(m)
try:
    m.x = V()
    print("ok", len(calls), sorted(m.__dict__), sorted(m._parameters), type(m.x).__name__)
except Exception as e:
    print("raised", type(e).__name__, e, len(calls))
"""


def test_value_class_key_replacing_the_instance_dict_during_setattr() -> None:
    assert_same(VALUE_CLASS_KEY_REPLACES_DICT)


# The module's own class has a key hashing like "_compiled_call_impl" (read by
# the call's checks, and by torch's `_wrapped_call_impl`); its `__eq__` replaces
# the instance dict by a copy. The old dict is freed and the next dict made
# (CPython reuses freed dicts) looks like a module's dict without forward
# hooks: code still reading the old dict decides the call has none.
MODULE_CLASS_KEY_DURING_CALL = """
from collections import OrderedDict
calls = []
log = []
keep = []

class K:
    armed = False

    def __hash__(self):
        return hash("_compiled_call_impl")

    def __eq__(self, other):
        calls.append(1)
        if K.armed:
            K.armed = False
            new = dict(m.__dict__)
            ghost = dict(new)
            ghost["_forward_hooks"] = OrderedDict()
            m.__dict__ = new
            d = {}
            d.update(ghost)
            keep.append(d)
        return False

def forward(self, x):
    return x + 1

Base = fastmodule.Module if fast else nn.Module
M = type("M", (Base,), {K(): 1, "forward": forward})
m = M()
m.register_forward_hook(lambda mod, args, out: log.append("hook"))
results = [m(torch.ones(1)).tolist()]
K.armed = True
M.zz = 1  # a new class version: the next lookups walk the MRO again
for _ in range(3):
    results.append(m(torch.ones(1)).tolist())
print(results, log, len(calls) > 0, sorted(k for k in m.__dict__ if isinstance(k, str)))
"""


def test_module_class_key_replacing_the_instance_dict_during_a_call() -> None:
    assert_same(MODULE_CLASS_KEY_DURING_CALL)


@pytest.mark.requires_native("asks the core whether the class is handed to torch")
def test_class_with_a_non_str_key_is_handed_to_torch() -> None:
    # What `fastmodule check` reports for such a class (and what makes it
    # stock): the call's own decision.
    out = run_side(
        """
        class K:
            def __hash__(self):
                return 1
            def __eq__(self, other):
                return False
        M = type("M", (fastmodule.Module,), {K(): 1, "forward": lambda self, x: x})
        print(fastmodule._core.call_handover(M()))
        """,
        "fast",
    )
    assert "not a str in its __dict__" in out


# --- Python code the call path runs itself: classifying a new forward ------------

# A finalizer (a GC callback stands in for one, run by a collection inside the
# classification of torch's Hardshrink.forward, which allocates) deletes that
# very function from its class: it is freed while the call held it borrowed.
CLASSIFIER_FINALIZER_DELETES_FORWARD = """
import fastmodule._verified.frame_counting as fc
fired = []

def inside_classifier():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename == fc.__file__:
            return True
        f = f.f_back
    return False

def mutate():
    del nn.Hardshrink.forward
    junk = [object() for _ in range(2000)]  # noqa: F841

def on_gc(phase, info):
    if phase == "start" and not fired and inside_classifier():
        fired.append(1)
        mutate()

m = nn.Hardshrink()
x = torch.tensor([-1.0, 0.25, 2.0])
if fast:
    fastmodule.accelerate(m)
    gc.callbacks.append(on_gc)
else:
    fired.append(1)
    mutate()
gc.set_threshold(1)
try:
    r = ("ok", m(x).tolist())
except Exception as e:
    r = ("raised", type(e).__name__, str(e))
gc.set_threshold(700)
if on_gc in gc.callbacks:
    gc.callbacks.remove(on_gc)
print(r, len(fired))
"""


@pytest.mark.requires_native("a finalizer run by the native classification of a new forward")
def test_classifier_finalizer_freeing_the_forward_being_called() -> None:
    out = assert_same(CLASSIFIER_FINALIZER_DELETES_FORWARD)
    assert out.strip().endswith("1"), out


# The same, on the path with forward hooks: the finalizer replaces the
# pre-hook registry the call read (the old one, freed, must not run).
CLASSIFIER_FINALIZER_REPLACES_PRE_HOOKS = """
from collections import OrderedDict
import fastmodule._verified.frame_counting as fc
fired = []
log = []

def inside_classifier():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename == fc.__file__:
            return True
        f = f.f_back
    return False

def mutate():
    m.__dict__["_forward_pre_hooks"] = OrderedDict({99: lambda mod, args: log.append("new")})
    junk = [object() for _ in range(2000)]  # noqa: F841

def on_gc(phase, info):
    if phase == "start" and not fired and inside_classifier():
        fired.append(1)
        mutate()

m = nn.Softsign()
m.register_forward_pre_hook(lambda mod, args: log.append("old"))
x = torch.tensor([-1.0, 0.25, 2.0])
if fast:
    fastmodule.accelerate(m)
    gc.callbacks.append(on_gc)
else:
    fired.append(1)
    mutate()
gc.set_threshold(1)
r = [m(x).tolist(), m(x).tolist()]
gc.set_threshold(700)
if on_gc in gc.callbacks:
    gc.callbacks.remove(on_gc)
print(r, log, len(fired))
"""


@pytest.mark.requires_native("a finalizer run by the native classification of a new forward")
def test_classifier_finalizer_replacing_the_hooks_being_dispatched() -> None:
    out = assert_same(CLASSIFIER_FINALIZER_REPLACES_PRE_HOOKS)
    assert "'new', 'new'" in out and out.strip().endswith("1"), out


# --- a lookup in an instance dict a pre-hook made non-quiet ----------------------

# A forward pre-hook gives the layer's instance dict a key hashing like the
# method its forward looks up first (`self._conv_forward`,
# `self._check_input_dim`): torch's forward runs that key's `__eq__` once per
# call; the native step must not run it once more before handing over.
LAYER_DICT_KEY_FROM_PRE_HOOK = """
calls = []

class K:
    def __init__(self, name):
        self.name = name
    def __hash__(self):
        return hash(self.name)
    def __eq__(self, other):
        calls.append(1)
        return False

m, x, name = {make}
key = K(name)

def pre(mod, args):
    mod.__dict__[key] = 1

m.register_forward_pre_hook(pre)
if fast:
    fastmodule.accelerate(m)
with torch.no_grad():
    shapes = [tuple(m(x).shape) for _ in range(4)]
print(shapes, len(calls))
"""


def test_conv_with_a_non_str_instance_key_from_a_pre_hook() -> None:
    make = "nn.Conv2d(2, 3, 3), torch.ones(1, 2, 5, 5), '_conv_forward'"
    assert_same(LAYER_DICT_KEY_FROM_PRE_HOOK.replace("{make}", make))


def test_batch_norm_with_a_non_str_instance_key_from_a_pre_hook() -> None:
    make = "nn.BatchNorm1d(3).eval(), torch.ones(2, 3), '_check_input_dim'"
    assert_same(LAYER_DICT_KEY_FROM_PRE_HOOK.replace("{make}", make))
