"""Stateful differential fuzzer: stock, fast and accelerated trees driven by the same steps.

A hypothesis ``RuleBasedStateMachine`` keeps three worlds (tests/fuzz_world.py): a tree of
stock ``torch.nn.Module`` subclasses, the same tree of ``fastmodule.Module`` subclasses,
and the same tree of stock subclasses accelerated in place. Every rule runs one step on
each world; after it the step's value or exception (type and text), warnings, the log of
hooks, finalizers, colliding keys and dict-subclass calls, and a snapshot of the tree
(registries, flags, tensors and grads, named_modules/parameters/buffers, state_dict with
_metadata, a forward) must be the same in all three.

Steps repeat walks, state_dict and train/eval, so the recorded plans of fastmodule (docs/design.md
"Recorded walks") are replayed, and interleave mutations from hooks, finalizers, colliding
keys' ``__eq__``, a second thread and half-consumed walks.

Other steps change what fastmodule's decisions rest on (docs/design.md "What may change at
run time"): process-wide patches of torch between steps (tests/fuzz_patches.py: the code of
a layer forward, container method, functional or ``nn.Module`` function replaced; a Tensor
method, a torch global, ``warnings.warn`` wrapped; defaults and class attributes changed),
applied to the three worlds at once and each patched call noted in the running world's
log; a layer block beside the tree (torch's Linear, ReLU, Sequential, LayerNorm, Softmax,
Dropout, BatchNorm1d, GELU, Conv1d) called on inputs of several ranks, with hooks that
change a layer's attributes, fail, or patch torch during the call. Warnings are compared
with the file and line they point at.

A step sequence may crash the process (a native defect), so pytest runs the machine in a
subprocess (``main()``). The number of examples comes from ``FASTMODULE_FUZZ_EXAMPLES``
(default: the bounded CI run, derandomized); ``FASTMODULE_FUZZ_TRACE=path`` appends every
step to a file, for crashes no traceback can shrink.
"""

from __future__ import annotations

import functools
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from torch import nn

from tests import fuzz_patches as fp
from tests import fuzz_world as fw
from tests.fuzz_world import (
    ACTION_KINDS,
    DTYPES,
    HOOK_BEHAVIOURS,
    HOOK_KINDS,
    LAYER_BLOCK,
    LAYER_HOOKS,
    LAYER_INPUTS,
    LOAD_EDITS,
    MODULE_KINDS,
    NAMES,
    REGISTRIES,
    REGISTRY_KINDS,
    SIDES,
    SWAP_KINDS,
    WALKS,
    Action,
    World,
)

# Defaults of the bounded CI run: about 4000 steps, 20-40 s on a busy 2-core machine.
CI_EXAMPLES = 120
STEPS_PER_EXAMPLE = 40

# Known defects the machine would otherwise hit again and again. A step that needs one
# of these features is skipped while it is listed here. Each names the tests that fail
# until it is fixed (tests/test_parity_fuzz_findings.py, tests/test_parity_faults.py)
# and the reproducers of the same code paths; an entry goes once its tests pass.
KNOWN: dict[str, str] = {
    # Features switched off while a known defect keeps failing them: "feature words":
    # "the failing test or repro". Empty: every feature the fuzzer has is on.
    #
    # Not a defect, a documented property: a wrapper around torch's Softmax.forward
    # is not torch's code, so the call keeps no _call_impl frames and F.softmax's
    # implicit-dim warning (stacklevel=5) points elsewhere (README, Known
    # differences: frames of a forward; repro known_23).
    "patch wrap Softmax.forward": "README Known differences (frames), repro known_23",
    # Likewise: torch's state_dict with a replaced body is called from
    # fastmodule.Module's method frame (README, Known differences).
    "state_dict positional, own body swapped": "README Known differences (frames)",
}

TRACE = os.environ.get("FASTMODULE_FUZZ_TRACE")
STEPS = [0]
EXAMPLES = [0]

index = st.integers(min_value=0, max_value=63)
actions: st.SearchStrategy[Action] = st.tuples(
    st.sampled_from(ACTION_KINDS), index, index, st.booleans()
)
# Whole-tree calls: the root half of the time (plans are recorded per root).
tree = st.one_of(st.just(0), index)
repeat = st.integers(min_value=1, max_value=3)
# Mostly the tree's own shape; 1 broadcasts, 3 mis-shapes (errors, load mismatches).
SHAPES = st.sampled_from([2, 2, 2, 2, 2, 1, 3])


def known(*feature: str) -> bool:
    """Is ``feature`` (or a leading part of it) switched off for a known defect?"""
    return any(" ".join(feature[:i]) in KNOWN for i in range(1, len(feature) + 1))


if not known("registry names"):
    NAMES.extend(fw.REGISTRY_NAMES)


def trace(text: str) -> None:
    if TRACE:
        with open(TRACE, "a") as f:
            f.write(text + "\n")


def traced(fn: Callable[..., None]) -> Callable[..., None]:
    """Write each call of a rule to the trace as the line that replays it."""

    @functools.wraps(fn)
    def run(self: Any, **kwargs: Any) -> None:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
        trace(f"state.{fn.__name__}({args})")
        fn(self, **kwargs)

    return run


def difference(a: Any, b: Any, path: str = "") -> str:
    """Where two observations first differ, briefly."""
    if type(a) is not type(b):
        return f"{path}: {a!r:.300} != {b!r:.300}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return difference(a.get(k), b.get(k), f"{path}[{k!r}]")
    if isinstance(a, list | tuple) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r:.600}\n  !=\n{b!r:.600}"


def assert_same(what: str, observed: list[Any]) -> None:
    if fw.CHAOS[0] is not None:  # crash hunting: only errors that mean misuse of the C API
        text = repr(observed)
        assert "SystemError" not in text, f"{what}: SystemError in {text[:3000]}"
        return
    stock = observed[0]
    for side, got in zip(SIDES[1:], observed[1:], strict=True):
        if got != stock:
            raise AssertionError(f"{what}: {side} differs from stock at " + difference(stock, got))


class FuzzMachine(RuleBasedStateMachine):
    """Three worlds, one step at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.worker = fw.Worker()
        self.worlds = [World(side, self.worker) for side in SIDES]
        self.hooks = 0
        self.global_handles: dict[int, Any] = {}
        self.patches: dict[str, Callable[[], None]] = {}
        trace("--- example")

    def teardown(self) -> None:
        for undo in reversed(list(self.patches.values())):
            undo()
        for h in self.global_handles.values():
            h.remove()
        for w in self.worlds:
            w.close()
        fw.CURRENT[0] = None
        self.worker.stop()
        EXAMPLES[0] += 1
        if fw.CHAOS[0] is None and EXAMPLES[0] % 20 == 0:
            gc.collect()  # the automatic GC is off (see main): free the dead worlds

    # ------------------------------------------------------------------ machinery

    def step(self, what: str, fn: Callable[[World], Any]) -> None:
        """Run ``fn`` on each world and compare what each observed."""
        STEPS[0] += 1
        assert_same(what, [fw.record(w, lambda w=w: fn(w)) for w in self.worlds])

    @initialize()
    def start(self) -> None:
        pass

    @invariant()
    def same_trees(self) -> None:
        assert_same("snapshot", [fw.snapshot(w, 0) for w in self.worlds])

    # ------------------------------------------------------------------ registration

    @rule(
        t=index,
        n=index,
        seed=index,
        how=st.sampled_from(["setattr", "register", "register_none"]),
        shape=SHAPES,
    )
    @traced
    def set_param(self, t: int, n: int, seed: int, how: str, shape: int) -> None:
        def go(w: World) -> Any:
            m, name = w.at(t), w.key_at(w.at(t), "_parameters", n)
            if how == "register_none":
                return m.register_parameter(name, None)
            p = w.tensor(seed, shape, param=True)
            if how == "setattr":
                return setattr(m, name, p)
            return m.register_parameter(name, p)

        self.step(f"set_param {t} {n} {seed} {how} {shape}", go)

    @rule(
        t=index,
        n=index,
        seed=index,
        how=st.sampled_from(["register", "register_np", "setattr", "Buffer", "none"]),
        shape=SHAPES,
    )
    @traced
    def set_buffer(self, t: int, n: int, seed: int, how: str, shape: int) -> None:
        def go(w: World) -> Any:
            m, name = w.at(t), w.key_at(w.at(t), "_buffers", n)
            b = w.tensor(seed, shape)
            if how == "register":
                return m.register_buffer(name, b)
            if how == "register_np":
                return m.register_buffer(name, b, persistent=False)
            if how == "setattr":
                return setattr(m, name, b)
            if how == "Buffer":
                return setattr(m, name, nn.Buffer(b, persistent=bool(seed % 2)))
            return m.register_buffer(name, None)

        self.step(f"set_buffer {t} {n} {seed} {how} {shape}", go)

    @rule(
        t=index,
        n=index,
        kind=st.sampled_from([*MODULE_KINDS, "existing", "none"]),
        other=index,
        how=st.sampled_from(["setattr", "add_module", "register_module"]),
        action=actions,
    )
    @traced
    def set_child(self, t: int, n: int, kind: str, other: int, how: str, action: Action) -> None:
        if kind == "Mortal" and known("mortal"):
            return

        def go(w: World) -> Any:
            m, name = w.at(t), w.key_at(w.at(t), "_modules", n)
            if kind == "existing":
                # Shared, never a cycle: a cyclic tree makes state_dict, train, apply,
                # load and forward recurse until RecursionError, whose text and
                # reach depend on the caller's stack (README, Known differences).
                c: Any = w.at(other)
                if w.reaches(c, m):
                    c = w.make("Leaf")
            elif kind == "none":
                c = None
            else:
                c = w.make(kind)
                if kind == "Mortal":
                    c.__dict__["_fz"] = (w, action, w.serial())
            if how == "setattr":
                return setattr(m, name, c)
            return getattr(m, how)(name, c)

        self.step(f"set_child {t} {n} {kind} {other} {how} {action}", go)

    @rule(t=index, n=index, which=st.sampled_from(REGISTRIES[:3] + ["plain"]))
    @traced
    def delete(self, t: int, n: int, which: str) -> None:
        def go(w: World) -> Any:
            m = w.at(t, which if which != "plain" else None)
            name = w.key_at(m, which, n) if which != "plain" else NAMES[n % len(NAMES)]
            return delattr(m, name)

        self.step(f"delete {t} {n} {which}", go)

    @rule(t=index, n=index, which=st.sampled_from(REGISTRIES[:3]))
    @traced
    def registry_pop(self, t: int, n: int, which: str) -> None:
        def go(w: World) -> Any:
            m = w.at(t, which)
            return m.__dict__[which].pop(w.key_at(m, which, n), None)

        self.step(f"registry_pop {t} {n} {which}", go)

    @rule(t=index, n=index, value=st.sampled_from(["int", "str", "dropper"]), action=actions)
    @traced
    def set_plain(self, t: int, n: int, value: str, action: Action) -> None:
        if value == "dropper" and known("dropper"):
            return

        def go(w: World) -> Any:
            v: Any = {"int": 7, "str": "text"}.get(value)
            if value == "dropper":
                v = fw.Dropper(w, w.serial(), action)
            return setattr(w.at(t), NAMES[n % len(NAMES)], v)

        self.step(f"set_plain {t} {n} {value} {action}", go)

    # ------------------------------------------------------------------ unusual objects

    @rule(t=index, kind=st.sampled_from(SWAP_KINDS))
    @traced
    def swap_class(self, t: int, kind: str) -> None:
        def go(w: World) -> Any:
            w.at(t).__class__ = w.fam[kind]

        self.step(f"swap_class {t} {kind}", go)

    @rule(t=index, sub=st.booleans())
    @traced
    def replace_dict(self, t: int, sub: bool) -> None:
        if known("replace_dict"):
            return

        def go(w: World) -> Any:
            m = w.at(t)
            m.__dict__ = (fw.PlainSubDict if sub else dict)(m.__dict__)

        self.step(f"replace_dict {t} {sub}", go)

    @rule(t=index, which=st.sampled_from(REGISTRIES), kind=st.sampled_from(REGISTRY_KINDS))
    @traced
    def replace_registry(self, t: int, which: str, kind: str) -> None:
        def go(w: World) -> Any:
            m = w.at(t)
            old = m.__dict__[which]
            if which == "_non_persistent_buffers_set":
                new: Any = (fw.SubSet if kind == "LoggingDict" else set)(old)
            elif kind == "LoggingDict":
                new = fw.LoggingDict(old)
                new.__dict__["log"] = w.log
            else:
                new = {"dict": dict, "OrderedDict": fw.collections.OrderedDict}.get(
                    kind, fw.PlainSubDict
                )(old)
            m.__dict__[which] = new

        self.step(f"replace_registry {t} {which} {kind}", go)

    @rule(
        t=index,
        where=st.sampled_from(["instance", *REGISTRIES]),
        n=index,
        alias=st.booleans(),
        action=actions,
    )
    @traced
    def colliding_key(self, t: int, where: str, n: int, alias: bool, action: Action) -> None:
        if known("colliding_key", where, "equal" if alias else "unequal", NAMES[n % len(NAMES)]):
            return
        if known("colliding_key action", action[0]):
            return

        def go(w: World) -> Any:
            m = w.at(t)
            name = NAMES[n % len(NAMES)]
            key = fw.CollidingKey(w, w.serial(), name, alias, ("noop", 0, 0, False))
            key.action = None  # inserting compares too: arm it afterwards
            if where == "instance":
                target: Any = w.raw(m)
            else:
                target = w.registry(m, where)
            if isinstance(target, set):
                target.add(key)
            else:
                target[key] = None if where != "instance" else 5
            key.action = action

        self.step(f"colliding_key {t} {where} {n} {alias} {action}", go)

    # ------------------------------------------------------------------ hooks

    @rule(
        t=index,
        kind=st.sampled_from(HOOK_KINDS),
        behaviour=st.sampled_from(HOOK_BEHAVIOURS),
        action=actions,
    )
    @traced
    def add_hook(self, t: int, kind: str, behaviour: str, action: Action) -> None:
        self.hooks += 1
        hid = self.hooks

        def go(w: World) -> Any:
            h = fw.register_hook(w.at(t), kind, w.hook(hid, kind, behaviour, action))
            w.handles[hid] = h

        self.step(f"add_hook {t} {kind} {behaviour} {action} -> {hid}", go)

    @rule(i=index)
    @traced
    def remove_hook(self, i: int) -> None:
        def go(w: World) -> Any:
            if not w.handles:
                return None
            hid = sorted(w.handles)[i % len(w.handles)]
            w.handles.pop(hid).remove()
            return hid

        self.step(f"remove_hook {i}", go)

    @rule(
        kind=st.sampled_from(fw.GLOBAL_HOOK_KINDS),
        behaviour=st.sampled_from(["log", "log", "change", "raise"]),
    )
    @traced
    def add_global_hook(self, kind: str, behaviour: str) -> None:
        """A process-wide hook (one for the three worlds; it logs into the running one)."""
        self.hooks += 1
        hid = self.hooks
        self.global_handles[hid] = fw.register_global_hook(
            kind, fw.global_hook(hid, kind, behaviour)
        )
        STEPS[0] += 1

    @rule(i=index)
    @traced
    def remove_global_hook(self, i: int) -> None:
        if self.global_handles:
            hid = sorted(self.global_handles)[i % len(self.global_handles)]
            self.global_handles.pop(hid).remove()
        STEPS[0] += 1

    @rule(mode=st.sampled_from(["no_grad", "functions", "ops"]))
    @traced
    def toggle_mode(self, mode: str) -> None:
        """Switch a grad or torch-function/dispatch mode on or off for later steps."""
        for w in self.worlds:
            if mode in w.modes:
                w.modes.remove(mode)
            else:
                w.modes.append(mode)
        STEPS[0] += 1

    @rule(
        t=index,
        op=st.sampled_from(
            [
                "len",
                "getitem",
                "slice",
                "list",
                "delitem",
                "insert",
                "append",
                "pop",
                "setitem",
                "contains",
                "keys",
                "items",
                "values",
                "extend",
                "update",
            ]
        ),
        i=st.integers(-3, 5),
    )
    @traced
    def container(self, t: int, op: str, i: int) -> None:
        """Sequential/ModuleList/ModuleDict protocol methods (other modules raise)."""

        def go(w: World) -> Any:
            m: Any = w.at(t)
            dict_like = isinstance(m, nn.ModuleDict)
            key: Any = NAMES[i % 6] if dict_like else i
            if op == "len":
                return len(m)
            if op == "getitem":
                return m[key]
            if op == "slice":
                return list(m[i:])
            if op == "list":
                return list(m)
            if op == "delitem":
                del m[key]
                return None
            if op == "insert":
                return m.insert(i, w.make("Leaf"))
            if op == "append":
                return m.append(w.make("Leaf"))
            if op == "pop":
                return m.pop(key)
            if op == "setitem":
                m[key] = w.make("Leaf")
                return None
            if op == "contains":
                return key in m
            if op == "extend":
                return m.extend([w.make("Leaf"), w.make("Node")])
            if op == "update":
                return m.update({"u": w.make("Leaf")})
            return list(getattr(m, op)())

        self.step(f"container {t} {op} {i}", go)

    @rule(t=index, name=st.sampled_from(fw.SHADOWED), how=st.sampled_from(["call", "weird", "del"]))
    @traced
    def shadow(self, t: int, name: str, how: str) -> None:
        """An instance attribute shadows (or stops shadowing) one of the module's methods."""

        def go(w: World) -> Any:
            m = w.at(t)
            if how == "del":
                return m.__dict__.pop(name, None) is not None
            m.__dict__[name] = fw.shadow(w, m, name, how == "weird")
            return None

        self.step(f"shadow {t} {name} {how}", go)

    @rule(name=st.sampled_from(fw.PATCHED))
    @traced
    def patch_torch(self, name: str) -> None:
        """A library patches ``torch.nn.Module.<name>`` (or takes its patch back)."""
        if name in self.patches:
            self.patches.pop(name)()
        else:
            self.patches[name] = fw.patch_torch(name)
        STEPS[0] += 1

    # ------------------------------------------------------------------ layers, patched torch

    # Most layer steps act on every layer of the block at once: a hook or patch that
    # matters to one kind is then met by the next call of the block.
    layer_kinds = st.sampled_from([*LAYER_BLOCK, "all", "all", "all", "all", "all"])

    @rule(
        kind=layer_kinds,
        seed=index,
        how=st.sampled_from(["plain", "plain", "grad", "sub"]),
        hook=st.sampled_from([None, None, "attr", "attr", "both_raise", "patch"]),
        change=index,
    )
    @traced
    def layer_call(self, kind: str, seed: int, how: str, hook: str | None, change: int) -> None:
        """Call the layers of the layer block (or one) on every input of LAYER_INPUTS (the
        tree's shape twice: the second call may reuse what the first decided), with the
        hooks of ``hook`` (LAYER_HOOKS) on each for these calls only."""
        kinds = LAYER_BLOCK if kind == "all" else [kind]

        def go(w: World) -> Any:
            handles = [
                fw.layer_hooks(w, 0, w.layer(k), hook, self.hook_change(k, hook, change), False)
                for k in (kinds if hook is not None else [])
            ]
            try:
                return [
                    fw.outcome_of(lambda: w.layer(k)(fw.layer_input(i, seed, how)))
                    for k in kinds
                    for i in range(len(LAYER_INPUTS))
                ]
            finally:
                for h in handles:
                    h.remove()

        self.step(f"layer_call {kind} {seed} {how} {hook} {change}", go)

    @rule(kind=layer_kinds, change=index, what=st.sampled_from(LAYER_HOOKS), prepend=st.booleans())
    @traced
    def layer_hook(self, kind: str, change: int, what: str, prepend: bool) -> None:
        """Hooks on a layer (or on each) that change one of its attributes during the call,
        or fail."""
        if known("layer_hook", what):
            return
        self.hooks += 1
        hid = self.hooks
        kinds = LAYER_BLOCK if kind == "all" else [kind]

        def go(w: World) -> Any:
            w.handles[hid] = fw.Handles(
                *(
                    fw.layer_hooks(
                        w, hid, w.layer(k), what, self.hook_change(k, what, change), prepend
                    )
                    for k in kinds
                )
            )

        self.step(f"layer_hook {kind} {change} {what} {prepend} -> {hid}", go)

    @staticmethod
    def hook_change(kind: str, what: str, change: int) -> tuple[str, Any]:
        if what == "patch":  # half the time one of the patches layer calls rest on most
            pool = fp.FOCUS if change % 2 else fp.DURING_CALL
            patch = pool[(change // 2 * 9 + LAYER_BLOCK.index(kind) * 17) % len(pool)]
            return ("patch", "defaults:F.relu" if known("patch", *patch.split(":")) else patch)
        return fw.layer_change(kind, change)

    @rule(kind=layer_kinds, change=index)
    @traced
    def layer_attr(self, kind: str, change: int) -> None:
        """Change an attribute of a layer (or of each) between two calls."""
        kinds = LAYER_BLOCK if kind == "all" else [kind]

        def go(w: World) -> Any:
            for k in kinds:
                attr, value = fw.layer_change(k, change)
                fw.change_layer(w.layer(k), attr, value, lambda: w.make("Relu"))

        self.step(f"layer_attr {kind} {change}", go)

    @rule(kind=st.sampled_from(LAYER_BLOCK), to=st.sampled_from(LAYER_BLOCK))
    @traced
    def layer_class(self, kind: str, to: str) -> None:
        """A layer of the block becomes another kind of layer (``__class__`` assigned)."""

        def go(w: World) -> Any:
            w.layer(kind).__class__ = w.fam[to]

        self.step(f"layer_class {kind} {to}", go)

    def toggle_patch(self, patch: str) -> None:
        """Apply a process-wide patch of torch (tests/fuzz_patches.py), or undo the one
        on the same target: every world's later steps run under the same patches."""
        target = fp.target(patch)
        if target in self.patches:
            self.patches.pop(target)()
        elif not known("patch", *patch.split(":")):
            self.patches[target] = fp.apply(patch)
        STEPS[0] += 1

    @rule(name=st.sampled_from(fp.LAYER_CODE + fp.CONTAINER_CODE), plus=st.booleans())
    @traced
    def swap_layer_code(self, name: str, plus: bool) -> None:
        """Hot reload of a torch layer or container function: its ``__code__`` replaced."""
        self.toggle_patch(f"code:{name}:{'plus' if plus and fp.plus_allowed(name) else 'count'}")

    @rule(name=st.sampled_from(fp.WRAP_TARGETS))
    @traced
    def wrap_layer_method(self, name: str) -> None:
        """A layer's or container's method monkeypatched with a counting wrapper."""
        self.toggle_patch(f"wrap:{name}")

    @rule(
        name=st.sampled_from(
            [f"defaults:{d}" for d in fp.DEFAULTS] + [f"classattr:{c}" for c in fp.CLASS_ATTRS]
        )
    )
    @traced
    def patch_defaults(self, name: str) -> None:
        """A torch function's default arguments, or a class attribute torch reads, changed."""
        self.toggle_patch(name)

    @rule(name=st.sampled_from(fp.MODULE_CODE))
    @traced
    def swap_module_code(self, name: str) -> None:
        """Hot reload of a ``torch.nn.Module`` function: a counting ``__code__``."""
        self.toggle_patch(f"code:{name}:count")

    @rule(name=st.sampled_from(fp.TENSOR_METHODS))
    @traced
    def patch_tensor(self, name: str) -> None:
        """A recording tool wraps a ``torch.Tensor`` method."""
        self.toggle_patch(f"tensor:{name}")

    @rule(name=st.sampled_from(list(fp.GLOBAL_TARGETS)))
    @traced
    def patch_global(self, name: str) -> None:
        """A global of torch's modules (a function, a builtin, a module) wrapped."""
        self.toggle_patch(f"global:{name}")

    @rule(bridge=st.booleans())
    @traced
    def patch_warnings_warn(self, bridge: bool) -> None:
        """``warnings.warn`` wrapped (``unittest.mock``; a logging bridge that looks at its
        caller and forwards with one ``stacklevel`` more)."""
        self.toggle_patch("global:warnings.warn_bridge" if bridge else "global:warnings.warn")

    # ------------------------------------------------------------------ parametrize, prune

    @rule(t=index, n=index, keep=st.booleans(), op=st.sampled_from(["add", "remove"]))
    @traced
    def parametrize(self, t: int, n: int, keep: bool, op: str) -> None:
        def go(w: World) -> Any:
            m = w.at(t, "_parameters")
            name = w.key_at(m, "_parameters", n)
            if op == "add":
                return fw.register_parametrization(m, name, w.fam["Scale"])
            params = w.registry(m, "_modules") or {}
            names = sorted(getattr(params.get("parametrizations"), "_modules", {}) or [name])
            return fw.remove_parametrization(m, names[n % len(names)], keep)

        self.step(f"parametrize {t} {n} {keep} {op}", go)

    @rule(t=index, n=index, op=st.sampled_from(["l1", "remove"]))
    @traced
    def prune(self, t: int, n: int, op: str) -> None:
        def go(w: World) -> Any:
            m = w.at(t, "_parameters")
            if op == "l1":
                return fw.prune_l1(m, w.key_at(m, "_parameters", n))
            name = w.key_at(m, "_parameters", n)
            return fw.prune_remove(m, name[:-5] if name.endswith("_orig") else name)

        self.step(f"prune {t} {n} {op}", go)

    # ------------------------------------------------------------------ whole-tree calls

    @rule(
        t=tree,
        how=st.sampled_from(
            [
                "double",
                "float",
                "half",
                "bfloat16",
                "to",
                "to_kw",
                "type",
                "to_same",
                "cpu",
                "to_empty",
                "apply_no_recurse",
            ]
        ),
        d=st.integers(0, len(DTYPES) - 1),
        times=repeat,
    )
    @traced
    def convert(self, t: int, how: str, d: int, times: int) -> None:
        dtype = DTYPES[d]

        def go(w: World) -> Any:
            m = w.at(t)
            out = []
            for _ in range(times):
                if how == "to":
                    r = m.to(dtype)
                elif how == "to_kw":
                    r = m.to(dtype=dtype)
                elif how == "type":
                    r = m.type(dtype)
                elif how == "to_same":
                    r = m.to("cpu")
                elif how == "to_empty":
                    try:
                        r = m.to_empty(device="cpu")
                    finally:
                        w.fill(m)  # uninitialised memory (even if it failed halfway)
                elif how == "apply_no_recurse":
                    r = m._apply(lambda x: x.to(dtype), recurse=False)
                else:
                    r = getattr(m, how)()
                out.append(r)
            return out

        self.step(f"convert {t} {how} {dtype} x{times}", go)

    @rule(t=tree, mode=st.sampled_from(["train", "eval", "True", "False", "flip"]), times=repeat)
    @traced
    def train(self, t: int, mode: str, times: int) -> None:
        def go(w: World) -> Any:
            m = w.at(t)
            out = []
            for i in range(times):
                if mode == "train":
                    out.append(m.train())
                elif mode == "eval":
                    out.append(m.eval())
                elif mode == "flip":
                    out.append(m.train(bool(i % 2)))
                else:
                    out.append(m.train(mode == "True"))
            return out

        self.step(f"train {t} {mode} x{times}", go)

    @rule(t=tree, flag=st.booleans(), times=repeat)
    @traced
    def requires_grad(self, t: int, flag: bool, times: int) -> None:
        self.step(
            f"requires_grad {t} {flag} x{times}",
            lambda w: [w.at(t).requires_grad_(flag) for _ in range(times)],
        )

    @rule(t=tree, set_to_none=st.booleans(), times=repeat)
    @traced
    def zero_grad(self, t: int, set_to_none: bool, times: int) -> None:
        self.step(
            f"zero_grad {t} {set_to_none} x{times}",
            lambda w: [w.at(t).zero_grad(set_to_none) for _ in range(times)],
        )

    @rule(t=tree, seed=index)
    @traced
    def backward(self, t: int, seed: int) -> None:
        def go(w: World) -> Any:
            out = w.at(t)(torch.ones(3, 2) + seed)
            out.float().sum().backward()
            return out

        self.step(f"backward {t} {seed}", go)

    @rule(t=tree, seed=index)
    @traced
    def call(self, t: int, seed: int) -> None:
        self.step(f"call {t} {seed}", lambda w: w.at(t)(torch.ones(3, 2) + seed))

    @rule(
        t=tree,
        behaviour=st.sampled_from(["log", "raise", "act"]),
        at=st.integers(0, 12),
        action=actions,
    )
    @traced
    def apply(self, t: int, behaviour: str, at: int, action: Action) -> None:
        def go(w: World) -> Any:
            seen: list[Any] = []

            def fn(m: nn.Module) -> None:
                seen.append(w.label(m))
                if len(seen) == at and behaviour == "raise":
                    raise ValueError(f"apply stops at {at}")
                if len(seen) == at and behaviour == "act":
                    w.act(action)

            r = fw.outcome_of(lambda: w.at(t).apply(fn))
            return r, seen

        self.step(f"apply {t} {behaviour} {at} {action}", go)

    @rule(t=tree, at=st.integers(0, 12), d=st.integers(0, len(DTYPES) - 1))
    @traced
    def apply_fn(self, t: int, at: int, d: int) -> None:
        """``_apply`` with a function that fails at the ``at``-th tensor."""

        def go(w: World) -> Any:
            seen: list[Any] = []

            def fn(x: torch.Tensor) -> torch.Tensor:
                seen.append(w.label(x))
                if len(seen) == at:
                    raise ValueError(f"_apply stops at {at}")
                return x.to(DTYPES[d])

            r = fw.outcome_of(lambda: w.at(t)._apply(fn))
            return r, seen

        self.step(f"apply_fn {t} {at} {DTYPES[d]}", go)

    # ------------------------------------------------------------------ state_dict

    @rule(
        t=tree,
        variant=st.sampled_from(["plain", "prefix", "keep_vars", "destination", "positional"]),
        times=repeat,
    )
    @traced
    def state_dict(self, t: int, variant: str, times: int) -> None:
        # torch's state_dict itself with another body: fastmodule.Module's method
        # hands the call to it from a frame of its own, so a stacklevel=2 warning
        # in that body points at the method (README, Known differences: a
        # fastmodule.Module method's frame).
        swapped = any(
            k in ("code:Module.state_dict", "defaults:Module.state_dict") for k in self.patches
        )
        if variant == "positional" and swapped and known("state_dict positional, own body swapped"):
            return

        def go(w: World) -> Any:
            m = w.at(t)
            out = []
            for _ in range(times):
                if variant == "plain":
                    out.append(m.state_dict())
                elif variant == "prefix":
                    out.append(m.state_dict(prefix="p."))
                elif variant == "keep_vars":
                    out.append(m.state_dict(keep_vars=True))
                elif variant == "destination":
                    out.append(m.state_dict(destination=fw.collections.OrderedDict()))
                else:
                    out.append(m.state_dict(None, "q."))
            return out

        self.step(f"state_dict {t} {variant} x{times}", go)

    @rule(
        t=tree,
        src=index,
        edit=st.integers(0, LOAD_EDITS - 1),
        k=index,
        strict=st.booleans(),
        assign=st.sampled_from([False, False, False, True]),
        times=repeat,
    )
    @traced
    def load_state_dict(
        self, t: int, src: int, edit: int, k: int, strict: bool, assign: bool, times: int
    ) -> None:
        def go(w: World) -> Any:
            m = w.at(t)
            sd = fw.load_source(w, w.at(src) if src % 2 else m, edit, k)
            return [
                fw.outcome_of(lambda: m.load_state_dict(sd, strict=strict, assign=assign))
                for _ in range(times)
            ]

        self.step(f"load_state_dict {t} {src} {edit} {k} {strict} {assign} x{times}", go)

    # ------------------------------------------------------------------ walks

    @rule(t=tree, walk=st.integers(0, len(WALKS) - 1), times=repeat)
    @traced
    def walk(self, t: int, walk: int, times: int) -> None:
        meth, args, kwargs = WALKS[walk]

        def go(w: World) -> Any:
            m = w.at(t)
            return [list(getattr(m, meth)(*fw.walk_args(args), **kwargs)) for _ in range(times)]

        self.step(f"walk {t} {meth} {args} {kwargs} x{times}", go)

    @rule(t=tree, walk=st.integers(0, len(WALKS) - 1), n=st.integers(0, 4))
    @traced
    def open_walk(self, t: int, walk: int, n: int) -> None:
        meth, args, kwargs = WALKS[walk]

        def go(w: World) -> Any:
            it = getattr(w.at(t), meth)(*fw.walk_args(args), **kwargs)
            w.iters.append(it)
            return fw.iterate(it, n)

        self.step(f"open_walk {t} {meth} {args} {kwargs} next x{n}", go)

    @rule(i=index, n=st.integers(1, 6), action=actions, before=st.booleans())
    @traced
    def resume_walk(self, i: int, n: int, action: Action, before: bool) -> None:
        """Resume an open walk, after (or between its items) running an action."""

        def go(w: World) -> Any:
            if not w.iters:
                return None
            it = w.iters[i % len(w.iters)]
            if it is None:
                return "closed"
            if before:
                w.act(action)
            got = fw.iterate(it, n)
            if not before:
                w.act(action)
                got += fw.iterate(it, n)
            return got

        self.step(f"resume_walk {i} {n} {action} {before}", go)

    @rule(i=index, how=st.sampled_from(["close", "drop"]))
    @traced
    def end_walk(self, i: int, how: str) -> None:
        def go(w: World) -> Any:
            if not w.iters:
                return None
            j = i % len(w.iters)
            it = w.iters[j]
            w.iters[j] = None
            if it is not None and how == "close":
                it.close()  # type: ignore[attr-defined]
            return j

        self.step(f"end_walk {i} {how}", go)

    # ------------------------------------------------------------------ finalizers, threads

    @rule(t=index, n=index, what=st.sampled_from(["param", "buffer", "grad"]), action=actions)
    @traced
    def on_free(self, t: int, n: int, what: str, action: Action) -> None:
        """Run an action when a tensor of the tree is freed (replaced, converted, deleted)."""
        if known("on_free", what):
            return

        def go(w: World) -> Any:
            reg = "_buffers" if what == "buffer" else "_parameters"
            m = w.at(t, reg)
            name = w.key_at(m, reg, n)
            obj = (w.registry(m, reg) or {}).get(name)
            if what == "grad":
                obj = getattr(obj, "grad", None)
            if obj is None:
                return None
            w.on_free(obj, action)
            return name

        self.step(f"on_free {t} {n} {what} {action}", go)

    @rule(action=actions)
    @traced
    def act(self, action: Action) -> None:
        self.step(f"act {action}", lambda w: w.act(action))

    @rule(
        path=st.lists(index, max_size=3),
        kind=st.sampled_from(["module", "parameter", "buffer", "set"]),
    )
    @traced
    def dotted(self, path: list[int], kind: str) -> None:
        def go(w: World) -> Any:
            names = [str(NAMES[i % len(NAMES)]) for i in path]
            target = ".".join(names)
            if kind == "module":
                return w.root.get_submodule(target)
            if kind == "parameter":
                return w.root.get_parameter(target)
            if kind == "buffer":
                return w.root.get_buffer(target)
            return w.root.set_submodule(target, w.make("Leaf"))

        self.step(f"dotted {path} {kind}", go)


def settings_for_run() -> settings:
    examples = int(os.environ.get("FASTMODULE_FUZZ_EXAMPLES", CI_EXAMPLES))
    # Shrinking reruns long step sequences for minutes: off in the bounded run (a failure
    # prints its whole sequence), on when asked for.
    shrink = os.environ.get("FASTMODULE_FUZZ_SHRINK", "0") == "1"
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(
        phases=phases,
        max_examples=examples,
        stateful_step_count=int(os.environ.get("FASTMODULE_FUZZ_STEPS", STEPS_PER_EXAMPLE)),
        deadline=None,
        database=None,
        derandomize="FASTMODULE_FUZZ_EXAMPLES" not in os.environ,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def main() -> None:
    """Run the machine in this process; prints the number of steps and the time."""
    # Tiny tensors: one intra-op thread (a pool on a busy machine costs ms per op).
    torch.set_num_threads(1)
    start = time.perf_counter()
    if os.environ.get("FASTMODULE_FUZZ_CHAOS") == "1":
        # Crash hunting: the cyclic GC runs every few allocations and its finalizers
        # change the running world's tree wherever that happens; nothing is compared.
        import random

        gc.set_threshold(20, 50, 1000)
        fw.CHAOS[0] = random.Random(int(os.environ.get("FASTMODULE_FUZZ_SEED", "0")))
        kinds = os.environ.get("FASTMODULE_FUZZ_CHAOS_ACTIONS")
        if kinds:
            fw.CHAOS[1] = kinds.split(",")
    else:
        # Finalizers must run at the same point in the three worlds: only when a
        # reference count drops, never when the cyclic GC happens to run (objects in
        # cycles, e.g. a pruned parameter, would be freed at a different step). The
        # GC's own timing is chaos mode's business.
        gc.disable()
    seed = os.environ.get("FASTMODULE_FUZZ_SEED")
    if seed is not None:  # a local run that can be repeated exactly
        FuzzMachine._hypothesis_internal_use_seed = int(seed)  # type: ignore[attr-defined]
    try:
        run_state_machine_as_test(FuzzMachine, settings=settings_for_run())
    finally:
        gc.enable()
        fw.restore_families()
        print(f"fuzz: {STEPS[0]} steps in {time.perf_counter() - start:.1f} s", flush=True)


def test_state_machine_in_subprocess() -> None:
    """The bounded run, in its own process: a crash fails this test, not the session."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    proc = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            "from tests import test_fuzz_state_machine as t; t.main()",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    )


if __name__ == "__main__":
    main()
