"""``fastmodule audit`` as a linter (issue 29, item 5): modules and parameters held by
plain helper objects, with no false positives on configs and tokenizers; the file and
line of the assignment; ``--select``/``--ignore``; silencing one finding in the code;
``--explain CODE``; text wrapped to the terminal."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule.__main__ import main
from fastmodule.tools.audit import KINDS, AuditReport, select_codes
from fastmodule.tools.audit.explain import PAGES, PREAMBLE, explain, explain_dict
from tests.audit_support import audit_both

# ----------------------------------------------------------------- plain helper objects


class Projection:
    """A plain helper class (not an nn.Module) holding a layer."""

    def __init__(self) -> None:
        self.linear = nn.Linear(8, 8)


class Pipeline:
    """Two levels: a plain object holding a plain object, a list and a parameter."""

    def __init__(self) -> None:
        self.first = Projection()
        self.steps = [nn.ReLU(), nn.Linear(8, 8)]
        self.scale = nn.Parameter(torch.ones(8))


class Deep:
    """Three levels: what is held at the third is not looked at."""

    def __init__(self) -> None:
        self.pipeline = Pipeline()


class Slotted:
    __slots__ = ("layer", "unset")

    def __init__(self) -> None:
        self.layer = nn.Linear(8, 8)


class WithHelpers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.helper = Projection()  # line: HELPER
        self.pipeline = Pipeline()
        self.deep = Deep()
        self.slotted = Slotted()


def test_modules_and_parameters_held_by_helpers() -> None:
    report = audit_both(WithHelpers())
    found = [(f.code, f.attribute, f.message) for f in report.findings]
    assert found == [
        (
            "FM018",
            "helper",
            "1 module held by a plain Projection object in attribute 'helper' (helper.linear)",
        ),
        (
            "FM018",
            "pipeline",
            "3 modules held by a plain Pipeline object in attribute 'pipeline' "
            "(pipeline.first.linear, pipeline.steps[0], pipeline.steps[1])",
        ),
        (
            "FM019",
            "pipeline",
            "1 parameter held by a plain Pipeline object in attribute 'pipeline' (pipeline.scale)",
        ),
        (
            "FM018",
            "deep",
            "2 modules held by a plain Deep object in attribute 'deep' "
            "(deep.pipeline.steps[0], deep.pipeline.steps[1])",
        ),
        (
            "FM019",
            "deep",
            "1 parameter held by a plain Deep object in attribute 'deep' (deep.pipeline.scale)",
        ),
        (
            "FM018",
            "slotted",
            "1 module held by a plain Slotted object in attribute 'slotted' (slotted.layer)",
        ),
    ]
    helper = report.findings[0]
    assert helper.severity == "error"
    assert helper.fix.startswith("make Projection an nn.Module (then self.helper = Projection(")
    lines, start = inspect.getsourcelines(WithHelpers)
    line = start + next(i for i, t in enumerate(lines) if "# line: HELPER" in t)
    assert (helper.file, helper.line) == (__file__, line)


def test_helpers_holding_registered_modules_are_references_only() -> None:
    class Hooks:
        def __init__(self, model: nn.Module) -> None:
            self.model = model  # the model itself
            self.taps = [model.fc]
            self.weight = model.fc.weight

    model = WithHelpers()
    for name in ("helper", "pipeline", "deep", "slotted"):
        delattr(model, name)
    model.hooks = Hooks(model)
    loop = Projection()
    loop.linear = loop  # type: ignore[assignment] - a cycle ends
    model.loop = loop
    assert audit_both(model).findings == ()


@dataclasses.dataclass
class TrainConfig:
    width: int = 16
    depth: int = 2
    activation: str = "gelu"
    dropout: float = 0.1
    layers: tuple[int, ...] = (16, 16)
    extra: dict[str, Any] = dataclasses.field(default_factory=lambda: {"name": "net"})


class WordTokenizer:
    """A tokenizer-like object of the user's own code: vocabularies, no modules."""

    def __init__(self) -> None:
        self.stoi = {"<pad>": 0, "a": 1, "b": 2}
        self.itos = list(self.stoi)
        self.special = {"pad": "<pad>"}
        self.config = TrainConfig()


@pytest.fixture
def transformers() -> Iterator[Any]:
    tf = pytest.importorskip("transformers")
    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        yield tf
    finally:
        tf.logging.set_verbosity(level)


def test_no_false_positives_on_configs_and_tokenizers(transformers: Any) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    class WithConfigs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = transformers.LlamaConfig(
                hidden_size=16, num_hidden_layers=1, num_attention_heads=2, vocab_size=32
            )
            self.generation_config = transformers.GenerationConfig()
            self.tokenizer = transformers.PreTrainedTokenizerFast(
                tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")),
                unk_token="[UNK]",
            )
            self.words = WordTokenizer()
            self.cfg = TrainConfig()
            self.dtype = torch.float32
            self.fn = torch.relu
            self.fc = nn.Linear(16, 16)

    assert audit_both(WithConfigs()).findings == ()


def test_other_libraries_and_torch_objects_are_not_looked_into() -> None:
    # An object of another installed library is its own business (a trainer, a logger);
    # torch's objects keep what torch needs (optimizers, graphs).
    import pytest as other_library

    model = nn.Sequential(nn.Linear(2, 2))
    model.optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    model.monkeypatch = other_library.MonkeyPatch()
    model.monkeypatch.held = nn.Linear(2, 2)  # type: ignore[attr-defined]
    traced = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    model.graph = traced.graph
    assert audit_both(model).findings == ()


# ------------------------------------------------------------------- file and line


class Located(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks: list[nn.Module] = []  # line: BLOCKS
        self.blocks.append(nn.Linear(2, 2))
        self.cache = None
        setattr(self, "table", {"k": torch.ones(1)})  # line: TABLE  # noqa: B010

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache = x * 2  # line: CACHE
        return x


class LocatedChild(Located):
    pass


def line_of(cls: type, marker: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, t in enumerate(lines) if f"# line: {marker}" in t)


def test_findings_name_the_file_and_line_of_the_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = LocatedChild()
    model(torch.ones(2))
    report = audit_both(model)
    where = {f.attribute: (f.code, f.file, f.line) for f in report.findings}
    assert where == {
        "blocks": ("FM001", __file__, line_of(Located, "BLOCKS")),
        "table": ("FM003", __file__, line_of(Located, "TABLE")),
        # `self.cache = None` in __init__ is passed over for the line that fills it.
        "cache": ("FM005", __file__, line_of(Located, "CACHE")),
    }
    # Text names the file relative to the current directory, like a linter.
    monkeypatch.chdir(Path(__file__).parent.parent)
    first = report.format().splitlines()[0]
    assert f"  tests/test_audit_linter.py:{line_of(Located, 'BLOCKS')}: 1 module in" in first
    # Assigned outside the class: no line (and nothing invented).
    outside = nn.Sequential()
    outside.extra = [nn.Linear(2, 2)]
    (f,) = audit_both(outside).findings
    assert (f.file, f.line) == (None, None)


# ---------------------------------------------------------------------- silencing


class Silenced(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(2, 2)]  # fastmodule: ignore[FM001]
        self.mask = torch.ones(2)  # fastmodule: ignore[FM001]
        self.other = (  # fastmodule: ignore
            torch.zeros(1)
        )
        self.mixed = [nn.Linear(2, 2), torch.ones(1)]  # fastmodule: ignore[fm003, FM999]


class SilencedByClass(nn.Module):
    __fastmodule_ignore__ = {"FM001": ["layers"], "FM005": "*"}

    def __init__(self) -> None:
        super().__init__()
        self.layers = [nn.Linear(2, 2)]
        self.blocks = [nn.Linear(2, 2)]
        self.mask = torch.ones(2)

    def __getattr__(self, name: str) -> Any:  # FM016 (info), silenced below
        return super().__getattr__(name)


class SilencedSubclass(SilencedByClass):
    __fastmodule_ignore__ = ("FM016",)


def test_a_comment_on_the_line_silences_its_codes() -> None:
    report = audit_both(Silenced())
    assert [(f.code, f.attribute) for f in report.findings] == [
        ("FM005", "mask"),  # the comment names another code
        ("FM001", "mixed"),  # only FM003 is named
    ]
    assert sorted((f.code, f.attribute) for f in report.suppressed) == [
        ("FM001", "layers"),
        ("FM003", "mixed"),
        ("FM005", "other"),  # a bare ignore, on the first line of the statement
    ]
    assert report.summary()["suppressed"] == 3
    assert report.summary_line().endswith("1 error, 1 warning, 0 info (3 silenced in the code)")


def test_a_class_attribute_silences_codes_for_the_class_and_subclasses() -> None:
    report = audit_both(SilencedByClass())
    assert [(f.code, f.attribute) for f in report.findings] == [
        ("FM001", "blocks"),
        ("FM016", ""),
    ]
    assert {(f.code, f.attribute) for f in report.suppressed} == {
        ("FM001", "layers"),
        ("FM005", "mask"),
    }
    sub = audit_both(SilencedSubclass())
    assert [(f.code, f.attribute) for f in sub.findings] == [("FM001", "blocks")]
    # FM016 is placed at the class statement.
    fm016 = next(f for f in sub.suppressed if f.code == "FM016")
    assert fm016.line == inspect.getsourcelines(SilencedSubclass)[1]


# ------------------------------------------------------------------- select/ignore


def test_select_and_ignore() -> None:
    model = Silenced()
    assert select_codes() == frozenset(KINDS)
    assert select_codes(["fm00"]) == {f"FM00{i}" for i in range(1, 10)}
    assert select_codes("FM001,FM005", ignore=["FM005"]) == {"FM001"}
    assert fastmodule.audit(model, select=["FM005"]).codes() == ["FM005"]
    assert fastmodule.audit(model, ignore=["FM0"]).findings == ()
    with pytest.raises(ValueError, match="unknown code 'FM9'"):
        fastmodule.audit(model, select=["FM9"])


def test_select_and_ignore_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["audit", "tests.audit_example:buggy", "--select", "FM005"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[2] for line in out.splitlines()[:-2]] == ["FM005"]
    assert main(["audit", "tests.audit_example:buggy", "--ignore", "FM005,fm001"]) == 0
    assert capsys.readouterr().out.strip().endswith("no findings")
    status = main(["audit", "tests.audit_example:buggy", "--select", "FM5", "--json"])
    out, err = capsys.readouterr()
    assert status == 2 and "unknown code 'FM5'" in err
    assert json.loads(out) == {
        "schema": 1,
        "error": "unknown code 'FM5' (codes: FM001-FM019)",
        "exit_status": 2,
    }


# ------------------------------------------------------------------------ explain


@pytest.mark.parametrize("code", sorted(KINDS))
def test_every_code_has_a_page_whose_example_shows_it(code: str) -> None:
    page = PAGES[code]

    def model_of(source: str) -> nn.Module:
        namespace: dict[str, Any] = {"__name__": "fastmodule_explain_example"}
        exec(compile(PREAMBLE + source, f"<{code}>", "exec"), namespace)  # noqa: S102
        return namespace["model"]

    assert code in fastmodule.audit(model_of(page.example)).codes()
    if page.fixed is not None:
        assert code not in fastmodule.audit(model_of(page.fixed)).codes()
    else:
        assert KINDS[code].severity == "info"
    text = explain(code.lower(), width=72)
    assert text.splitlines()[0] == f"{code} ({KINDS[code].severity}): {KINDS[code].title}"
    for section in ("What goes wrong", "Example", "Fix", "Silence it"):
        assert f"\n{section}\n" in text
    assert f"# fastmodule: ignore[{code}]" in " ".join(text.split())
    assert all(len(line) <= 80 for line in text.splitlines()[1:])


def test_explain_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--explain", "FM001"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FM001 (error): modules in a plain list/tuple/dict/set attribute")
    assert "self.layers = nn.ModuleList(" in out
    assert main(["audit", "--explain", "fm018", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == explain_dict("FM018")
    assert main(["audit", "--explain"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[: len(KINDS)]] == list(KINDS)
    assert main(["audit", "--explain", "FM404"]) == 2
    assert "unknown code 'FM404'" in capsys.readouterr().err
    assert main(["audit"]) == 2
    assert "audit needs FACTORY (or --explain CODE)" in capsys.readouterr().err


# ----------------------------------------------------------------------- wrapping


def test_text_is_wrapped_to_the_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report: AuditReport = audit_both(WithHelpers())
    one_line = report.format()
    assert len(one_line.splitlines()) == len(report.findings) + 2
    for width in (100, 60, 30):
        text = report.format(width=width)
        lines = text.splitlines()
        # Nothing lost; words are never broken: a line is longer only when one word is
        # (or, narrower than the columns before the message, the columns are).
        assert " ".join(text.split()) == " ".join(one_line.split())
        if width >= 60:
            assert all(len(line) <= width or " " not in line.strip() for line in lines), text
        else:
            assert all(line.startswith("    ") for line in lines[1:3]), text
    wide = report.format(width=100).splitlines()
    assert wide[0].startswith("helper    WithHelpers  FM018 error  ")
    # Continuation lines start under the message.
    hang = wide[0].index("error  ") + len("error  ")
    assert wide[1][:hang].strip() == "" and wide[1][hang] != " "
    # The command line wraps to COLUMNS (the terminal's width when stdout is one).
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["audit", "tests.audit_example:buggy"]) == 1
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 60
    assert len(out.splitlines()) > 4
