"""``fastmodule.check``: identical models pass, a model made to differ fails with where,
a nondeterministic model is reported as such; the model is left as it was."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule.tools.check import check
from fastmodule.tools.check.report import EXIT_DIFFERENT, EXIT_NONDETERMINISTIC, EXIT_OK
from tests import check_models


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


def test_difference_is_reported_with_where() -> None:
    model, (x,) = check_models.differs()
    report = check(model, x, timing=False, progress=False)
    assert not report.parity.identical and not report.parity.nondeterministic
    assert report.exit_status == EXIT_DIFFERENT
    assert report.parity.differences == ["output: 8 of 8 values differ (max abs difference 1)"]
    assert "DIFFERENT from stock" in report.format()


def test_nondeterministic_model_is_not_a_fastmodule_difference() -> None:
    model, x = check_models.nondeterministic()
    report = check(model, x, timing=False, progress=False)
    assert report.parity.nondeterministic and not report.parity.identical
    assert report.exit_status == EXIT_NONDETERMINISTIC
    assert report.parity.differences == []
    assert report.parity.stock_differences
    assert "nondeterministic" in report.format()


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


def test_fastmodule_module_subclasses_have_no_stock_version() -> None:
    class Native(fastmodule.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(ValueError, match="no stock version"):
        check(Native(), torch.ones(1), timing=False, progress=False)


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
