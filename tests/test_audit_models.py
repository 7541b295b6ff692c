"""No error or warning from ``fastmodule.audit`` on correct models: every module class
of torch's module database (each constructor variant its ``module_inputs_func``
gives, CPU float32), Hugging Face GPT-2 and BERT and timm resnet18 and ViT-tiny built
from small configs; stock and accelerated give the same report.

Decisions recorded here (torch's own modules that do trigger an info finding, and
why that is right):

- ``nn.RNN``/``nn.GRU``/``nn.LSTM`` keep ``_flat_weights``, a plain list of their
  registered parameters: FM014 (info). A plain list of modules or parameters that
  are all registered elsewhere is only another reference, not a bug, so FM001/FM002
  (errors) count only what is registered nowhere in the model.
- ``RNNBase`` overrides ``__setattr__`` (to keep ``_flat_weights`` in step): FM016
  (info), which is what fastmodule does for it (its setattr slot stays off).
- ``nn.ParameterList``/``nn.ParameterDict`` define ``__call__`` only to refuse being
  called: not reported as an overridden call.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import fastmodule
from fastmodule.tools.audit import AuditReport
from tests.audit_support import audit_both

try:
    from torch.testing._internal.common_modules import module_db

    MODULE_DB_ERROR = ""
except Exception as e:  # noqa: BLE001 - any import failure means "not in this torch"
    module_db = []
    MODULE_DB_ERROR = f"torch.testing._internal.common_modules: {type(e).__name__}: {e}"

# torch's own classes with an info finding, and the codes (see the docstring).
EXPECTED_INFO = {"nn.RNN": {"FM014", "FM016"}, "nn.GRU": {"FM014", "FM016"}}
EXPECTED_INFO["nn.LSTM"] = EXPECTED_INFO["nn.RNN"]


def no_errors_or_warnings(report: AuditReport) -> None:
    bad = report.at_least("warning")
    assert not bad, report.format("warning")


def db_params() -> list[Any]:
    if not module_db:
        return [pytest.param(None, marks=pytest.mark.skip(reason=MODULE_DB_ERROR), id="module_db")]
    return [pytest.param(info, id=info.name) for info in module_db]


def constructors(info: Any) -> Iterator[Any]:
    """Each constructor input ``info``'s inputs give on CPU float32, as torch's own
    module tests build them (in training mode, and in eval mode too where the two
    differ)."""
    modes = (True, False) if info.train_and_eval_differ else (True,)
    for training in modes:
        for sample in info.module_inputs_func(
            info, device="cpu", dtype=torch.float32, requires_grad=False, training=training
        ):
            yield sample.constructor_input


@pytest.mark.parametrize("info", db_params())
def test_module_db(info: Any) -> None:
    if torch.float32 not in info.dtypes:
        pytest.skip(f"{info.name} does not support float32")
    audited = 0
    for ctor in constructors(info):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            # Constructor warnings (deprecations, lazy modules) are not under test.
            warnings.simplefilter("ignore")
            model = info.module_cls(*ctor.args, **ctor.kwargs)
        report = audit_both(model)
        no_errors_or_warnings(report)
        assert set(report.codes()) <= EXPECTED_INFO.get(info.name, set()), report.format()
        audited += 1
    assert audited > 0


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


def test_gpt2(transformers: Any) -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    report = audit_both(transformers.GPT2LMHeadModel(config))
    no_errors_or_warnings(report)
    # The LM head is tied to the token embedding. PreTrainedModel puts mixins after
    # torch.nn.Module in the MRO, which define neither __setattr__ nor __delattr__:
    # nothing is lost (no FM016).
    tied = [f for f in report.findings if f.code == "FM012"]
    assert [f.where for f in tied] == ["lm_head.weight"]
    assert "'transformer.wte.weight'" in tied[0].message
    assert set(report.codes()) == {"FM012"}


def test_bert(transformers: Any) -> None:
    config = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=128,
    )
    report = audit_both(transformers.BertModel(config))
    no_errors_or_warnings(report)
    assert set(report.codes()) <= {"FM016"}


@pytest.mark.parametrize("name", ["resnet18", "vit_tiny_patch16_224"])
def test_timm(name: str) -> None:
    timm = pytest.importorskip("timm")
    report = audit_both(timm.create_model(name, pretrained=False))
    assert report.findings == (), report.format()


def test_several_constructor_variants_are_audited() -> None:
    if not module_db:
        pytest.skip(MODULE_DB_ERROR)
    linear = next(info for info in module_db if info.name == "nn.Linear")
    assert len(list(itertools.islice(constructors(linear), 2))) == 2


def test_torch_mechanisms_that_keep_plain_tensors_on_purpose() -> None:
    from torch.nn.utils import parametrize, spectral_norm, weight_norm

    class Symmetric(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).T

    def make() -> torch.nn.Module:
        m = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
        parametrize.register_parametrization(m[0], "weight", Symmetric())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # weight_norm is deprecated
            weight_norm(m[1])
        spectral_norm(m[2])
        return m

    # weight_norm and spectral_norm recompute a plain `weight` attribute before each
    # forward, from registered parameters: not state, not reported (with or without
    # a graph behind it).
    x = torch.randn(2, 4)
    m = make()
    m(x)
    assert audit_both(m).findings == ()
    with torch.no_grad():
        m(x)
    assert audit_both(m).findings == ()


def test_fx_and_torchscript() -> None:
    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + torch.ones(4)

    traced = torch.fx.symbolic_trace(WithConstant())
    report = audit_both(traced)
    no_errors_or_warnings(report)
    assert report.buffers == 1  # the constant, as a buffer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated
        scripted = torch.jit.script(WithConstant())
    # Its registries are C++ wrappers, not dicts: the audit says it cannot look inside.
    report = fastmodule.audit(scripted)
    no_errors_or_warnings(report)
    registries = [f for f in report.findings if f.code == "FM017"]
    assert [f.attribute for f in registries] == ["_parameters", "_buffers", "_modules"]
    assert all("not audited inside" in f.message for f in registries)
