"""``fastmodule.strict()``: a warning (or an error) at the user's line that assigns an
unregistered module, parameter or tensor; nothing for what torch registers, for torch's
own assignments or for aliases; nothing left behind when it is off."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import StrictRegistrationError, StrictRegistrationWarning, strict
from tests.conftest import outcome

TORCH_SETATTR = nn.Module.__dict__["__setattr__"]


class Example(nn.Module):
    """The model of fastmodule issue 18: a plain list of layers and a plain mask."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(16, 16) for _ in range(3)]  # line: LAYERS
        self.mask = torch.ones(16)  # line: MASK
        self.head = nn.Linear(16, 1)


def _line(marker: str) -> int:
    lines, start = inspect.getsourcelines(Example)
    return start + next(i for i, text in enumerate(lines) if f"# line: {marker}" in text)


def _caught(make: type[nn.Module] | object) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()  # type: ignore[operator]
    return [w for w in caught if issubclass(w.category, StrictRegistrationWarning)]


@pytest.mark.parametrize("accelerate", [False, True], ids=["stock", "accelerated"])
def test_example_warns_at_both_assignments(accelerate: bool) -> None:
    if accelerate:
        fastmodule.accelerate(Example())
    try:
        with strict():
            caught = _caught(Example)
    finally:
        if accelerate:
            fastmodule.restore(Example())
    assert [(w.filename, w.lineno) for w in caught] == [
        (__file__, _line("LAYERS")),
        (__file__, _line("MASK")),
    ]
    assert "Example.layers = a plain list with 3 modules" in str(caught[0].message)
    assert "use nn.ModuleList" in str(caught[0].message)
    assert "FM001" in str(caught[0].message)
    assert "Example.mask = a tensor of shape (16,)" in str(caught[1].message)
    assert "register_buffer" in str(caught[1].message)


def test_error_raises_at_the_assignment() -> None:
    with strict(error=True), pytest.raises(StrictRegistrationError, match="Example.layers"):
        Example()


def test_fastmodule_module_subclasses_are_checked() -> None:
    class Native(fastmodule.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = {"a": nn.Parameter(torch.ones(2))}

    with strict():
        caught = _caught(Native)
    assert len(caught) == 1
    assert "Native.blocks = a plain dict with 1 parameter" in str(caught[0].message)
    assert "FM002" in str(caught[0].message)


def test_nested_tensors_in_a_tuple() -> None:
    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = ([torch.zeros(1)], {"k": (torch.ones(1),)})

    with strict():
        caught = _caught(Nested)
    assert len(caught) == 1 and "a plain tuple with 2 tensors" in str(caught[0].message)
    assert "FM003" in str(caught[0].message)


def test_correct_models_and_values_do_not_warn() -> None:
    class Correct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
            self.register_buffer("mask", torch.ones(4))
            self.mask = torch.zeros(4)  # a buffer's new value
            self.scale = nn.Parameter(torch.ones(1))
            self.first = [self.layers[0]]  # an alias of a registered module
            self.names = ["a", "b"]
            self.count = 3
            self.nothing = None

    with strict(error=True):
        assert _caught(Correct) == []


def test_torch_own_assignments_are_not_checked() -> None:
    def build() -> None:
        nn.LSTM(4, 4, num_layers=2)  # RNNBase keeps _flat_weights as a plain list
        m = torch.nn.utils.weight_norm(nn.Linear(3, 3))
        m(torch.ones(1, 3))  # recomputes .weight as a plain tensor attribute
        nn.MultiheadAttention(8, 2)

    with strict(error=True):
        assert _caught(build) == []


def test_off_puts_torch_function_back() -> None:
    assert not fastmodule.strict_enabled()
    with strict():
        assert fastmodule.strict_enabled()
        assert nn.Module.__dict__["__setattr__"] is not TORCH_SETATTR
        with strict(False):
            assert nn.Module.__dict__["__setattr__"] is TORCH_SETATTR
            assert _caught(Example) == []
        assert len(_caught(Example)) == 2
    assert nn.Module.__dict__["__setattr__"] is TORCH_SETATTR
    assert not fastmodule.strict_enabled()


def test_nested_blocks_restore_the_outer_setting() -> None:
    with strict():
        with strict(error=True), pytest.raises(StrictRegistrationError):
            Example()
        assert len(_caught(Example)) == 2  # warnings again, not errors
    assert nn.Module.__dict__["__setattr__"] is TORCH_SETATTR


def test_behaviour_is_torchs_under_strict() -> None:
    # What torch raises stays torch's (type and text), and the values land where torch
    # puts them.
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError) as stock_error:
        m.weight = torch.ones(2, 2)  # type: ignore[assignment]
    with strict():
        with pytest.raises(TypeError) as strict_error:
            m.weight = torch.ones(2, 2)  # type: ignore[assignment]
        m.extra = nn.ReLU()
    assert str(strict_error.value) == str(stock_error.value)
    assert "extra" in m._modules


def test_run_strict(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.layers = [nn.Linear(2, 2)]\n"
        "Net()\n",
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "run", "--strict", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{script}:6: StrictRegistrationWarning: Net.layers" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "run", "--strict-error", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "StrictRegistrationError: Net.layers" in proc.stderr


# ------------------------------------------------- assignments before nn.Module.__init__

#: What ``self.cfg = value`` before ``super().__init__()`` does in stock torch: ``ok``
#: (kept as a plain attribute, the model builds) or torch's own error, type and text.
BEFORE_INIT = {
    "list": (lambda: [1, 2], None),
    "int": (lambda: 3, None),
    "none": (lambda: None, None),
    "tensor": (lambda: torch.ones(2), None),
    "list_of_module": (lambda: [nn.Linear(2, 2)], None),
    "list_of_parameter": (lambda: [nn.Parameter(torch.ones(2))], None),
    "dict_of_tensor": (lambda: {"k": torch.ones(2)}, None),
    "module": (
        lambda: nn.Linear(2, 2),
        (AttributeError, "cannot assign module before Module.__init__() call"),
    ),
    "parameter": (
        lambda: nn.Parameter(torch.ones(2)),
        (AttributeError, "cannot assign parameters before Module.__init__() call"),
    ),
    "buffer": (
        lambda: nn.Buffer(torch.ones(2)),
        (AttributeError, "cannot assign buffer before Module.__init__() call"),
    ),
}


def _early_net(base: type[nn.Module], make: object) -> type[nn.Module]:
    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self, early: bool = True) -> None:
            if early:
                self.cfg = make()  # type: ignore[operator]
            super().__init__()
            self.fc = nn.Linear(2, 2)

    return Net


def _described(m: nn.Module) -> tuple[object, ...]:
    """A built model by where its values went: ``cfg``'s type and the registries."""
    d = m.__dict__
    cfg = type(d["cfg"]).__name__ if "cfg" in d else "<absent>"
    return cfg, sorted(d["_modules"]), sorted(d["_parameters"]), sorted(d["_buffers"])


def _checked_outcome(fn: Callable[[], object]) -> tuple[tuple[object, ...], list[str]]:
    """``outcome(fn)`` (its value, or its exception's type and text) and the texts of
    the strict warnings it emitted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = outcome(fn)
    return result, [str(w.message) for w in caught if w.category is StrictRegistrationWarning]


@pytest.mark.parametrize("mode", ["plain", "accelerated", "installed"])
@pytest.mark.parametrize("error", [False, True], ids=["warn", "error"])
@pytest.mark.parametrize("variant", list(BEFORE_INIT))
def test_assignment_before_init_is_stocks(
    base: type[nn.Module], variant: str, error: bool, mode: str
) -> None:
    # Issue 31: strict raised AttributeError ('_modules') here; it must neither fail,
    # report nor take the place of torch's own error.
    make, torch_error = BEFORE_INIT[variant]
    if torch_error is None:
        expected: tuple[object, ...] = ("ok", (type(make()).__name__, ["fc"], [], []))
    else:
        expected = ("raised", *torch_error)
    if mode == "installed":
        fastmodule.install()
    try:
        net = _early_net(base, make)
        if mode == "accelerated":
            fastmodule.accelerate(net(early=False))
        assert fastmodule.is_accelerated(net(early=False)) is (
            mode != "plain" or base is not nn.Module
        )
        stock = _checked_outcome(lambda: _described(net()))
        with strict(error=error):
            checked = _checked_outcome(lambda: _described(net()))
    finally:
        if mode == "accelerated":
            fastmodule.restore(net(early=False))
        if mode == "installed":
            fastmodule.uninstall()
    assert stock == (expected, [])
    assert checked == stock


@pytest.mark.parametrize("error", [False, True], ids=["warn", "error"])
def test_plain_list_after_init_still_reported(base: type[nn.Module], error: bool) -> None:
    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.early = [nn.Linear(2, 2)]  # before __init__: not reported
            super().__init__()
            self.blocks = [nn.Linear(2, 2) for _ in range(2)]

    if error:
        with strict(error=True), pytest.raises(StrictRegistrationError) as raised:
            Net()
        message = str(raised.value)
    else:
        with strict():
            caught = _caught(Net)
        assert len(caught) == 1
        message = str(caught[0].message)
    assert "Net.blocks = a plain list with 2 modules" in message
    assert "FM001" in message


@pytest.mark.parametrize("error", [False, True], ids=["warn", "error"])
def test_what_torch_registers_or_refuses_stays_torchs(base: type[nn.Module], error: bool) -> None:
    # nn.Buffer is registered by torch; a value for a parameter's or child's name is
    # refused with torch's TypeError: strict neither reports nor replaces that error.
    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2, 2)
            self.kept = nn.Buffer(torch.ones(2))
            self.dropped = nn.Buffer(torch.ones(2), persistent=False)

    def assign(name: str, value: object) -> Callable[[], object]:
        def run() -> object:
            m = Net()
            setattr(m, name, value)
            return sorted(m._buffers), sorted(m._non_persistent_buffers_set)

        return run

    cases: list[Callable[[], object]] = [
        assign("other", nn.Buffer(torch.zeros(1))),
        assign("fc", torch.ones(1)),
        assign("fc", [torch.ones(1)]),
        assign("kept", [nn.Linear(1, 1)]),
        lambda: setattr(nn.Linear(1, 1), "weight", [nn.Linear(1, 1)]),
    ]
    stock = [_checked_outcome(case) for case in cases]
    with strict(error=error):
        checked = [_checked_outcome(case) for case in cases]
    assert checked == stock
    assert stock[0] == (("ok", (["dropped", "kept", "other"], ["dropped"])), [])
    assert [s[0][:2] for s in stock[1:]] == [("raised", TypeError)] * 4
