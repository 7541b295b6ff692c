"""Forward hooks dispatched natively (``fastmodule.hook_dispatch``): every behaviour of
torch's ``_call_impl`` with forward pre-hooks and forward hooks, module and global, on
stock and on fastmodule, compared. Random hook programs (hypothesis) plus the cases a
program does not reach: replaced arguments of odd types, ``torch.compiler`` state, the
handled exception inside ``always_call`` hooks, warnings and where they point."""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.modules import module as module_py

import fastmodule
from fastmodule import _core
from tests.conftest import BASES

pytestmark = pytest.mark.skipif(
    fastmodule.hook_dispatch.HOOKS is not None,
    reason=f"native hook dispatch off: {fastmodule.hook_dispatch.HOOKS}",
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
            # The fast side records whether its call is native; stock, True to compare.
            log.append(("native", native(m) if base is fastmodule.Module else True))
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
