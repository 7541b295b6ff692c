"""``fastmodule.check(model, *args, method=NAME)`` and ``python -m fastmodule check
--method NAME`` (issue 37, item 2): models driven through a method, not ``forward``
(CleanRL's ``Agent.get_action_and_value``, an SB3-style ``predict`` on NumPy arrays, HF
``generate``), are compared, timed and located through that method; a method the model
lacks is a usage error (ValueError; exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fastmodule.__main__ import main
from fastmodule.tools.check import check, model_methods
from fastmodule.tools.check.report import EXIT_DIFFERENT, EXIT_OK, EXIT_UNUSABLE
from tests import check_models
from tests.check_models import DIFFERS_WHEN_ACCELERATED
from tests.conftest import without_import_warning
from tests.test_check import _same_state, _state


def _example(factory: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    model, example = getattr(check_models, factory)()
    if isinstance(example, dict):
        return model, (), example
    return model, example if isinstance(example, tuple) else (example,), {}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["check", *argv])
    out, err = capsys.readouterr()
    return status, out, err


FAST = ("--no-timing",)

#: (factory, method, train, package the model needs).
IDENTICAL = [
    pytest.param("agent", "get_action_and_value", False, None, id="cleanrl-update"),
    pytest.param("agent", "get_action_and_value", True, None, id="cleanrl-update-train"),
    pytest.param("agent_sampling", "get_action_and_value", False, None, id="cleanrl-sampling"),
    pytest.param("agent_sampling", "get_action_and_value", True, None, id="cleanrl-sampling-train"),
    pytest.param("agent_sampling", "get_value", False, None, id="cleanrl-value"),
    pytest.param("policy", "predict", False, None, id="sb3-predict"),
    pytest.param("policy", "predict", True, None, id="sb3-predict-train"),
    pytest.param("gpt2_generate", "generate", False, "transformers", id="hf-generate"),
]


@pytest.mark.parametrize(("factory", "method", "train", "package"), IDENTICAL)
def test_methods_are_identical(factory: str, method: str, train: bool, package: str | None) -> None:
    if package:
        pytest.importorskip(package)
    model, args, kwargs = _example(factory)
    before = _state(model)
    report = check(model, *args, method=method, train=train, timing=False, progress=False, **kwargs)
    assert report.parity.identical and not report.parity.nondeterministic, report.format()
    assert report.exit_status == EXIT_OK
    assert report.method == method and report.to_json()["method"] == method
    mode = f"train step: {method} + backward" if train else f"{method} under torch.no_grad()"
    assert report.mode.startswith(mode)
    header = report.format().splitlines()[0]
    assert header.startswith(f"fastmodule check  {type(model).__qualname__}.{method}  ({mode}")
    assert _same_state(before, _state(model))


def test_what_each_method_returns_is_compared() -> None:
    model, args, _ = _example("agent")
    report = check(
        model, *args, method="get_action_and_value", train=True, timing=False, progress=False
    )
    # action, log_prob, entropy, value; grads of both Sequentials.
    assert report.parity.compared.startswith("output: 4 tensor(s); grads: 12;")
    model, args, _ = _example("policy")
    report = check(model, *args, method="predict", timing=False, progress=False)
    assert report.parity.compared.startswith("output: 0 tensor(s), 1 NumPy array(s);")
    assert report.inputs == "5x4 float32 ndarray"
    pytest.importorskip("transformers")
    model, _, kwargs = _example("gpt2_generate")
    assert model.generate(**kwargs).shape == (1, 11)  # greedy: 5 new tokens, every time
    report = check(model, method="generate", timing=False, progress=False, **kwargs)
    assert report.parity.compared.startswith("output: 1 tensor(s);")


def test_sampling_is_reproducible_because_each_run_starts_from_the_same_rng() -> None:
    # Without an action, get_action_and_value samples one from the RNG: two calls in a
    # row sample differently, yet check's runs agree (each restores the RNG states).
    model, (x,) = _example("agent_sampling")[:2]
    torch.manual_seed(1)
    with torch.no_grad():
        first, second = model.get_action_and_value(x)[0], model.get_action_and_value(x)[0]
    assert not torch.equal(first, second)
    rng = torch.random.get_rng_state()
    report = check(model, x, method="get_action_and_value", timing=False, progress=False)
    assert report.parity.identical and not report.parity.nondeterministic, report.format()
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_numpy_inputs_are_fresh_copies_in_each_run() -> None:
    # predict scales its observation array in place: each run gets its own copy, and
    # the caller's array is as it was.
    model, (obs,) = _example("scales_observations")[:2]
    kept = obs.copy()
    report = check(model, obs, method="predict", timing=False, progress=False)
    assert report.parity.identical, report.format()
    assert np.array_equal(obs, kept)


class OnlyAct(nn.Module):
    """No forward; ``act`` records the grad mode of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)
        self.seen: list[bool] = []

    def act(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.is_grad_enabled())
        return self.proj(x)


@pytest.mark.parametrize("train", [False, True], ids=["no-grad", "train"])
def test_every_run_and_timed_call_calls_the_method(
    monkeypatch: pytest.MonkeyPatch, train: bool
) -> None:
    # torch.compile is given the copy's bound method (here returned as it is: no compile).
    compiled: list[Any] = []
    monkeypatch.setattr(torch, "compile", lambda fn: compiled.append(fn) or fn)
    model = OnlyAct()
    report = check(model, torch.ones(2, 4), method="act", train=train, repeats=1)
    assert report.parity.identical and report.timings is not None, report.format()
    assert report.timings.compiled is not None
    # Stock twice, accelerated, counting handovers, then warm-up and timed loops.
    assert len(model.seen) > 4 and set(model.seen) == {train}
    [target] = compiled
    assert target.__func__ is OnlyAct.act and target.__self__ is not model
    assert isinstance(target.__self__, OnlyAct)


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_a_difference_inside_the_method_names_the_module() -> None:
    model, args, _ = _example("shifted_agent")
    report = check(model, *args, method="get_action_and_value", timing=False, progress=False)
    assert report.exit_status == EXIT_DIFFERENT
    assert report.parity.differences[0].startswith("output[1]: 8 of 8 values differ")
    d = report.parity.diverged
    assert d is not None and (d.module, d.cls, d.call) == ("actor.2", "Shift", 1)
    assert d.differences == ["output: 128 of 128 values differ (max abs difference 1)"]
    assert "diverges at  actor.2 (Shift): the first module whose output differs" in str(report)


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_a_difference_in_the_methods_own_code_names_the_model() -> None:
    model, args, _ = _example("method_differs")
    report = check(model, *args, method="get_value", timing=False, progress=False)
    assert report.exit_status == EXIT_DIFFERENT
    d = report.parity.diverged
    assert d is not None and (d.module, d.cls, d.call) == ("", "MethodDiffers", None)
    assert d.differences == ["output: 8 of 8 values differ (max abs difference 1)"]
    assert d.note is not None and "in MethodDiffers.get_value's own code" in d.note


@pytest.mark.parametrize(
    ("method", "error", "message"),
    [
        (
            "nosuch",
            ValueError,
            "Agent has no method 'nosuch': name one it has (its methods: "
            "get_action_and_value, get_value)",
        ),
        ("training", ValueError, "Agent.training is a bool, not a method"),
        (3, TypeError, "method must be a method's name (a str), got int"),
        (None, ValueError, "Agent has no forward, so model(...) cannot run it"),
    ],
    ids=["missing", "not-callable", "not-a-name", "no-forward"],
)
def test_a_method_it_cannot_call_is_a_usage_error(
    method: Any, error: type[Exception], message: str
) -> None:
    model, args, _ = _example("agent")
    with pytest.raises(error) as info:
        check(model, *args, method=method, timing=False, progress=False)
    assert str(info.value).startswith(message)


def test_model_methods() -> None:
    assert model_methods(check_models.Agent()) == ["get_action_and_value", "get_value"]
    assert "forward" in model_methods(check_models.Policy())
    with pytest.raises(
        ValueError, match=r"no method 'get_actions': .*did you mean 'get_action_and_value'\?"
    ):
        check(check_models.Agent(), torch.ones(1, 4), method="get_actions", timing=False)


# The command line.

CLI = [
    pytest.param("agent", "get_action_and_value", None, id="cleanrl"),
    pytest.param("agent_sampling", "get_action_and_value", None, id="cleanrl-sampling"),
    pytest.param("policy", "predict", None, id="sb3-predict"),
    pytest.param("gpt2_generate", "generate", "transformers", id="hf-generate"),
]


@pytest.mark.parametrize(("factory", "method", "package"), CLI)
def test_cli_identical_exit_0(
    capsys: pytest.CaptureFixture[str], factory: str, method: str, package: str | None
) -> None:
    if package:
        pytest.importorskip(package)
    status, out, _ = run(capsys, f"tests.check_models:{factory}", "--method", method, *FAST)
    assert status == EXIT_OK, out
    header, verdict = out.splitlines()[:2]
    assert f".{method}  ({method} under torch.no_grad()" in header
    assert verdict.startswith("parity       identical")


def test_cli_json_names_the_method(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys,
        "tests.check_models:agent",
        "--method",
        "get_action_and_value",
        "--train",
        "--json",
        *FAST,
    )
    data = json.loads(out)
    assert status == 0 and data["exit_status"] == 0
    assert data["method"] == "get_action_and_value" and data["model"] == "Agent"
    assert data["mode"] == "train step: get_action_and_value + backward with grad, training mode"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--method", "nosuch"],
            "error: --method nosuch: Agent has no method 'nosuch': name one it has (its "
            "methods: get_action_and_value, get_value)",
        ),
        (
            ["--method", "training"],
            "error: --method training: Agent.training is a bool, not a method",
        ),
        ([], "error: Agent has no forward, so model(...) cannot run it: name the method"),
    ],
    ids=["missing", "not-callable", "no-forward"],
)
def test_cli_a_method_it_cannot_call_exits_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run(capsys, "tests.check_models:agent", *argv, *FAST)
    assert status == EXIT_UNUSABLE and out == ""
    [line] = err.splitlines()  # one line, no traceback
    assert line.startswith(message)
    if not argv:
        assert "--method NAME" in line
    status, out, _ = run(capsys, "tests.check_models:agent", *argv, "--json", *FAST)
    assert status == EXIT_UNUSABLE
    assert json.loads(out) == {
        "schema": 1,
        "error": line.removeprefix("error: "),
        "raised": None,
        "exit_status": EXIT_UNUSABLE,
    }


def test_cli_missing_method_subprocess_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "check", "tests.check_models:agent"]
        + ["--method", "forward", "--no-timing"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == EXIT_UNUSABLE and proc.stdout == ""
    assert without_import_warning(proc.stderr).splitlines() == [
        "error: --method forward: Agent has no method 'forward': name one it has (its "
        "methods: get_action_and_value, get_value)"
    ]


@pytest.mark.requires_native(DIFFERS_WHEN_ACCELERATED)
def test_cli_a_difference_through_the_method_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "tests.check_models:shifted_agent", "--method", "get_action_and_value", *FAST
    )
    assert status == EXIT_DIFFERENT
    assert "DIFFERENT from stock" in out
    assert "diverges at  actor.2 (Shift): the first module whose output differs" in out
