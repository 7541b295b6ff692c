"""Where two runs diverge: each module call's output recorded in both runs (global
forward hooks), and the first call whose output differs named by the module's
qualified path and class.

Recording needs hooks, and a hook sends every module call through torch's
``_call_impl``; a difference that comes from fastmodule's module call itself may then
not show, and the result says so."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from fastmodule.tools.check.compare import Captured, capture, compare
from fastmodule.tools.check.runs import Inputs, RunResult, Snapshot, Way, run_once

__all__ = ["Divergence", "locate"]


@dataclass(frozen=True)
class Divergence:
    """The first module call whose output differs between two runs, and how.

    ``module`` is the qualified path in the model (``""``: the model itself; None
    when no module could be named, ``note`` says why), ``cls`` its class and ``call``
    which of that module's calls it is (1: the first)."""

    module: str | None
    cls: str | None
    call: int | None
    differences: list[str] = field(default_factory=list)
    note: str | None = None

    def describe(self) -> str:
        """``body.0 (Linear)``, ``the model itself (Net)``, with the call if not the first."""
        if self.module is None:
            return "no module"
        where = self.module or "the model itself"
        nth = f", its call {self.call}" if self.call and self.call > 1 else ""
        return f"{where} ({self.cls}){nth}"


@dataclass
class _Call:
    module: str
    cls: str
    nth: int
    output: Captured


@dataclass
class _Recording:
    calls: list[_Call]
    result: RunResult
    #: The innermost module call in progress when the run raised: (path, class, nth).
    raised_in: tuple[str, str, int] | None


def _names(model: torch.nn.Module) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, m in model.named_modules(remove_duplicate=False):
        names.setdefault(id(m), name)
    return names


def _record(
    model: torch.nn.Module, inputs: Inputs, snapshot: Snapshot, *, train: bool, way: Way
) -> _Recording:
    names = _names(model)
    calls: list[_Call] = []
    stack: list[torch.nn.Module] = []
    counts: Counter[int] = Counter()

    def name(module: torch.nn.Module) -> str:
        return names.get(id(module), f"<a {type(module).__qualname__} not in the model>")

    def pre(module: torch.nn.Module, args: object) -> None:
        stack.append(module)

    def post(module: torch.nn.Module, args: object, output: object) -> None:
        while stack and stack.pop() is not module:
            pass
        counts[id(module)] += 1
        calls.append(
            _Call(name(module), type(module).__qualname__, counts[id(module)], capture(output))
        )

    pre_handle = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    post_handle = torch.nn.modules.module.register_module_forward_hook(post)
    try:
        result = run_once(model, inputs, snapshot, train=train, way=way)
    finally:
        pre_handle.remove()
        post_handle.remove()
    raised_in = None
    if result.error is not None and stack:
        module = stack[-1]
        raised_in = (name(module), type(module).__qualname__, counts[id(module)] + 1)
    return _Recording(calls, result, raised_in)


def locate(
    model: torch.nn.Module,
    inputs: Inputs,
    snapshot: Snapshot,
    *,
    train: bool,
    first: tuple[str, Way],
    second: tuple[str, Way],
) -> Divergence:
    """Run the model the ``first`` and the ``second`` way (each a label and a way to
    run it) with every module call's output recorded, and name the first call where
    they differ. With ``inputs.method``, when every module call agrees but the
    method's results do not, the model itself is named (the method's own code)."""
    (label_a, way_a), (label_b, way_b) = first, second
    a = _record(model, inputs, snapshot, train=train, way=way_a)
    b = _record(model, inputs, snapshot, train=train, way=way_b)
    snapshot.restore()
    for x, y in zip(a.calls, b.calls, strict=False):
        if (x.module, x.cls, x.nth) != (y.module, y.cls, y.nth):
            return Divergence(
                x.module,
                x.cls,
                x.nth,
                [
                    f"module calls differ here: the {label_a} run's next call to return is "
                    f"{x.module or 'the model itself'} ({x.cls}), the {label_b} run's "
                    f"{y.module or 'the model itself'} ({y.cls})"
                ],
            )
        found = compare(x.output, y.output, "output", limit=5).differences
        if found:
            return Divergence(x.module, x.cls, x.nth, found)
    error_a, error_b = a.result.error, b.result.error
    errors_differ = (
        not error_a.same_as(error_b)
        if error_a is not None and error_b is not None
        else error_a is not error_b
    )
    if len(a.calls) != len(b.calls) or errors_differ:
        return _ended_apart(a, b, label_a, label_b)
    if inputs.method is not None and a.result.output is not None and b.result.output is not None:
        # The method is not a module call (no hook records it): its own code, around its
        # module calls, is where the outputs part.
        found = compare(a.result.output, b.result.output, "output", limit=5).differences
        if found:
            cls = type(model).__qualname__
            return Divergence(
                "",
                cls,
                None,
                found,
                note=f"every module call's output is the same in both runs: the difference "
                f"is in {cls}.{inputs.method}'s own code, outside its module calls",
            )
    same_result = not (
        compare(a.result.grads, b.result.grads).differences
        or compare(a.result.state_after, b.result.state_after).differences
    )
    if same_result:
        return Divergence(
            None,
            None,
            None,
            note="with every module call's output recorded the two runs agree (the "
            "recording hooks send each module call through torch's own code, so the "
            "difference is in a path they bypass): no module can be named",
        )
    return Divergence(
        None,
        None,
        None,
        note="every module call's forward output is the same in both runs; the "
        "difference is in the backward pass (grads) or the parameters and buffers after",
    )


def _ended_apart(a: _Recording, b: _Recording, label_a: str, label_b: str) -> Divergence:
    """The runs agree call by call until one raised or returned sooner."""
    for rec, other, label, other_label in ((a, b, label_a, label_b), (b, a, label_b, label_a)):
        error = rec.result.error
        if error is None:
            continue
        other_error = other.result.error
        if other_error is not None and error.same_as(other_error):
            continue
        said = (
            f"the {other_label} run raised {other_error}"
            if other_error is not None
            else f"the {other_label} run returned"
        )
        if rec.raised_in is not None:
            path, cls, nth = rec.raised_in
            return Divergence(path, cls, nth, [f"the {label} run raised {error}; {said}"])
        return Divergence(
            None,
            None,
            None,
            [f"the {label} run raised {error}; {said}"],
            note="it raised outside any module call",
        )
    if len(a.calls) == len(b.calls):
        return Divergence(None, None, None, note="the runs agree in every module call")
    longer, label = (a, label_a) if len(a.calls) > len(b.calls) else (b, label_b)
    extra = longer.calls[min(len(a.calls), len(b.calls))]
    return Divergence(
        extra.module,
        extra.cls,
        extra.nth,
        [f"only the {label} run calls {extra.module or 'the model itself'} ({extra.cls}) here"],
    )
