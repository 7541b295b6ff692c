"""``fastmodule.check``: identical models pass, a model made to differ fails with where
(and the first module whose output differs), a nondeterministic model is reported as
such; the model is left as it was. Whatever models return is compared (HF outputs with
caches, distributions, namespaces, NaNs); lazy modules, rebound buffers, models that
raise, quick-start models, the grad mode, threads and noisy timings (issue 29)."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule.tools.check import CheckError, check
from fastmodule.tools.check.compare import capture, compare, differences
from fastmodule.tools.check.report import (
    EXIT_DIFFERENT,
    EXIT_NONDETERMINISTIC,
    EXIT_OK,
    CheckReport,
)
from fastmodule.tools.check.timing import Timing, Timings
from tests import check_models
from tests.check_models import DIFFERS_WHEN_ACCELERATED


def _state(model: nn.Module) -> dict[str, object]:
    return {
        "values": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": {k: p.grad for k, p in model.named_parameters()},
        "training": [m.training for m in model.modules()],
        "accelerated": [fastmodule.is_accelerated(m) for m in model.modules()],
        "rng": torch.random.get_rng_state(),
    }


def _same_state(a: dict[str, object], b: dict[str, object]) -> bool:
    va, vb = a["values"], b["values"]
    assert isinstance(va, dict) and isinstance(vb, dict)
    return (
        list(va) == list(vb)
        and all(torch.equal(va[k], vb[k]) for k in va)
        and a["grads"] == b["grads"]
        and a["training"] == b["training"]
        and a["accelerated"] == b["accelerated"]
        and torch.equal(a["rng"], b["rng"])  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_identical_model(train: bool) -> None:
    model, (x,) = check_models.small()
    before = _state(model)
    report = check(model, x, train=train, timing=False, progress=False)
    assert report.parity.identical and not report.parity.nondeterministic
    assert report.exit_status == EXIT_OK
    assert ("grads: 6" in report.parity.compared) == train
    assert "identical" in report.format()
    assert _same_state(before, _state(model))


def test_train_step_updates_running_statistics_alike() -> None:
    # In training mode BatchNorm's running statistics change in each run; every run
    # starts from the same values, so stock and accelerated still agree.
    model, (x,) = check_models.small()
    report = check(model, x, train=True, timing=False, progress=False)
    assert report.parity.identical
    assert torch.equal(model.body[2].running_mean, torch.zeros(16))


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_difference_is_reported_with_where() -> None:
    model, (x,) = check_models.differs()
    report = check(model, x, timing=False, progress=False)
    assert not report.parity.identical and not report.parity.nondeterministic
    assert report.exit_status == EXIT_DIFFERENT
    assert report.parity.differences == ["output: 8 of 8 values differ (max abs difference 1)"]
    assert "DIFFERENT from stock" in report.format()
    # The model itself is where it diverges (its children agree).
    d = report.parity.diverged
    assert d is not None and (d.module, d.cls, d.call) == ("", "Differs", 1)
    assert "diverges at  the model itself (Differs)" in report.format()


def test_nondeterministic_model_is_not_a_fastmodule_difference() -> None:
    model, x = check_models.nondeterministic()
    report = check(model, x, timing=False, progress=False)
    assert report.parity.nondeterministic and not report.parity.identical
    assert report.exit_status == EXIT_NONDETERMINISTIC
    assert report.parity.differences == []
    assert report.parity.stock_differences
    assert "nondeterministic" in report.format()
    d = report.parity.diverged  # between the two stock runs
    assert d is not None and d.module == "" and d.cls == "Nondeterministic"


def test_keyword_inputs_and_dict_outputs() -> None:
    model, kwargs = check_models.keywords()
    report = check(model, timing=False, progress=False, **kwargs)
    assert report.parity.identical
    assert report.inputs == "x=4x8 float32, scale=float"


def test_accelerated_classes_stay_accelerated() -> None:
    model, (x,) = check_models.small()
    fastmodule.accelerate(model)
    try:
        before = _state(model)
        report = check(model, x, timing=False, progress=False)
        assert report.parity.identical
        assert _same_state(before, _state(model))
    finally:
        fastmodule.restore(model)


def test_quick_start_models_are_compared_with_themselves_run_stock() -> None:
    # fastmodule.Module subclasses have no stock class: the stock runs are inside
    # fastmodule.disabled().
    from fastmodule import switch

    model, x = check_models.quick_start()
    seen: set[bool] = set()
    model.register_forward_hook(lambda *a: seen.add(switch.is_disabled()))
    before = _state(model)
    report = check(model, x, timing=False, progress=False)
    assert report.parity.identical, report.format()
    assert _same_state(before, _state(model))
    assert seen == {True, False}  # stock runs inside disabled(), accelerated ones not


def test_quick_start_models_without_the_switch_are_refused_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(fastmodule, "disabled", raising=False)
    model, x = check_models.quick_start()
    with pytest.raises(CheckError, match="QuickStart.*fastmodule.disabled()"):
        check(model, x, timing=False, progress=False)


def test_not_a_module() -> None:
    with pytest.raises(TypeError, match="expects a torch.nn.Module"):
        check(object(), timing=False, progress=False)  # type: ignore[arg-type]


def test_timings_without_compile() -> None:
    model, (x,) = check_models.small()
    report = check(model, x, repeats=2, compile=False, progress=False)
    t = report.timings
    assert t is not None and t.repeats == 2 and t.compiled is None
    assert t.stock.min <= t.stock.median <= t.stock.max
    assert t.fast.min <= t.fast.median <= t.fast.max
    assert t.speedup > 0
    assert "--no-compile" in (t.compile_note or "")


# What models return (issue 29, item 1): compared by type, then field by field.


HF_MODELS = [
    pytest.param("gpt2", "transformers", id="gpt2"),
    pytest.param("llama", "transformers", id="llama"),
    pytest.param("lora", "peft", id="lora"),
]


@pytest.mark.parametrize(("factory", "package"), HF_MODELS)
def test_hf_models_in_their_default_configuration_are_identical(factory: str, package: str) -> None:
    # Their outputs hold a DynamicCache (an object with a __dict__, compared field by
    # field, not with ==, which is identity).
    pytest.importorskip(package)
    model, kwargs = getattr(check_models, factory)()
    report = check(model, timing=False, progress=False, **kwargs)
    assert report.parity.identical and report.exit_status == EXIT_OK, report.format()
    assert report.parity.not_compared == []
    # logits and the cache's keys and values, 2 layers.
    assert "output: 5 tensor(s)" in report.parity.compared


@pytest.mark.parametrize(
    "factory", ["distribution", "namespace", "nan_output"], ids=["normal", "namespace", "nan"]
)
def test_objects_and_nans_are_compared_by_value(factory: str) -> None:
    model, x = getattr(check_models, factory)()
    report = check(model, x, timing=False, progress=False)
    assert report.parity.identical and not report.parity.nondeterministic, report.format()


class _Slots:
    __slots__ = ("a", "__b")

    def __init__(self, a: object) -> None:
        self.a = a


class _NoFields:
    __slots__ = ()


def test_compare_field_by_field_with_paths() -> None:
    import types

    from transformers import DynamicCache

    def cache(value: float) -> DynamicCache:
        c = DynamicCache()
        c.update(torch.full((1, 1, 2, 4), value), torch.zeros(1, 1, 2, 4), 0)
        return c

    assert differences({"cache": cache(1.0)}, {"cache": cache(1.0)}) == []
    assert differences({"cache": cache(1.0)}, {"cache": cache(2.0)}) == [
        "output['cache'].layers[0].keys: 8 of 8 values differ (max abs difference 1)"
    ]
    # A namedtuple's fields by name; a Python nan equals nan, -0.0 differs from 0.0.
    point = collections.namedtuple("point", "x y")
    assert differences(point(float("nan"), 1), point(float("nan"), 1)) == []
    assert differences(point(0.0, 1), point(-0.0, 1)) == ["output.x: 0.0 != -0.0"]
    # Types first, then fields; __slots__ (set or not) like a __dict__.
    assert differences(types.SimpleNamespace(a=1), {"a": 1}) == [
        "output: types.SimpleNamespace != dict"
    ]
    assert differences(_Slots(1), _Slots(1)) == []
    assert differences(_Slots(1), _Slots(2)) == ["output.a: 1 != 2"]
    # Cycles and shared objects: references to where the object was first met.
    a, b = types.SimpleNamespace(t=torch.ones(2)), types.SimpleNamespace(t=torch.ones(2))
    a.me, b.me = a, b
    assert differences(a, b) == []
    shared = [1]
    assert differences([shared, shared], [[1], [1]]) == [
        "output[1]: the object at output[0] != list"
    ]
    # An object with no fields and no value ==: equal to itself, else not compared.
    one = torch.Generator()
    assert compare([one], [one]).not_compared == []
    found = compare([torch.Generator()], [torch.Generator()])
    assert found.differences == []
    assert found.not_compared == [
        "output[0]: a torch._C.Generator (no fields, no value ==), a different object in each run"
    ]
    # Empty __slots__: no fields, so equal.
    assert differences(_NoFields(), _NoFields()) == []
    # Tensors bitwise, NaNs with the same payload equal.
    nan = torch.tensor([float("nan"), 1.0])
    assert differences(nan, nan.clone()) == []
    assert differences(torch.zeros(1), -torch.zeros(1)) == [
        "output: 1 of 1 values differ (max abs difference 0)"
    ]


def test_a_capture_is_a_copy() -> None:
    out = {"x": torch.zeros(2), "items": [1]}
    kept = capture(out)
    out["x"].add_(1)
    out["items"].append(2)
    assert differences(kept, {"x": torch.zeros(2), "items": [1]}) == []


def test_lazy_modules_are_materialised_by_a_first_stock_run() -> None:
    model, x = check_models.lazy()
    rng = torch.random.get_rng_state()
    report = check(model, x, timing=False, progress=False)
    assert report.parity.identical, report.format()
    assert any("LazyLinear" in n and "materialised" in n for n in report.notes)
    assert type(model[0]) is nn.Linear and model[0].weight.shape == (3, 5)
    assert torch.equal(torch.random.get_rng_state(), rng)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_rebound_buffers_are_restored_by_rebinding(train: bool) -> None:
    model, x = check_models.rebinds_buffer()
    history = model.history
    report = check(model, x, train=train, timing=False, progress=False)
    assert report.parity.identical, report.format()
    assert model.history is history and model.history.shape == (0,)


def test_a_model_that_rejects_the_inputs_is_not_compared() -> None:
    model, x = check_models.rejects()
    with pytest.raises(CheckError, match="mat1 and mat2 shapes cannot be multiplied") as info:
        check(model, x, timing=False, progress=False)
    assert info.value.run == "first stock run"
    assert info.value.error is not None and info.value.error.type == "RuntimeError"


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_raising_only_when_accelerated_is_a_difference() -> None:
    model, x = check_models.raises_accelerated()
    report = check(model, x, progress=False)  # not timed: a run raised
    assert report.exit_status == EXIT_DIFFERENT and report.timings is None
    [found] = report.parity.differences
    assert found.startswith("output: the stock run returned; the accelerated run raised ")
    assert "ValueError: only when accelerated (at " in found
    d = report.parity.diverged
    assert d is not None and (d.module, d.cls) == ("1.1", "RaisesAccelerated")
    assert "not timed: a run raised" in report.format()


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_raising_differently_is_a_difference_with_both_errors() -> None:
    model, x = check_models.raises_differently()
    report = check(model, x, timing=False, progress=False)
    assert report.exit_status == EXIT_DIFFERENT
    [found] = report.parity.differences
    assert "the stock run raised ValueError: stock" in found
    assert "the accelerated run raised ValueError: accelerated" in found


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_where_it_diverges_names_the_first_module() -> None:
    model, x = check_models.shift()
    report = check(model, x, timing=False, progress=False)
    d = report.parity.diverged
    assert d is not None and (d.module, d.cls, d.call) == ("1.1", "Shift", 1)
    assert d.differences == ["output: 8 of 8 values differ (max abs difference 1)"]
    assert "diverges at  1.1 (Shift): the first module whose output differs" in str(report)


class GradModes(nn.Module):
    """Records the grad mode of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.seen: set[bool] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add(torch.is_grad_enabled())
        return self.proj(x)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
def test_parity_and_timing_run_in_the_same_grad_mode(train: bool) -> None:
    model = GradModes()
    report = check(model, torch.ones(2, 4), train=train, repeats=1, compile=False, progress=False)
    assert model.seen == {train}
    assert report.mode.startswith("train step" if train else "forward under torch.no_grad()")


def test_threads_are_set_for_the_check_only() -> None:
    model, (x,) = check_models.small()
    before = torch.get_num_threads()
    report = check(model, x, timing=False, progress=False, threads=1)
    assert report.threads == 1 and torch.get_num_threads() == before
    assert "1 thread," in str(report)


def test_bad_arguments() -> None:
    model, (x,) = check_models.small()
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        check(model, x, repeats=-3, progress=False)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        check(model, x, threads=0, progress=False)


def test_interrupted_check_leaves_the_model_as_it_was() -> None:
    model, (x,) = check_models.small()
    fastmodule.accelerate(model)
    try:
        before = _state(model)
        calls = 0

        def interrupt(module: nn.Module, args: object) -> None:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise KeyboardInterrupt

        handle = model.head.register_forward_pre_hook(interrupt)
        with pytest.raises(KeyboardInterrupt):
            check(model, x, timing=False, progress=False)
        handle.remove()
        assert _same_state(before, _state(model))
    finally:
        fastmodule.restore(model)


def _report(stock: Timing, fast: Timing) -> CheckReport:
    model, (x,) = check_models.small()
    report = check(model, x, timing=False, progress=False)
    timings = Timings(stock, fast, None, None, "not timed (--no-compile)", 10, 5)
    return dataclasses.replace(report, timings=timings)


def test_a_noisy_machine_is_said() -> None:
    quiet = _report(Timing(1.0, 0.9, 1.1), Timing(0.5, 0.45, 0.6))
    assert quiet.all_notes == [] and "noisy" not in str(quiet)
    noisy = _report(Timing(1.0, 0.9, 1.1), Timing(0.5, 0.2, 2.0))
    assert "the timings are noisy: the slowest round took 10.0x the fastest" in str(noisy)
    assert any("noisy" in n for n in noisy.to_json()["notes"])
    assert str(noisy) == noisy.format()


def test_a_model_that_cannot_be_timed_keeps_its_verdict() -> None:
    # In training, the rebound buffer keeps the last call's graph: the timed calls in a
    # row fail (as a training loop would), the parity verdict stands, with a note.
    model, x = check_models.rebinds_buffer()
    report = check(model, x, train=True, repeats=1, compile=False, progress=False)
    assert report.parity.identical and report.timings is None
    [note] = report.notes
    assert note.startswith("not timed: the stock run raised while being timed")
    assert "backward through the graph a second time" in note
