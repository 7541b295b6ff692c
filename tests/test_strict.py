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
from tests.conftest import NATIVE, outcome

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
    # The tensor at its assignment; the list when Example.__init__ returns (by what it
    # holds then), at the line that assigned it.
    assert [(w.filename, w.lineno) for w in caught] == [
        (__file__, _line("MASK")),
        (__file__, _line("LAYERS")),
    ]
    mask, layers = (str(w.message) for w in caught)
    assert "Example.layers = a plain list with 3 modules at the end of Example.__init__" in layers
    assert "use nn.ModuleList" in layers
    assert "FM001" in layers
    assert "Example.mask = a tensor of shape (16,)" in mask
    assert "register_buffer" in mask


def test_error_raises_at_the_assignment_or_when_init_returns() -> None:
    # The tensor raises at its line; a list once __init__ has returned, naming its line.
    with strict(error=True), pytest.raises(StrictRegistrationError, match="Example.mask"):
        Example()

    class ListOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [nn.Linear(2, 2)]

    line = inspect.getsourcelines(ListOnly)[1] + 3
    with strict(error=True), pytest.raises(StrictRegistrationError) as raised:
        ListOnly()
    assert "ListOnly.layers = a plain list with 1 module at the end of" in str(raised.value)
    assert str(raised.value).endswith(f"[assigned at {__file__}:{line}]")


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
        # (Where no native path is on, nothing is accelerated.)
        assert fastmodule.is_accelerated(net(early=False)) is (
            NATIVE and (mode != "plain" or base is not nn.Module)
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


# ------------------------------------------------------- containers at the end of __init__


def _messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("error", [False, True], ids=["warn", "error"])
def test_append_after_init_is_reported_when_init_returns(
    base: type[nn.Module], error: bool
) -> None:
    # Issue 29: `self.blocks = []` then `.append(nn.Linear(...))` was not reported.
    class Appended(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = []  # line: BLOCKS
            for _ in range(2):
                self.blocks.append(nn.Linear(2, 2))
            self.heads = {}
            self.heads["cls"] = nn.Linear(2, 1)

    lines, start = inspect.getsourcelines(Appended)
    blocks_line = start + next(i for i, t in enumerate(lines) if "# line: BLOCKS" in t)
    if error:
        with strict(error=True), pytest.raises(StrictRegistrationError) as raised:
            Appended()
        assert "Appended.blocks = a plain list with 2 modules" in str(raised.value)
        assert f"[assigned at {__file__}:{blocks_line}]" in str(raised.value)
        return
    with strict():
        caught = _caught(Appended)
    assert [(w.filename, w.lineno) for w in caught] == [
        (__file__, blocks_line),
        (__file__, blocks_line + 3),
    ]
    blocks, heads = _messages(caught)
    assert "Appended.blocks = a plain list with 2 modules at the end of " in blocks
    assert f"at the end of {Appended.__qualname__}.__init__: not registered" in blocks
    assert "use nn.ModuleList (FM001" in blocks
    assert "Appended.heads = a plain dict with 1 module" in heads
    assert "use nn.ModuleDict (FM001" in heads


def test_lists_registered_by_the_end_of_init_are_not_reported() -> None:
    # A list whose modules are registered before __init__ returns (by a container built
    # from it, by a subclass that converts it) is only another reference: no false alarm.
    class Built(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.parts = [nn.Linear(2, 2) for _ in range(2)]
            self.seq = nn.Sequential(*self.parts)
            self.blocks = [nn.Linear(2, 2)]

    class Converted(Built):
        def __init__(self) -> None:
            super().__init__()  # Built.__init__ returns here: not the outermost one
            self.blocks = nn.ModuleList(self.blocks)
            self.names = ["a", "b"]
            self.empty: list[nn.Module] = []

    with strict(error=True):
        assert _caught(Converted) == []
    with strict():
        (caught,) = _caught(Built)
    assert "Built.blocks = a plain list with 1 module" in str(caught.message)


def test_classes_defined_while_strict_is_on_and_made_by_type() -> None:
    with strict():

        class Later(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = []
                self.blocks.append(nn.Linear(2, 2))

        assert len(_caught(Later)) == 1

        def init(self: nn.Module) -> None:
            nn.Module.__init__(self)
            self.blocks = []
            self.blocks.append(nn.Linear(2, 2))

        # No class statement: seen at its first assignment, so from the second instance on.
        Made = type("Made", (nn.Module,), {"__init__": init})
        _caught(Made)
        assert len(_caught(Made)) == 1


def test_wrapped_inits_are_put_back_and_nothing_is_left() -> None:
    import builtins

    class Net(nn.Module):
        def __init__(self, width: int = 2) -> None:
            super().__init__()
            self.fc = nn.Linear(width, width)

    from fastmodule.tools import strict as strict_module

    original = Net.__dict__["__init__"]
    signature = inspect.signature(Net)
    build_class = builtins.__build_class__
    with strict():
        wrapped = Net.__dict__["__init__"]
        assert wrapped is not original and wrapped.__wrapped__ is original
        assert inspect.signature(Net) == signature
        assert Net.__dict__["__init__"] is wrapped  # switching to error keeps it
        with strict(error=True):
            assert Net.__dict__["__init__"] is wrapped
        assert Example.__dict__["__init__"] is not Example.__dict__["__init__"].__wrapped__

        class Failing(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = []
                raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            Failing()
        assert strict_module._building == {}
        # torch's own classes are never wrapped.
        assert nn.Linear.__dict__["__init__"].__code__.co_filename.startswith(
            str(Path(torch.__file__).parent)
        )
    assert Net.__dict__["__init__"] is original
    assert builtins.__build_class__ is build_class
    assert strict_module._wrapped == [] and strict_module._seen == {}


# ----------------------------------------------------------------- during a forward


class Cached(nn.Module):
    """Keeps its attention map (a tensor) and its inputs (a list) for inspection."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.attn = torch.softmax(x, -1).detach()
        self._remember([x])
        return self.fc(x)

    def _remember(self, inputs: list[torch.Tensor]) -> None:
        self.inputs = inputs  # in a method forward calls


@pytest.mark.parametrize("mode", ["plain", "accelerated"])
@pytest.mark.parametrize("error", [False, True], ids=["warn", "error"])
def test_tensors_assigned_during_forward_are_info(mode: str, error: bool) -> None:
    model = Cached()
    if mode == "accelerated":
        fastmodule.accelerate(model)
    try:
        with strict(error=error), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(torch.ones(2, 4))  # never raised, also under error=True
    finally:
        if mode == "accelerated":
            fastmodule.restore(model)
    assert [w.category for w in caught] == [fastmodule.StrictRegistrationInfo] * 2
    attn, inputs = (str(w.message) for w in caught)
    assert attn.startswith("Cached.attn = a tensor of shape (2, 4) during a forward")
    assert "nothing if it is kept for inspection or for the next call" in attn
    assert inputs.startswith("Cached.inputs = a plain list with 1 tensor during a forward")
    assert not issubclass(fastmodule.StrictRegistrationInfo, StrictRegistrationWarning)


def test_attributes_assigned_during_forward_are_info() -> None:
    """Whatever a forward keeps (a tensor, a list of modules made lazily) is info,
    never raised, also under strict(error=True) (issue 29: info, not warning)."""

    class Lazy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.mask = torch.ones(1)
            self.parts = [nn.Linear(2, 2)]
            return x

    for error in (False, True):
        with strict(error=error), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Lazy()(torch.ones(2))
        assert [w.category for w in caught] == [fastmodule.StrictRegistrationInfo] * 2
        assert "Lazy.parts" in str(caught[1].message)


def test_a_module_built_inside_a_forward_is_judged_as_built() -> None:
    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.ones(2)  # made in __init__: a warning, not info

    class Outer(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Inner()
            return x

    with strict(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Outer()(torch.ones(2))
    assert [w.category for w in caught] == [StrictRegistrationWarning]


# --------------------------------------------------------------- Lightning's idiom


class LightningStyle(nn.Module):
    """Lightning's idiom: ``example_input_array`` a property whose setter keeps the
    tensor under ``_example_input_array``."""

    def __init__(self) -> None:
        super().__init__()
        self._example_input_array: torch.Tensor | None = None
        self.fc = nn.Linear(4, 2)
        self.example_input_array = torch.randn(2, 4)

    @property
    def example_input_array(self) -> torch.Tensor | None:
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: torch.Tensor | None) -> None:
        self._example_input_array = example


class PlainExample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.example_input_array = torch.randn(2, 4)  # the idiom without Lightning


def test_example_input_array_is_not_reported() -> None:
    with strict(error=True):
        assert _caught(LightningStyle) == []
        assert _caught(PlainExample) == []
    assert fastmodule.audit(LightningStyle()).findings == ()
    assert fastmodule.audit(PlainExample()).findings == ()


def test_lightning_module_example_input_array() -> None:
    lightning = pytest.importorskip("lightning")

    class LitNet(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.example_input_array = torch.randn(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    with strict(error=True):
        model = _caught(LitNet) or LitNet()
    assert isinstance(model, LitNet) and model.example_input_array.shape == (2, 4)
    assert fastmodule.audit(model).findings == ()


def test_a_property_setter_decides_where_its_value_goes() -> None:
    class Stored(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.ones(2)  # the setter registers it

        @property
        def mask(self) -> torch.Tensor:
            return self._buffers["m"]

        @mask.setter
        def mask(self, value: torch.Tensor) -> None:
            self.register_buffer("m", value)

    with strict(error=True):
        assert list(Stored()._buffers) == ["m"]


# ---------------------------------------------------- nn.Buffer and Hugging Face models


def test_nn_buffer_is_registration() -> None:
    class WithBuffer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = nn.Buffer(torch.ones(4))
            self.table = nn.Buffer(torch.zeros(4), persistent=False)

    with strict(error=True):
        model = WithBuffer()
    assert sorted(model._buffers) == ["mask", "table"]


HF_SCRIPT = """
import transformers

transformers.logging.set_verbosity_error()
llama = transformers.LlamaConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, vocab_size=64,
)
bert = transformers.BertConfig(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
    vocab_size=64,
)
models = [transformers.LlamaForCausalLM(llama), transformers.BertModel(bert)]
print("built", *(type(m).__name__ for m in models))
"""


def test_hugging_face_models_build_under_strict_error() -> None:
    transformers = pytest.importorskip("transformers")
    namespace: dict[str, object] = {"__name__": "hf_under_strict"}
    with strict(error=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(HF_SCRIPT, "<hf>", "exec"), namespace)  # noqa: S102 - the script above
        llama = namespace["models"][0]  # type: ignore[index]
        llama(torch.tensor([[1, 2, 3]]))  # a forward under strict too
    assert not [w for w in caught if issubclass(w.category, StrictRegistrationWarning)]
    assert isinstance(llama, transformers.LlamaForCausalLM)


def test_run_strict_error_builds_hugging_face_models(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = tmp_path / "hf_models.py"
    script.write_text(HF_SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "fastmodule", "run", "--strict-error", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "built LlamaForCausalLM BertModel"
    assert "Strict" not in proc.stderr
