"""Forward hooks dispatched natively (``fastmodule._verified.hook_dispatch``): every behaviour of
torch's ``_call_impl`` with forward pre-hooks and forward hooks, module and global, on
stock and on fastmodule, compared. Random hook programs (hypothesis) plus the cases a
program does not reach: replaced arguments of odd types, ``torch.compiler`` state, the
handled exception inside ``always_call`` hooks, warnings and where they point. Random
layer programs: torch's layers run natively, with hooks that change their attributes
during the call, under process-wide patches of torch (tests/fuzz_patches.py: a layer
forward's or functional's code replaced, a Tensor method or torch global wrapped,
``warnings.warn`` wrapped), each patched call counted."""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as module_py

import fastmodule
from fastmodule import _core
from tests import fuzz_patches as fp
from tests import fuzz_world as fw
from tests.conftest import BASES, NATIVE

# (Where no native path is on at all, the comparisons run: both sides run torch's code.)
pytestmark = pytest.mark.skipif(
    NATIVE and fastmodule._verified.hook_dispatch.HOOKS is not None,
    reason=f"native hook dispatch off: {fastmodule._verified.hook_dispatch.HOOKS}",
)


class Boom(Exception):
    """Raised by a hook or forward on purpose."""


class Stop(BaseException):
    """Not an ``Exception``: ``_call_impl``'s ``except Exception`` lets it through."""


def make(base: type[nn.Module], log: list[Any], fail: str | None = None) -> nn.Module:
    class M(base):  # type: ignore[misc, valid-type]
        def forward(self, x: Any, scale: Any = 1) -> Any:
            log.append(("forward", x, scale))
            if fail == "exception":
                raise Boom("forward failed")
            if fail == "base":
                raise Stop("forward stopped")
            return x * scale + 1

    return M()


def run(scenario: Callable[[type[nn.Module], list[Any]], Any]) -> list[Any]:
    """``scenario`` on stock and on fastmodule: each side's log, outcome (value, or
    exception type, text and context type) and warnings (category, text, file, line)."""
    sides = []
    for base in BASES:
        log: list[Any] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out: Any = ("ok", scenario(base, log))
            except BaseException as e:  # noqa: BLE001 - the exception is the result
                ctx = e.__context__
                out = ("raised", type(e), str(e), type(ctx), str(ctx))
        seen = [(w.category, str(w.message), w.filename, w.lineno) for w in caught]
        sides.append((log, out, seen))
    return sides


def assert_same(scenario: Callable[[type[nn.Module], list[Any]], Any]) -> list[Any]:
    stock, fast = run(scenario)
    assert fast == stock
    return stock


def native(m: nn.Module) -> bool:
    """Does a call of ``m`` take the native path now (hooks included)?"""
    return _core.call_handover(m) is None


# --- random hook programs ----------------------------------------------------------

KINDS = ("pre", "pre_kwargs", "post", "post_kwargs", "global_pre", "global_post")
ACTIONS = (
    "none",
    "replace",
    "replace_single",
    "raise",
    "raise_base",
    "add_pre",
    "add_post",
    "remove_self",
    "remove_next",
    "bad_return",
    "call_self",
)

hook_spec = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from(ACTIONS),
    st.booleans(),  # prepend
    st.booleans(),  # always_call (forward hooks)
)


def program(
    specs: list[tuple[str, str, bool, bool]], fail: str | None, kwargs: bool
) -> Callable[[type[nn.Module], list[Any]], Any]:
    def scenario(base: type[nn.Module], log: list[Any]) -> Any:
        m = make(base, log, fail)
        handles: list[Any] = []
        depth = [0]

        def register(i: int, kind: str, action: str, prepend: bool, always: bool) -> Any:
            def hook(mod: nn.Module, *a: Any) -> Any:
                log.append((i, kind, action, a))
                if action == "replace":
                    if kind == "pre_kwargs":
                        return ((a[0][0] + 100,), {**a[1], "scale": 3})
                    if kind in ("pre", "global_pre"):
                        return (a[0][0] + 10,)
                    return a[-1] * 2
                if action == "replace_single" and kind in ("pre", "global_pre"):
                    return a[0][0] + 1000
                if action == "raise":
                    raise Boom(f"hook {i} failed")
                if action == "raise_base":
                    raise Stop(f"hook {i} stopped")
                if action == "add_pre":
                    handles.append(
                        mod.register_forward_pre_hook(lambda *b: log.append(("late pre",)))
                    )
                if action == "add_post":
                    handles.append(mod.register_forward_hook(lambda *b: log.append(("late post",))))
                if action == "remove_self":
                    handles[i].remove()
                if action == "remove_next" and i + 1 < len(handles):
                    handles[i + 1].remove()
                if action == "bad_return" and kind == "pre_kwargs":
                    return 5
                if action == "call_self" and depth[0] == 0:
                    depth[0] += 1
                    try:
                        log.append(("inner call", outcome_of(lambda: mod(7))))
                    finally:
                        depth[0] -= 1
                return None

            if kind == "pre":
                return m.register_forward_pre_hook(hook, prepend=prepend)
            if kind == "pre_kwargs":
                return m.register_forward_pre_hook(hook, prepend=prepend, with_kwargs=True)
            if kind == "post":
                return m.register_forward_hook(hook, prepend=prepend, always_call=always)
            if kind == "post_kwargs":
                return m.register_forward_hook(
                    hook, prepend=prepend, with_kwargs=True, always_call=always
                )
            if kind == "global_pre":
                return module_py.register_module_forward_pre_hook(hook)
            return module_py.register_module_forward_hook(hook, always_call=always)

        try:
            for i, (kind, action, prepend, always) in enumerate(specs):
                handles.append(register(i, kind, action, prepend, always))
            # The fast side records whether its call is native; stock, True to compare
            # (and both where no native path is on).
            fast = base is fastmodule.Module and NATIVE
            log.append(("native", native(m) if fast else True))
            first = outcome_of(lambda: m(1, scale=2) if kwargs else m(1))
            second = outcome_of(lambda: m(2))
            return first, second
        finally:
            for h in handles:
                h.remove()

    return scenario


def outcome_of(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return ("raised", type(e), str(e), type(e.__context__))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(hook_spec, min_size=1, max_size=6),
    fail=st.sampled_from([None, None, "exception", "base"]),
    kwargs=st.booleans(),
)
def test_random_hook_programs_match_stock(
    specs: list[tuple[str, str, bool, bool]], fail: str | None, kwargs: bool
) -> None:
    assert_same(program(specs, fail, kwargs))


# --- random layer programs: hooks that change torch's layers, torch patched ----------------

# Each kind's stock class and arguments (three features); the fast side mixes
# fastmodule.Module in, as the state machine's worlds do, so its calls and forwards
# take the native paths. Kinds and attribute changes are the state machine's
# (fuzz_world.LAYER_CHANGES).
LAYER_KINDS: dict[str, tuple[type[nn.Module], tuple[Any, ...]]] = {
    "Lin": (nn.Linear, (3, 2)),
    "Relu": (nn.ReLU, ()),
    "Seq": (nn.Sequential, ()),
    "LN": (nn.LayerNorm, (3,)),
    "Softmax": (nn.Softmax, (1,)),
    "Drop": (nn.Dropout, (0.0,)),
    "BN": (nn.BatchNorm1d, (3,)),
    "GELU": (nn.GELU, ()),
    "Conv": (nn.Conv1d, (3, 3, 1)),
}
# The layers' own shape first; then ranks and sizes some refuse or hand over to torch.
LAYER_INPUTS = [(2, 3), (2, 3, 4), (3,), (1, 3), (3, 4)]
# "set_attr": a pre-hook changes an attribute of the layer and an always_call forward
# hook puts it back; "set_attr_keep" leaves it changed; "replace_input" doubles the
# input; "raise_pre" and "always_raise" fail (after a failed call torch warns about
# the always_call hook's error); "patch_during" patches torch (fuzz_patches.DURING_CALL)
# for the rest of the call; the global ones are process-wide hooks.
LAYER_HOOK_KINDS = (
    "patch_during",
    "set_attr",
    "set_attr_keep",
    "replace_input",
    "raise_pre",
    "always_raise",
    "always_log",
    "global_set_attr",
    "global_always_raise",
)
# The patches that reach a layer call: every code swap of a layer, container or
# functional function, of the call and attribute paths; Tensor methods; torch globals.
LAYER_PATCHES = fp.DURING_CALL
# Patches switched off while a known defect keeps failing them ("patch name or its
# leading part": "the failing test"), as the state machine's KNOWN. Empty: every patch
# is on.
LAYER_PATCHES_OFF: dict[str, str] = {
    # Not torch's code: no _call_impl frames for F.softmax's stacklevel=5 warning
    # (README, Known differences: frames of a forward; repro known_23).
    "wrap:Softmax.forward": "README Known differences (frames), repro known_23",
}


def switched_off(patch: str) -> bool:
    return any(patch.startswith(k) for k in LAYER_PATCHES_OFF)


_FAST_LAYERS: dict[type, type] = {}


def layer_class(base: type[nn.Module], cls: type[nn.Module]) -> type[nn.Module]:
    if base is not fastmodule.Module:
        return cls
    if cls not in _FAST_LAYERS:
        _FAST_LAYERS[cls] = type(cls.__name__, (fastmodule.Module, cls), {})
    return _FAST_LAYERS[cls]


def make_layer(base: type[nn.Module], kind: str) -> nn.Module:
    cls, args = LAYER_KINDS[kind]
    if kind == "Seq":
        lin, relu = layer_class(base, nn.Linear)(3, 3), layer_class(base, nn.ReLU)()
        return layer_class(base, nn.Sequential)(lin, relu)
    return layer_class(base, cls)(*args)


def layer_outcome(fn: Callable[[], Any]) -> Any:
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return ("raised", type(e), str(e), type(e.__context__))
    if isinstance(r, torch.Tensor):
        return ("ok", ["nan" if v != v else v for v in r.detach().flatten().tolist()], r.shape)
    return ("ok", r)


def layer_program(
    kind: str, hooks: list[tuple[str, int, bool]], patches: list[str]
) -> Callable[[type[nn.Module], list[Any]], Any]:
    def scenario(base: type[nn.Module], log: list[Any]) -> Any:
        # The CPU generator itself (torch.manual_seed records a traceback per device
        # kind that is not initialised: milliseconds).
        torch.default_generator.manual_seed(0)
        m = make_layer(base, kind)
        handles: list[Any] = []
        undo: list[Callable[[], None]] = []

        def register(i: int, how: str, change: int, prepend: bool) -> None:
            attr, value = fw.layer_change(kind, change)
            pool = fp.FOCUS if change % 2 else fp.DURING_CALL
            during = pool[change // 2 % len(pool)]
            if switched_off(during):
                during = "defaults:F.relu"
            saved: list[Any] = []

            def pre(mod: nn.Module, args: Any) -> Any:
                if mod is not m:  # a global hook, called for Seq's children too
                    return None
                log.append((i, how, "pre"))
                if how == "raise_pre":
                    raise Boom(f"pre-hook {i} failed")
                if how == "replace_input":
                    return (args[0] * 2,)
                if "set_attr" in how:
                    child = layer_class(base, nn.ReLU)
                    saved.append(fw.change_layer(mod, attr, value, child))
                if how == "patch_during":
                    saved.append(fp.push(during))
                return None

            def post(mod: nn.Module, args: Any, out: Any) -> Any:
                if mod is not m:
                    return None
                log.append((i, how, "post"))
                if how.endswith("always_raise"):
                    raise ValueError(f"always_call hook {i} failed")
                if how.endswith("set_attr") and saved:
                    fw.undo_layer_change(mod, attr, saved.pop())
                if how == "patch_during" and saved:
                    fp.pop(saved.pop())
                return None

            if how.startswith("global"):
                handles.append(module_py.register_module_forward_pre_hook(pre))
                handles.append(module_py.register_module_forward_hook(post, always_call=True))
            elif how in ("set_attr_keep", "replace_input", "raise_pre"):
                handles.append(m.register_forward_pre_hook(pre, prepend=prepend))
            else:
                handles.append(m.register_forward_pre_hook(pre, prepend=prepend))
                handles.append(m.register_forward_hook(post, prepend=prepend, always_call=True))

        fp.SINK[0] = log
        try:
            for p in patches:
                undo.append(fp.apply(p))
            for i, (how, change, prepend) in enumerate(hooks):
                register(i, how, change, prepend)
            torch.default_generator.manual_seed(1)
            out = []
            for shape in LAYER_INPUTS:
                n = 1
                for d in shape:
                    n *= d
                for _ in range(2):  # the second call may reuse what the first decided
                    x = (torch.arange(float(n)) / 4 - 1).reshape(shape)
                    out.append(layer_outcome(lambda x=x: m(x)))
            return out
        finally:
            fp.SINK[0] = None
            fp.unwind()
            for h in handles:
                h.remove()
            for u in reversed(undo):
                u()

    return scenario


# What each kind's call rests on (patch names containing one of these words).
KIND_WORDS = {
    "Lin": ("Linear", "F.linear", "linear.F"),
    "Relu": ("ReLU", "F.relu", "activation.F"),
    "Seq": ("Sequential", "Linear", "ReLU", "container."),
    "LN": ("LayerNorm", "F.layer_norm", "normalization.F", "F.torch"),
    "Softmax": ("Softmax", "F.softmax", "F._get_softmax_dim", "activation.F", "tensor:softmax"),
    "Drop": ("Dropout", "F.dropout", "dropout.F", "F._VF", "F.has_torch_function_unary"),
    "BN": ("BatchNorm", "F.batch_norm", "F._verify_batch_size", "batchnorm.", "tensor:", "F.len"),
    "GELU": ("GELU", "F.gelu", "activation.F"),
    "Conv": ("Conv1d", "F.conv1d", "conv.F"),
}
KIND_PATCHES = {
    kind: [p for p in LAYER_PATCHES if any(w in p for w in words)]
    for kind, words in KIND_WORDS.items()
}


@st.composite
def layer_patches(draw: Any, kind: str) -> list[str]:
    """Up to three patches: what the kind rests on, what layer calls rest on most
    (fuzz_patches.FOCUS), or any."""
    pools = [KIND_PATCHES[kind], fp.FOCUS, LAYER_PATCHES]
    one = st.one_of(*(st.sampled_from(p) for p in pools))
    return draw(st.lists(one, max_size=3, unique_by=fp.target))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind_patches=st.sampled_from(list(LAYER_KINDS)).flatmap(
        lambda kind: st.tuples(st.just(kind), layer_patches(kind))
    ),
    hooks=st.lists(
        st.tuples(st.sampled_from(LAYER_HOOK_KINDS), st.integers(0, 255), st.booleans()),
        max_size=4,
    ),
)
# The reproducers of issue 31 (repros 29-32), every run: a layer forward's code replaced;
# warnings.warn wrapped while an always_call hook fails after a failed call; Tensor.dim
# wrapped while BatchNorm1d takes a 3-d input (BatchNorm2d a wrong rank); a pre-hook
# setting Softmax.dim to None (the warning's file and line are compared).
@example(kind_patches=("Lin", ["code:Linear.forward:plus"]), hooks=[])
@example(kind_patches=("Relu", ["code:ReLU.forward:count"]), hooks=[])
@example(kind_patches=("Seq", ["code:Sequential.forward:plus"]), hooks=[])
@example(
    kind_patches=("Lin", ["global:warnings.warn"]),
    hooks=[("raise_pre", 0, False), ("always_raise", 0, False)],
)
@example(kind_patches=("BN", ["tensor:dim"]), hooks=[])
@example(kind_patches=("Softmax", []), hooks=[("set_attr", 0, False)])
def test_random_layer_programs_match_stock(
    kind_patches: tuple[str, list[str]], hooks: list[tuple[str, int, bool]]
) -> None:
    kind, patches = kind_patches
    patches = [p for p in patches if not switched_off(p)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a busy thread pool costs milliseconds per op
    try:
        assert_same(layer_program(kind, hooks, patches))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.requires_native("hooked calls take the native call path (_core.call_handover)")
def test_hooked_calls_are_native() -> None:
    log: list[Any] = []
    m = make(fastmodule.Module, log)
    m.register_forward_pre_hook(lambda *a: None)
    m.register_forward_hook(lambda *a: None, with_kwargs=True, always_call=True)
    h = module_py.register_module_forward_hook(lambda *a: None)
    try:
        assert native(m)
        assert m(3) == 4
    finally:
        h.remove()


# --- what a random program does not reach --------------------------------------------


def test_pre_hook_replacing_args_with_a_tuple_subclass_and_a_list() -> None:
    class Args(tuple):
        pass

    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m.register_forward_pre_hook(lambda mod, a: Args((a[0] + 1,)))
        m.register_forward_pre_hook(lambda mod, a, k: ([a[0] * 3], dict(k)), with_kwargs=True)
        m.register_forward_hook(lambda mod, a, o: log.append((type(a), a)))
        return m(2)

    assert_same(sc)


def test_kwargs_replaced_with_a_mapping_and_with_bad_values() -> None:
    class Mapping:
        def keys(self) -> list[str]:
            return ["scale"]

        def __getitem__(self, k: str) -> int:
            return 5

    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m.register_forward_pre_hook(lambda mod, a, k: (a, Mapping()), with_kwargs=True)
        first = outcome_of(lambda: m(2))
        m2 = make(b, log)
        m2.register_forward_pre_hook(lambda mod, a, k: (5, k), with_kwargs=True)
        m3 = make(b, log)
        m3.register_forward_pre_hook(lambda mod, a, k: (a, {1: 2}), with_kwargs=True)
        m4 = make(b, log)
        m4.register_forward_pre_hook(lambda mod, a, k: (a, k, 3), with_kwargs=True)
        return (
            first,
            outcome_of(lambda: m2(2)),
            outcome_of(lambda: m3(2)),
            outcome_of(lambda: m4(2)),
        )

    assert_same(sc)


def test_pair_subclass_with_its_own_iteration() -> None:
    class Pair(tuple):
        def __iter__(self) -> Any:
            yield (9,)
            yield {"scale": 4}

    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        m.register_forward_pre_hook(lambda mod, a, k: Pair((a, k)), with_kwargs=True)
        return m(2)

    assert_same(sc)


def test_forward_read_before_the_hooks_run() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)

        def swap(mod: nn.Module, a: Any) -> None:
            mod.forward = lambda x: ("replaced", x)

        m.register_forward_pre_hook(swap)
        return m(1), m(2)

    assert_same(sc)


def test_hook_registries_rebound_and_mutated_during_the_call() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)

        def rebind(mod: nn.Module, a: Any) -> None:
            mod._forward_hooks = OrderedDict({1: lambda *x: log.append("new registry")})
            mod._forward_pre_hooks.clear()

        m.register_forward_pre_hook(rebind)
        m.register_forward_pre_hook(lambda *a: log.append("second pre still runs"))
        return m(1), m(2)

    assert_same(sc)


def test_global_registry_rebound_during_the_call() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        saved = module_py._global_forward_hooks

        def rebind(mod: nn.Module, a: Any) -> None:
            module_py._global_forward_hooks = OrderedDict({7: lambda *x: log.append("global new")})

        h = m.register_forward_pre_hook(rebind)
        try:
            return m(1)
        finally:
            module_py._global_forward_hooks = saved
            h.remove()

    assert_same(sc)


def test_always_call_hooks_see_the_handled_exception() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="exception")

        def always(mod: nn.Module, a: Any, o: Any) -> None:
            exc = sys.exception() if hasattr(sys, "exception") else sys.exc_info()[1]
            log.append(("handling", type(exc), str(exc), o))

        def always_raises_base(mod: nn.Module, a: Any, o: Any) -> None:
            raise Stop("in always hook")

        m.register_forward_hook(always, always_call=True)
        first = outcome_of(lambda: m(1))
        m.register_forward_hook(always_raises_base, always_call=True)
        try:
            m(1)
        except Stop as e:
            return first, type(e.__context__), str(e.__context__)
        return first

    assert_same(sc)


def test_silenced_hook_exception_warns_at_torchs_line() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="exception")

        def bad(*a: Any) -> None:
            raise ValueError("always hook failed")

        m.register_forward_hook(bad, always_call=True)
        h = module_py.register_module_forward_hook(bad, always_call=True)
        try:
            return outcome_of(lambda: m(1))
        finally:
            h.remove()

    log, out, seen = assert_same(sc)
    assert len(seen) == 2 and seen[0][2] == module_py.__file__


def test_silenced_warning_as_error() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="exception")
        m.register_forward_hook(lambda *a: 1 / 0, always_call=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return outcome_of(lambda: m(1))

    assert_same(sc)


def test_keyboard_interrupt_style_exceptions_skip_always_call_hooks() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="base")
        m.register_forward_hook(lambda *a: log.append("always"), always_call=True)
        try:
            m(1)
        except Stop:
            return "stopped"

    assert_same(sc)


def test_is_compiling_flag_skips_always_call_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="exception")
        m.register_forward_hook(lambda *a: log.append("always"), always_call=True)
        monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
        try:
            return outcome_of(lambda: m(1))
        finally:
            monkeypatch.undo()

    log, _, _ = assert_same(sc)
    assert "always" not in log


def test_patched_is_compiling_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log, fail="exception")
        m.register_forward_hook(lambda *a: log.append("always"), always_call=True)

        def is_compiling() -> bool:
            log.append("is_compiling asked")
            return True

        monkeypatch.setattr(torch.compiler, "is_compiling", is_compiling)
        try:
            first = outcome_of(lambda: m(1))
        finally:
            monkeypatch.undo()

        def broken() -> bool:
            raise Boom("is_compiling failed")

        monkeypatch.setattr(torch.compiler, "is_compiling", broken)
        try:
            return first, outcome_of(lambda: m(1))
        finally:
            monkeypatch.undo()

    log, _, _ = assert_same(sc)
    assert log.count("is_compiling asked") == 1


def test_membership_in_with_kwargs_and_always_called_is_live() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)
        h1 = m.register_forward_hook(lambda *a: log.append(("h1", len(a))))

        def flip(mod: nn.Module, a: Any, o: Any) -> None:
            mod._forward_hooks_with_kwargs[h1.id] = True

        m.register_forward_hook(flip, prepend=True)
        return m(1), m(2)

    assert_same(sc)


def test_tensors_and_grad_through_hooks() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        torch.manual_seed(0)

        class Net(b):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(3, 2)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.lin(x).relu()

        m = Net()
        m.lin.register_forward_pre_hook(lambda mod, a: (a[0] * 2,))
        m.register_forward_hook(lambda mod, a, o: o + 1)
        x = torch.ones(4, 3, requires_grad=True)
        y = m(x).sum()
        y.backward()
        return y.item(), x.grad.tolist()

    assert_same(sc)


def test_hooks_on_torch_layers_and_containers() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        torch.manual_seed(0)
        seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1))
        if b is fastmodule.Module:
            fastmodule.accelerate(seq)
        try:
            h = module_py.register_module_forward_hook(
                lambda mod, a, o: log.append((type(mod).__name__, tuple(o.shape)))
            )
            try:
                return seq(torch.ones(2, 3)).tolist()
            finally:
                h.remove()
        finally:
            if b is fastmodule.Module:
                fastmodule.restore(seq)

    assert_same(sc)


def test_refcounts_flat_over_hooked_calls() -> None:
    log: list[Any] = []
    m = make(fastmodule.Module, log)
    x = 5

    def pre(mod: nn.Module, a: Any, k: Any) -> Any:
        return a, k

    def post(mod: nn.Module, a: Any, o: Any) -> Any:
        return o

    def fails(*a: Any) -> None:
        raise ValueError("x")

    m.register_forward_pre_hook(pre, with_kwargs=True)
    m.register_forward_hook(post, always_call=True)
    for _ in range(10):
        m(x)
    log.clear()
    before = [sys.getrefcount(o) for o in (m, pre, post, fails)]
    for _ in range(2000):
        m(x, scale=3)
    log.clear()
    h = m.register_forward_hook(fails, always_call=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(500):
            with pytest.raises(ValueError):
                m(x)
    h.remove()
    log.clear()
    after = [sys.getrefcount(o) for o in (m, pre, post, fails)]
    assert after == before


def test_class_changed_by_a_hook_reads_the_new_class() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        m = make(b, log)

        class Other(type(m)):  # type: ignore[misc]
            @property
            def _forward_hooks(self) -> Any:
                # Logged: torch reads it twice (the test, then the snapshot).
                log.append("read the new class's registry")
                return OrderedDict({1: lambda *a: log.append("the new class's registry")})

        def switch(mod: nn.Module, a: Any) -> None:
            mod.__class__ = Other

        m.register_forward_pre_hook(switch)
        m.register_forward_hook(lambda *a: log.append("the old registry"))
        return m(1)

    assert_same(sc)


def test_registry_property_is_read_as_often_as_torch_reads_it() -> None:
    def sc(b: type[nn.Module], log: list[Any]) -> Any:
        class Counted(b):  # type: ignore[misc, valid-type]
            def forward(self, x: Any) -> Any:
                return x

            @property
            def _forward_hooks(self) -> Any:
                log.append("read _forward_hooks")
                return self.__dict__["_registry"]

            @_forward_hooks.setter
            def _forward_hooks(self, value: Any) -> None:
                self.__dict__["_registry"] = value

        m = Counted()
        m.register_forward_pre_hook(lambda *a: log.append("pre"))
        m._forward_hooks[1] = lambda *a: log.append("post")
        log.clear()
        return m(1)

    assert_same(sc)
