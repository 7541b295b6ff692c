"""Mixin roots: classes with bases after ``torch.nn.Module`` in their MRO.

Hugging Face's ``PreTrainedModel(nn.Module, EmbeddingAccessMixin, ModuleUtilsMixin,
PushToHubMixin, PeftAdapterMixin, ...)`` and ``GenerationMixin`` put mixins after
``nn.Module``. Such an instance takes fastmodule's native paths as long as
``super().__setattr__``/``__delattr__`` after ``nn.Module`` (the only ``super()``
calls of torch's reproduced code) still reach ``object``'s (``src/instance/fast.rs``).

Every test compares stock against fast exactly: a stock model is built and
observed while nothing is accelerated, then an identically seeded one is built
*inside* ``fastmodule.accelerated(...)`` (so its construction runs on the native
paths too) and observed the same way: values or exception types and texts,
warnings, and the calls the classes' own methods log.

- Real roots, from tiny configs (no downloads): GPT-2, Llama, BERT
  (ForSequenceClassification), T5 (ForConditionalGeneration), Qwen2, Mixtral;
  names and order of every iterator, state_dict (values, ``_metadata``), loads
  and their errors, conversions, train/eval flags, forward, backward and
  zero_grad, hooks at the root, generate, save_pretrained/from_pretrained,
  deepcopy, embedding resize, gradient checkpointing; a PEFT LoRA wrap of the
  Llama; a Lightning ``Trainer.fit`` of a ``LightningModule`` around a GPT-2.
  That the root really runs the native whole-tree bodies is checked by the
  helpers of torch's bodies not being entered, and audit's FM016 being absent.
- Synthetic roots: a mixin after ``nn.Module`` defining every name
  ``nn.Module`` defines (all shadowed: none may run) and ``__init_subclass__``
  (also under ``fastmodule.install()``); mixins before ``nn.Module``
  overriding the whole-tree methods and their helpers (each override must run
  exactly where torch calls it, with the same arguments); mixins defining
  ``__setattr__``/``__delattr__`` after ``nn.Module`` (directly or through a
  base; the instance keeps torch's code and they run as often as in stock) or
  before it; such mixins assigned, deleted or swapped in through ``__bases__`` at
  run time (also once a class has used up its version tags); random
  combinations (hypothesis); and a mixin defining ``__getattribute__``, through
  which torch's code reads the registries.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE, outcome, state
from tests.test_accelerate import same, torch_frames, via_c

# Helpers torch's own whole-tree bodies enter; a root on the native paths enters none.
TORCH_HELPERS = {
    "_save_to_state_dict",
    "_load_from_state_dict",
    "_named_members",
    "named_children",
    "compute_should_use_set_data",
}


# --------------------------------------------------------------------------- observing


def observed(fn: Callable[[], Any]) -> tuple[Any, list[tuple[type, str]]]:
    """``outcome(fn)`` and every warning it emitted (category, text); libtorch's
    once-per-process ``TORCH_WARN_ONCE`` ("Triggered internally") left out."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = outcome(fn)
    return result, [
        (w.category, str(w.message)) for w in caught if "Triggered internally" not in str(w.message)
    ]


class Recorder:
    """Named observations in order; each step's value (or exception type and text),
    its warnings and what it appended to ``log`` (emptied after each step)."""

    def __init__(self, log: list[Any] | None = None) -> None:
        self.steps: dict[str, Any] = {}
        self.log = [] if log is None else log

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        assert name not in self.steps, name
        result, warned = observed(fn)
        self.steps[name] = (result, warned, list(self.log))
        self.log.clear()
        return result[1] if result[0] == "ok" else None


def assert_same_steps(got: Recorder, expected: Recorder) -> None:
    """Every step equal (value, warnings, log); all differing steps are listed."""
    assert list(got.steps) == list(expected.steps)
    differ: list[str] = []
    for name, value in expected.steps.items():
        try:
            same(got.steps[name], value, name)
        except AssertionError as e:
            differ.append(" | ".join(str(e).splitlines()[:2]))
    assert not differ, "fast differs from stock at:\n" + "\n".join(differ)


def tensor_refs(pairs: Any) -> list[tuple[str, Any, str]]:
    """``(name, first name of the same object, type name)`` for each entry of a
    named iterator: names, order, sharing and kinds, but no identities."""
    first: dict[int, str] = {}
    return [
        (k, None if v is None else first.setdefault(id(v), k), type(v).__name__) for k, v in pairs
    ]


def structure(model: nn.Module) -> dict[str, Any]:
    """Names, order, sharing and kinds of everything the whole-tree iterators yield,
    called from Python and from C."""
    out: dict[str, Any] = {}
    for what in ("named_parameters", "named_buffers", "named_modules"):
        for dup in (True, False):
            out[f"{what}({dup})"] = tensor_refs(getattr(model, what)(remove_duplicate=dup))
        out[f"{what} via C"] = tensor_refs(via_c(what, model))
    out["named_parameters(recurse=False)"] = tensor_refs(model.named_parameters(recurse=False))
    out["named_modules(prefix)"] = tensor_refs(model.named_modules(prefix="root"))
    out["named_children"] = tensor_refs(model.named_children())
    out["children"] = [type(c).__name__ for c in model.children()]
    out["modules"] = [type(c).__name__ for c in model.modules()]
    out["parameters"] = [tuple(p.shape) for p in model.parameters()]
    out["buffers"] = [tuple(b.shape) for b in model.buffers()]
    return out


def flags(model: nn.Module) -> list[tuple[str, bool]]:
    return [(k, m.training) for k, m in nn.Module.named_modules(model, remove_duplicate=False)]


def dtypes(model: nn.Module) -> list[tuple[str, Any, Any]]:
    """dtype of every parameter, buffer and grad, by name."""
    return [
        (k, t.dtype, None if getattr(t, "grad", None) is None else t.grad.dtype)
        for k, t in model.state_dict(keep_vars=True).items()
        if isinstance(t, torch.Tensor)
    ]


def grads(model: nn.Module) -> dict[str, Any]:
    return {
        k: None if p.grad is None else p.grad.clone()
        for k, p in nn.Module.named_parameters(model, remove_duplicate=False)
    }


def registries(model: nn.Module) -> dict[str, Any]:
    """One module's registries and plain attributes, by name (not identity)."""
    return {k: sorted(v) if isinstance(v, dict | set) else v for k, v in state(model).items()}


def load_cases(model: nn.Module, record: Recorder, tag: str = "") -> None:
    """``load_state_dict`` of the model's own state (a dict, an OrderedDict, from
    C), with a key missing or two unexpected (strict and not), a wrong shape
    (strict and not), not a mapping, and last ``assign=True`` (parameters
    replaced: ties are undone the same way)."""
    sd = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    keys = list(sd)
    victim = next(k for k in reversed(keys) if isinstance(sd[k], torch.Tensor) and sd[k].dim())

    def loaded(d: Any, **kw: Any) -> Any:
        return tuple(model.load_state_dict(d, **kw))

    record(f"{tag}load", lambda: loaded(sd))
    record(f"{tag}load via C", lambda: tuple(via_c("load_state_dict", model, sd)))
    record(f"{tag}load OrderedDict", lambda: loaded(model.state_dict()))
    fewer = dict(sd)
    del fewer[keys[0]]
    more = dict(sd, **{"not.a.key": torch.zeros(1), f"{keys[-1]}.x": torch.zeros(1)})
    record(f"{tag}load missing strict", lambda: loaded(fewer))
    record(f"{tag}load missing lax", lambda: loaded(fewer, strict=False))
    record(f"{tag}load unexpected strict", lambda: loaded(more))
    record(f"{tag}load unexpected lax", lambda: loaded(more, strict=False))
    wrong = dict(sd, **{victim: torch.zeros(*sd[victim].shape[:-1], sd[victim].shape[-1] + 1)})
    record(f"{tag}load wrong shape strict", lambda: loaded(wrong))
    record(f"{tag}load wrong shape lax", lambda: loaded(wrong, strict=False))
    record(f"{tag}load not a mapping", lambda: loaded([1, 2]))

    def assigned() -> Any:
        fresh = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
        result = loaded(fresh, assign=True)
        return result, structure(model), [p.requires_grad for p in model.parameters()]

    record(f"{tag}load assign", assigned)
    record(f"{tag}state after loads", model.state_dict)


def registration_cases(model: nn.Module, record: Recorder, existing: str) -> None:
    """Registrations and deletions at the root (``nn.Module.__setattr__``/
    ``__delattr__``, whose plain-attribute branch ends in ``super()``), errors included."""
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("set module", lambda: setattr(model, "extra_lin", nn.Linear(2, 2))),
        ("set parameter", lambda: setattr(model, "extra_p", nn.Parameter(torch.ones(2)))),
        ("set None parameter", lambda: setattr(model, "extra_p", None)),
        ("set plain", lambda: setattr(model, "extra_plain", 5)),
        ("register_buffer", lambda: model.register_buffer("extra_b", torch.zeros(3))),
        (
            "register_buffer np",
            lambda: model.register_buffer("extra_np", torch.ones(1), persistent=False),
        ),
        ("set buffer tensor", lambda: setattr(model, "extra_b", torch.ones(3))),
        ("tensor as parameter", lambda: setattr(model, "extra_p", torch.ones(2))),
        ("int as module", lambda: setattr(model, "extra_lin", 3)),
        ("buffer name taken", lambda: model.register_buffer(existing, torch.zeros(1))),
        ("parameter name taken", lambda: model.register_parameter(existing, None)),
        ("add_module dotted", lambda: model.add_module("a.b", nn.Identity())),
        ("names now", lambda: structure(model)),
        ("state_dict now", model.state_dict),
        ("registries now", lambda: registries(model)),
        ("del module", lambda: delattr(model, "extra_lin")),
        ("del parameter", lambda: delattr(model, "extra_p")),
        ("del buffer", lambda: delattr(model, "extra_b")),
        ("del np buffer", lambda: delattr(model, "extra_np")),
        ("del plain", lambda: delattr(model, "extra_plain")),
        ("del missing", lambda: delattr(model, "extra_plain")),
        ("read missing", lambda: model.extra_plain),
        ("registries after", lambda: registries(model)),
    ]
    for name, fn in steps:
        record(name, fn)


def conversions(model: nn.Module, record: Recorder) -> None:
    record("to float64", lambda: dtypes(model.to(torch.float64)))
    record("double state", model.state_dict)
    record("half", lambda: dtypes(model.half()))
    record("to float32 via C", lambda: dtypes(via_c("to", model, torch.float32)))
    record("bfloat16", lambda: dtypes(model.bfloat16()))
    record("float", lambda: dtypes(model.float()))
    record("float again", lambda: dtypes(model.float()))
    record("float state", model.state_dict)


def modes(model: nn.Module, record: Recorder) -> None:
    record("train", lambda: flags(model.train()))
    record("eval", lambda: flags(model.eval()))
    record("train(False)", lambda: flags(model.train(False)))
    record("train via C", lambda: flags(via_c("train", model)))
    record("train('x')", lambda: model.train("x"))
    record("eval again", lambda: flags(model.eval()))
    record(
        "requires_grad_(False)",
        lambda: [p.requires_grad for p in model.requires_grad_(False).parameters()],
    )
    record(
        "requires_grad_()", lambda: [p.requires_grad for p in model.requires_grad_().parameters()]
    )
    record("apply", lambda: [type(m).__name__ for m in _applied(model)])


def _applied(model: nn.Module) -> list[nn.Module]:
    seen: list[nn.Module] = []
    model.apply(seen.append)
    return seen


def built(build: Callable[[], nn.Module], log: list[Any]) -> tuple[Any, Any]:
    """``build()`` seeded: the model, and how it went (outcome kind, warnings, log)."""
    models: list[nn.Module] = []
    result, warned = observed(lambda: models.append(seeded(build)))
    how = (result if result[0] == "raised" else "ok", warned, list(log))
    log.clear()
    return (models[0] if models else None), how


def seeded(build: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build()


def stock_then_fast(
    build: Callable[[], nn.Module],
    scenario: Callable[[nn.Module, str], Recorder],
    check_stock: Callable[[nn.Module], None] = lambda template: None,
    check_fast: Callable[[nn.Module, nn.Module], None] = lambda template, fast: None,
) -> None:
    """``scenario`` on a stock model, then on one built the same way (same seed)
    inside ``fastmodule.accelerated`` of a third (the template, whose classes are
    the same), so its construction runs on the native paths too: construction
    (outcome, warnings) and every step equal. ``check_stock(template)`` runs
    before, ``check_fast(template, fast)`` inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        template = seeded(build, 1)
    check_stock(template)
    stock, expected_build = built(build, [])
    expected = scenario(stock, "stock")
    with fastmodule.accelerated(template):
        # (Where no native path is on, nothing is accelerated: both sides run stock.)
        assert fastmodule.is_accelerated(template) is NATIVE
        fast, got_build = built(build, [])
        assert fast is not None, got_build
        assert all(fastmodule.is_accelerated(m) for m in fast.modules()) is NATIVE
        check_fast(template, fast)
        got = scenario(fast, "fast")
    same(got_build, expected_build, "construction")
    assert_same_steps(got, expected)


def fm016(model: nn.Module) -> list[str]:
    return [f.message for f in fastmodule.audit(model).findings if f.code == "FM016"]


# --------------------------------------------------------------------------- Hugging Face

VOCAB = 128
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def llama_like(hidden: int = 32) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        **SPECIAL,
    }


def hf_models(tf: Any) -> dict[str, Callable[[], nn.Module]]:
    """Tiny models from configs: 2 layers, hidden 32-64, vocab 128."""
    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(
            tf.GPT2Config(
                n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, **SPECIAL
            )
        ),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**llama_like())),
        "bert": lambda: tf.BertForSequenceClassification(
            tf.BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                vocab_size=VOCAB,
                max_position_embeddings=64,
                num_labels=3,
                pad_token_id=0,
            )
        ),
        "t5": lambda: tf.T5ForConditionalGeneration(
            tf.T5Config(
                d_model=32,
                d_ff=64,
                d_kv=16,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=2,
                vocab_size=VOCAB,
                decoder_start_token_id=0,
                pad_token_id=0,
                eos_token_id=2,
            )
        ),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**llama_like())),
        "mixtral": lambda: tf.MixtralForCausalLM(
            tf.MixtralConfig(**llama_like(), num_local_experts=2, num_experts_per_tok=2)
        ),
    }


GENERATES = {"gpt2", "llama", "qwen2", "mixtral", "t5"}


def hf_inputs(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(3, VOCAB, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if name == "t5":
        inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (2, 5), generator=g)
    if name == "bert":
        mask[1, 6:] = 0
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return inputs


def labels_for(name: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if name == "bert":
        return {"labels": torch.tensor([0, 2])}
    if name == "t5":
        return {"labels": inputs["decoder_input_ids"]}
    return {"labels": inputs["input_ids"]}


@pytest.fixture(scope="module")
def tf() -> Iterator[Any]:
    """transformers, its logging quiet (``warning_once`` would log only in the first run)."""
    transformers = pytest.importorskip("transformers")
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logger = logging.getLogger("transformers")
    logger_level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield transformers
    finally:
        logger.setLevel(logger_level)
        transformers.logging.set_verbosity(level)


def hf_scenario(name: str, model: nn.Module, folder: Path) -> Recorder:
    """Everything a mixin root's whole-tree methods, registration and HF's own
    machinery (generate, save_pretrained/from_pretrained) show."""
    record = Recorder()
    inputs = hf_inputs(name)
    record("structure", lambda: structure(model))
    record("state_dict", model.state_dict)
    record("state_dict via C", lambda: via_c("state_dict", model))
    record("state_dict prefix", lambda: model.state_dict(prefix="root."))
    record(
        "state_dict keep_vars",
        lambda: [
            (k, type(v).__name__, v.requires_grad)
            for k, v in model.state_dict(keep_vars=True).items()
        ],
    )
    record("flags built", lambda: flags(model))
    modes(model, record)

    def forward() -> Any:
        with torch.no_grad():
            out = model(**inputs)
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}

    record("eval forward", forward)
    if name in GENERATES:
        model.generation_config.pad_token_id = 0
        model.generation_config.eos_token_id = 2

        def generate() -> Any:
            return model.generate(
                inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                max_new_tokens=5,
                do_sample=False,
            )

        record("generate", generate)

    def backward(set_to_none: bool) -> Any:
        model.train()
        torch.manual_seed(3)
        loss = model(**inputs, **labels_for(name, inputs)).loss
        loss.backward()
        out = {"loss": loss.detach(), "grads": grads(model)}
        model.zero_grad(set_to_none=set_to_none)
        out["after zero_grad"] = grads(model)
        return out

    def root_hooks() -> Any:
        calls: list[Any] = []
        handles = [
            model.register_forward_pre_hook(
                lambda m, a, kw: calls.append(("pre", sorted(kw))), with_kwargs=True
            ),
            model.register_forward_hook(lambda m, a, o: calls.append(("post", type(o).__name__))),
            model.register_state_dict_pre_hook(
                lambda m, prefix, keep: calls.append(("sd pre", prefix))
            ),
            model.register_load_state_dict_post_hook(
                lambda m, keys: calls.append(("load post", list(keys.missing_keys)))
            ),
        ]
        out = forward()
        result = tuple(model.load_state_dict(model.state_dict(prefix="")))
        for h in handles:
            h.remove()
        return calls, out, result

    record("root hooks", root_hooks)
    first, *_, last = (k for k, _ in model.named_parameters())
    record("get_parameter", lambda: (model.get_parameter(first), model.get_parameter(last)))
    record(
        "get_submodule",
        lambda: [type(model.get_submodule(k)).__name__ for k, _ in model.named_modules()],
    )
    record("get_submodule missing", lambda: model.get_submodule("nope.0"))
    record("backward, zero_grad(set_to_none=False)", lambda: backward(False))
    record("backward, zero_grad()", lambda: backward(True))
    record("zero_grad via C", lambda: (via_c("zero_grad", model), grads(model))[1])
    record("flags after training", lambda: flags(model))
    model.eval()
    load_cases(model, record)
    conversions(model, record)
    record("eval forward after conversions", forward)
    existing = next(iter(model._modules))
    registration_cases(model, record, existing)

    def save_and_load() -> Any:
        model.save_pretrained(folder)
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        loaded, info = type(model).from_pretrained(folder, output_loading_info=True)
        with torch.no_grad():
            logits = loaded.eval()(**inputs)[0]
        info = {k: sorted(map(str, v)) for k, v in info.items()}
        return files, info, loaded.state_dict(), logits, structure(loaded), flags(loaded)

    record("save_pretrained/from_pretrained", save_and_load)
    hf_extras(name, model, record)
    record("structure at the end", lambda: structure(model))
    record("state_dict at the end", model.state_dict)
    return record


def hf_method(model: Any, name: str, older: str) -> Any:
    """``model.<name>``, or ``model.<older>`` in transformers versions without it."""
    return getattr(model, name, None) or getattr(model, older)


def hf_extras(name: str, model: Any, record: Recorder) -> None:
    """Hugging Face's own tree edits and walks over a mixin root: deepcopy, input
    embedding swap, token embedding resize (modules replaced, weights re-tied),
    gradient checkpointing (``apply``), input-grad hooks, parameter counts."""
    inputs = hf_inputs(name)

    def logits() -> Any:
        with torch.no_grad():
            return model.eval()(**inputs).logits

    def deepcopied() -> Any:
        clone = copy.deepcopy(model)
        with torch.no_grad():
            out = clone.eval()(**inputs).logits
        return structure(clone), clone.state_dict(), out

    record("deepcopy", deepcopied)
    record(
        "num_parameters",
        lambda: (model.num_parameters(), model.num_parameters(only_trainable=True)),
    )
    record("memory footprint", model.get_memory_footprint)

    def swap_embeddings() -> Any:
        old = model.get_input_embeddings()
        model.set_input_embeddings(copy.deepcopy(old))
        out = structure(model), logits()
        model.set_input_embeddings(old)
        return out

    record("set_input_embeddings", swap_embeddings)
    record(
        "resize_token_embeddings",
        lambda: (
            type(model.resize_token_embeddings(VOCAB + 8)).__name__,
            structure(model),
            model.state_dict(),
        ),
    )
    record("logits after resize", logits)

    def checkpointing() -> Any:
        if not model.supports_gradient_checkpointing:
            return None
        hf_method(model, "activation_checkpointing_enable", "gradient_checkpointing_enable")()
        flags_on = [
            (k, getattr(m, "gradient_checkpointing", None)) for k, m in model.named_modules()
        ]
        model.train()
        torch.manual_seed(6)
        loss = model(**inputs, **labels_for(name, inputs)).loss
        loss.backward()
        out = flags_on, loss.detach(), grads(model)
        hf_method(model, "activation_checkpointing_disable", "gradient_checkpointing_disable")()
        model.zero_grad()
        return out

    record("gradient checkpointing", checkpointing)

    def input_grads() -> Any:
        model.enable_input_require_grads()
        model.train()
        torch.manual_seed(7)
        out = model(**inputs).logits
        model.disable_input_require_grads()
        return out.requires_grad, out

    record("enable_input_require_grads", input_grads)


def native_route_frames(model: nn.Module) -> set[str]:
    """torch's ``module.py`` functions entered by whole-tree calls at ``model``."""

    def calls() -> None:
        model.load_state_dict(model.state_dict())
        list(model.named_parameters())
        list(model.named_modules())
        list(model.buffers())
        model.train()
        model.eval()
        model.zero_grad()
        model.float()
        model.requires_grad_(True)

    return torch_frames(calls)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "t5", "qwen2", "mixtral"])
def test_hf_root(name: str, tf: Any, tmp_path: Path) -> None:
    def check_stock(template: nn.Module) -> None:
        mro = type(template).__mro__
        assert mro.index(nn.Module) < len(mro) - 2, "a mixin root: bases after nn.Module"
        # A stock root runs torch's bodies, which enter these helpers.
        assert TORCH_HELPERS <= native_route_frames(template)

    def check_fast(template: nn.Module, fast: nn.Module) -> None:
        assert not NATIVE or _core.call_handover(fast) is None
        # No class of the tree is limited (the mixins after nn.Module define
        # neither __setattr__ nor __delattr__).
        assert fm016(fast) == []
        # The root really runs the native whole-tree bodies: none of torch's
        # helpers is entered (before 0252908 the root ran torch's).
        assert not NATIVE or native_route_frames(template).isdisjoint(TORCH_HELPERS)

    stock_then_fast(
        hf_models(tf)[name],
        lambda model, run: hf_scenario(name, model, tmp_path / run),
        check_stock,
        check_fast,
    )


# --------------------------------------------------------------------------- PEFT


def lora_scenario(
    peft: Any, model: nn.Module, folder: Path, base: Callable[[], nn.Module]
) -> Recorder:
    """A LoRA-wrapped Llama (``PeftModel`` -> ``LoraModel`` -> the HF mixin root,
    whose targeted ``Linear``s peft replaced through ``setattr``)."""
    record = Recorder()
    inputs = hf_inputs("llama")
    record("structure", lambda: structure(model))
    record("state_dict", model.state_dict)
    record("trainable", lambda: [(k, p.requires_grad) for k, p in model.named_parameters()])
    record("nb trainable", model.get_nb_trainable_parameters)
    modes(model, record)
    model.eval()

    def forward() -> Any:
        with torch.no_grad():
            return model(**inputs).logits

    record("eval forward", forward)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    record(
        "generate",
        lambda: model.generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=5,
            do_sample=False,
        ),
    )

    def backward() -> Any:
        model.train()
        model.requires_grad_(False)
        for k, p in model.named_parameters():
            p.requires_grad_("lora_" in k)
        torch.manual_seed(3)
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        out = {"loss": loss.detach(), "grads": grads(model)}
        model.zero_grad()
        out["after zero_grad"] = grads(model)
        return out

    record("backward, zero_grad()", backward)
    model.eval()
    record("disabled adapter forward", lambda: _with_disabled(model, forward))
    load_cases(model, record)

    def save_and_load() -> Any:
        model.save_pretrained(folder)
        files = {
            p.name: p.read_bytes()
            for p in sorted(folder.iterdir())
            if p.is_file() and p.suffix != ".md"  # the model card
        }
        loaded = peft.PeftModel.from_pretrained(seeded(base, 7), folder).eval()
        with torch.no_grad():
            logits = loaded(**inputs).logits
        return files, loaded.state_dict(), logits, structure(loaded)

    record("save_pretrained/from_pretrained", save_and_load)

    def merged() -> Any:
        out = model.merge_and_unload()
        with torch.no_grad():
            logits = out(**inputs).logits
        return type(out).__name__, structure(out), out.state_dict(), logits

    record("merge_and_unload", merged)
    conversions(model, record)
    return record


def _with_disabled(model: Any, fn: Callable[[], Any]) -> Any:
    with model.disable_adapter():
        return fn()


def lora(peft: Any, model: nn.Module) -> nn.Module:
    torch.manual_seed(5)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
    )
    return peft.get_peft_model(model, config)


def test_peft_lora(tf: Any, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    llama = hf_models(tf)["llama"]

    def check_fast(template: nn.Module, fast: nn.Module) -> None:
        # PeftModel and LoraModel read names through their own __getattr__; no
        # class is limited by a mixin after nn.Module (HF's, nor LoraLayer and
        # BaseTunerLayer after nn.Module in peft's LoRA Linear).
        limits = fm016(fast)
        assert limits and all("__getattr__" in m for m in limits), limits
        assert not any("after torch.nn.Module" in m for m in limits), limits
        if NATIVE:
            assert native_route_frames(template.base_model.model).isdisjoint(TORCH_HELPERS)

    # peft replaces the targeted layers of fast instances (the block accelerates
    # their classes); the whole wrapped tree is fast for the scenario.
    stock_then_fast(
        lambda: lora(peft, seeded(llama)),
        lambda model, run: lora_scenario(peft, model, tmp_path / run, llama),
        check_fast=check_fast,
    )


# --------------------------------------------------------------------------- Lightning


@pytest.fixture
def quiet_lightning() -> Iterator[Any]:
    """lightning, its info logging ("GPU available: ...") quiet for the test."""
    lightning = pytest.importorskip("lightning")
    loggers = [logging.getLogger(n) for n in ("lightning", "lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield lightning
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def lit_class(lightning: Any) -> type[nn.Module]:
    """A ``LightningModule`` (mixins before ``nn.Module``: ``_DeviceDtypeModuleMixin``
    overriding ``to``/``half``/..., ``HyperparametersMixin``, the hooks) wrapping a
    GPT-2 (a mixin root below it), counting the hooks the Trainer calls."""

    class LitLM(lightning.LightningModule):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model
            self.head = nn.Linear(32, 3)
            self.losses: list[torch.Tensor] = []
            self.calls: list[str] = []

        def forward(self, ids: torch.Tensor) -> Any:
            return self.model(input_ids=ids, labels=ids)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (ids,) = batch
            self.calls.append(f"training_step {batch_idx} {self.training}")
            loss = self(ids).loss
            self.losses.append(loss.detach())
            return loss

        def on_train_start(self) -> None:
            self.calls.append(f"on_train_start {flags(self)}")

        def on_train_end(self) -> None:
            self.calls.append(f"on_train_end {flags(self)}")

        def on_before_zero_grad(self, optimizer: Any) -> None:
            self.calls.append(f"zero_grad {sorted(k for k, g in grads(self).items() if g is None)}")

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return LitLM


def lightning_scenario(lightning: Any, model: nn.Module) -> Recorder:
    record = Recorder()
    g = torch.Generator().manual_seed(13)
    data = torch.utils.data.TensorDataset(torch.randint(3, VOCAB, (6, 8), generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    record("structure", lambda: structure(model))

    def fit() -> Any:
        trainer = lightning.Trainer(
            max_steps=2,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        torch.manual_seed(4)
        trainer.fit(model, loader)
        momenta = trainer.optimizers[0].state_dict()["state"]
        return trainer.global_step, trainer.state.finished, momenta

    record("fit", fit)
    record("losses", lambda: model.losses)
    record("calls", lambda: model.calls)
    record("flags after fit", lambda: flags(model))
    record("grads after fit", lambda: grads(model))
    record("state_dict after fit", model.state_dict)
    record("structure after fit", lambda: structure(model))
    modes(model, record)
    conversions(model, record)
    load_cases(model, record)
    return record


def test_lightning_fit(tf: Any, quiet_lightning: Any) -> None:
    lightning = quiet_lightning
    LitLM = lit_class(lightning)
    gpt2 = hf_models(tf)["gpt2"]

    def check_fast(template: nn.Module, fast: nn.Module) -> None:
        assert fm016(fast) == []
        assert not NATIVE or native_route_frames(template).isdisjoint(TORCH_HELPERS)

    stock_then_fast(
        lambda: LitLM(gpt2()),
        lambda model, run: lightning_scenario(lightning, model),
        check_fast=check_fast,
    )


# --------------------------------------------------------------------------- synthetic mixins


def describe(x: Any) -> Any:
    """An argument as a log shows it: kinds, shapes and names, never identities (a
    memo set by its size, a state dict by its keys at the time of the call)."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, nn.Module):
        return ("module", type(x).__name__)
    if x is None or isinstance(x, str | int | float | bool | torch.dtype | torch.device):
        return x
    if isinstance(x, dict):
        return (type(x).__name__, [(k, describe(v)) for k, v in x.items()])
    if isinstance(x, list | tuple):
        return (type(x).__name__, [describe(v) for v in x])
    if isinstance(x, set):
        return ("set", len(x))
    return type(x).__name__


# Everything nn.Module's class dict holds but the names a mixin after it can still
# be reached through (super().__setattr__/__delattr__, tested separately) and what
# every class has.
NOT_SHADOWED = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"}
SUPER_REACHED = {"__setattr__", "__delattr__"}


def shadowed_mixin(log: list[Any]) -> type:
    """Meant to go after ``nn.Module``: defines every other name ``nn.Module``
    defines (whole-tree methods, ``_apply``, ``_save_to_state_dict``, hook
    registration, ``__call__``, ``__getattr__``, ``__init__``, ``call_super_init``,
    ...), each shadowed by ``nn.Module``'s: any call logs. Its ``__init_subclass__``
    (``nn.Module`` defines none) is the one subclasses get."""
    holder: list[type] = []

    def sentinel(name: str) -> Callable[..., Any]:
        def method(*args: Any, **kwargs: Any) -> Any:
            log.append(("shadowed method called", name))
            return ("shadowed", name)

        method.__name__ = name
        return method

    ns: dict[str, Any] = {}
    for name, value in vars(nn.Module).items():
        if name in NOT_SHADOWED | SUPER_REACHED:
            continue
        ns[name] = sentinel(name) if callable(value) else ("shadowed", name)

    def __init_subclass__(cls: type, tag: Any = None, **kwargs: Any) -> None:
        log.append(("__init_subclass__", cls.__name__, tag))
        super(holder[0], cls).__init_subclass__(**kwargs)  # type: ignore[misc]

    ns["__init_subclass__"] = __init_subclass__
    ns["mixin_helper"] = lambda self: ("helper", type(self).__name__)
    holder.append(type("Shadowed", (), ns))
    return holder[0]


# Methods a mixin before nn.Module overrides (each logs, then calls super()): torch's
# code calls them on each module; the native walks must call them exactly there.
OVERRIDABLE = [
    name
    for name in (
        "state_dict",
        "_save_to_state_dict",
        "load_state_dict",
        "_load_from_state_dict",
        "_named_members",
        "named_parameters",
        "parameters",
        "named_buffers",
        "buffers",
        "named_modules",
        "modules",
        "named_children",
        "children",
        "train",
        "eval",
        "requires_grad_",
        "zero_grad",
        "apply",
        "_apply",
        "to",
        "float",
        "half",
        "double",
        "cpu",
        "type",
        "get_submodule",
        "get_parameter",
        "get_buffer",
        "register_buffer",
        "register_parameter",
        "add_module",
        "register_module",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_state_dict_pre_hook",
        "register_load_state_dict_post_hook",
        "extra_state",  # get_extra_state and set_extra_state
    )
    if name == "extra_state" or hasattr(nn.Module, name)
]


def overriding_mixin(log: list[Any], names: Any) -> type:
    """Meant to go before ``nn.Module``: overrides ``names`` (of OVERRIDABLE), each
    logging its arguments and returning what ``super()``'s returns."""
    holder: list[type] = []

    def override(name: str) -> Callable[..., Any]:
        def method(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            log.append((type(self).__name__, name, describe(args), describe(kwargs)))
            return getattr(super(holder[0], self), name)(*args, **kwargs)

        method.__name__ = name
        return method

    ns: dict[str, Any] = {n: override(n) for n in names if n != "extra_state"}
    if "extra_state" in names:

        def get_extra_state(self: nn.Module) -> Any:
            log.append((type(self).__name__, "get_extra_state"))
            return {"kind": type(self).__name__}

        def set_extra_state(self: nn.Module, state: Any) -> None:
            log.append((type(self).__name__, "set_extra_state", describe(state)))

        ns["get_extra_state"] = get_extra_state
        ns["set_extra_state"] = set_extra_state
    holder.append(type("Overriding", (), ns))
    return holder[0]


def setattr_mixin(log: list[Any]) -> type:
    class SetattrMixin:
        def __setattr__(self, name: str, value: Any) -> None:
            log.append(("__setattr__", type(self).__name__, name, describe(value)))
            super().__setattr__(name, value)

    return SetattrMixin


def delattr_mixin(log: list[Any]) -> type:
    class DelattrMixin:
        def __delattr__(self, name: str) -> None:
            log.append(("__delattr__", type(self).__name__, name))
            super().__delattr__(name)

    return DelattrMixin


def inherited_setattr_mixin(log: list[Any]) -> type:
    """Defines nothing itself: its base's ``__setattr__`` is what ``super()`` finds."""

    class Inherited(setattr_mixin(log)):  # type: ignore[misc]
        pass

    return Inherited


class PlainMixin:
    """As Hugging Face's: helpers only, no name nn.Module defines."""

    def helper(self) -> str:
        return type(self).__name__


AFTER_KINDS: dict[str, Callable[[list[Any]], type]] = {
    "plain": lambda log: PlainMixin,
    "shadowed": shadowed_mixin,
    "setattr": setattr_mixin,
    "delattr": delattr_mixin,
    "inherited setattr": inherited_setattr_mixin,
}
# After-kinds under which torch's __setattr__/__delattr__ reach Python code through
# super(): the instance is not fast (FM016), so everything stays torch's.
SUPER_KINDS = {"setattr", "delattr", "inherited setattr"}
# Mixins that may also go before nn.Module (each a fresh class): then the class's
# own m.x = v / del m.x run them first (FM016), and they reach torch's through super().
BEFORE_KINDS = sorted(SUPER_KINDS)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A tree's classes, for the root and for its leaf class: an overriding mixin
    before nn.Module where ``*_overrides`` is not empty, then mixins of the kinds
    ``*_before``, nn.Module, and mixins of the kinds ``*_after`` (in this order)."""

    root_after: tuple[str, ...] = ()
    leaf_after: tuple[str, ...] = ()
    root_overrides: tuple[str, ...] = ()
    leaf_overrides: tuple[str, ...] = ()
    root_before: tuple[str, ...] = ()
    leaf_before: tuple[str, ...] = ()

    def after(self) -> set[str]:
        return set(self.root_after) | set(self.leaf_after)

    def limited(self) -> set[str]:
        """The classes FM016 names: a mixin's __setattr__/__delattr__ runs first
        (before) or is what super() reaches (after)."""
        return {
            name
            for name, kinds in (
                ("Root", self.root_before + self.root_after),
                ("Leaf", self.leaf_before + self.leaf_after),
            )
            if SUPER_KINDS & set(kinds)
        }


def make_classes(spec: Spec, log: list[Any]) -> tuple[type[nn.Module], type[nn.Module]]:
    """Fresh classes for ``spec`` (so the stock and the fast run never share one)."""

    def bases(
        overrides: tuple[str, ...], before: tuple[str, ...], after: tuple[str, ...]
    ) -> tuple[type, ...]:
        first = (overriding_mixin(log, overrides),) if overrides else ()
        return (
            *first,
            *(AFTER_KINDS[k](log) for k in before),
            nn.Module,
            *(AFTER_KINDS[k](log) for k in after),
        )

    def leaf_init(self: nn.Module) -> None:
        super(Leaf, self).__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 3))

    def leaf_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale

    Leaf = type(
        "Leaf",
        bases(spec.leaf_overrides, spec.leaf_before, spec.leaf_after),
        {"__init__": leaf_init, "forward": leaf_forward},
    )

    def root_init(self: nn.Module) -> None:
        super(Root, self).__init__()
        self.a = Leaf()
        self.seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), Leaf())
        self.shared = self.a
        self.p = nn.Parameter(torch.randn(3))
        self.register_buffer("buf", torch.arange(3.0))
        self.register_buffer("tmp", torch.ones(3), persistent=False)
        self.plain = 1

    def root_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.seq(self.a(x)) * self.p + self.buf

    Root = type(
        "Root",
        bases(spec.root_overrides, spec.root_before, spec.root_after),
        {"__init__": root_init, "forward": root_forward},
    )
    return Root, Leaf


def synthetic_scenario(model: nn.Module, log: list[Any]) -> Recorder:
    """A tree of mixin classes through every whole-tree method, registration,
    hooks, forward and backward; each step's log (overrides and mixin calls)
    compared too."""
    record = Recorder(log)
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    record("structure", lambda: structure(model))
    record("state_dict", model.state_dict)
    record("state_dict via C", lambda: via_c("state_dict", model))
    record("state_dict prefix keep_vars", lambda: model.state_dict(prefix="r.", keep_vars=True))
    record("flags", lambda: flags(model))
    modes(model, record)

    def hooked() -> Any:
        calls: list[Any] = []
        handles = [
            model.register_forward_pre_hook(lambda m, a: calls.append(("pre", type(m).__name__))),
            model.register_forward_hook(lambda m, a, o: calls.append(("post", describe(o)))),
            model.a.register_forward_hook(lambda m, a, o: calls.append(("leaf", describe(o)))),
            model.register_state_dict_pre_hook(lambda *a: calls.append("sd pre")),
        ]
        y = model(x)
        sd = model.state_dict()
        for h in handles:
            h.remove()
        return calls, y, list(sd), model(x)

    record("hooks", hooked)

    def backward(set_to_none: bool) -> Any:
        model.train()
        y = model(x)
        y.sum().backward()
        out = {"y": y, "grads": grads(model)}
        model.zero_grad(set_to_none=set_to_none)
        out["after"] = grads(model)
        return out

    record("backward zero_grad(False)", lambda: backward(False))
    record("backward zero_grad()", lambda: backward(True))
    record("get_submodule", lambda: type(model.get_submodule("seq.2.lin")).__name__)
    record("get_parameter", lambda: model.get_parameter("a.lin.weight"))
    record("get_buffer", lambda: model.get_buffer("seq.2.scale"))
    record("get_submodule missing", lambda: model.get_submodule("seq.9"))
    record("get_parameter not one", lambda: model.get_parameter("buf"))
    load_cases(model, record)
    conversions(model, record)
    record("eval forward", lambda: model.eval()(x))
    registration_cases(model, record, "a")
    record("leaf registrations", lambda: _leaf_registrations(model.a))
    record("helpers", lambda: [getattr(m, "helper", lambda: None)() for m in model.modules()])
    record("structure at the end", lambda: structure(model))
    record("state_dict at the end", model.state_dict)
    return record


def _leaf_registrations(leaf: nn.Module) -> Any:
    leaf.extra = nn.Parameter(torch.zeros(1))
    leaf.other = nn.Identity()
    leaf.plain = "x"
    del leaf.other
    leaf.extra = None
    del leaf.plain
    leaf.training = False
    return registries(leaf), leaf.training


def assert_synthetic_parity(spec: Spec) -> None:
    """``spec``'s tree observed on stock classes, then on fresh classes of the same
    spec accelerated (the fast tree built inside the block): everything equal, the
    logs included."""
    log: list[Any] = []
    Root, _ = make_classes(spec, log)
    expected_classes = list(log)
    log.clear()
    stock, expected_build = built(Root, log)
    expected = synthetic_scenario(stock, log)
    assert not any(
        entry[0] == "shadowed method called"
        for step in expected.steps.values()
        for entry in step[2]
    )

    log.clear()
    Root, _ = make_classes(spec, log)
    assert log == expected_classes
    template = Root()
    log.clear()
    with fastmodule.accelerated(template):
        assert all(fastmodule.is_accelerated(m) for m in template.modules()) is NATIVE
        log.clear()
        fast, got_build = built(Root, log)
        limited = {
            f.message.split(":")[0].removeprefix("class ")
            for f in fastmodule.audit(fast).findings
            if f.code == "FM016"
        }
        # FM016 exactly where a mixin's __setattr__/__delattr__ runs.
        assert limited == spec.limited(), spec
        if not (spec.after() & SUPER_KINDS or spec.root_overrides or spec.leaf_overrides):
            assert not NATIVE or native_route_frames(template).isdisjoint(TORCH_HELPERS)
        log.clear()
        got = synthetic_scenario(fast, log)
    same(got_build, expected_build, "construction")
    assert_same_steps(got, expected)


ALL_AFTER = ("plain", "shadowed")
SPECS = {
    "shadowed after": Spec(("shadowed",), ("shadowed",)),
    "hf-like": Spec(("shadowed", "plain"), ("plain",), tuple(OVERRIDABLE), ()),
    "overrides at root": Spec(root_overrides=tuple(OVERRIDABLE)),
    "overrides at leaf": Spec(leaf_overrides=tuple(OVERRIDABLE)),
    "overrides both, shadowed after": Spec(
        ("shadowed",), ("shadowed",), tuple(OVERRIDABLE), tuple(OVERRIDABLE)
    ),
    "setattr after": Spec(("setattr",), ("setattr",)),
    "delattr after": Spec(("delattr",), ("delattr",)),
    "setattr after root only": Spec(("setattr",), ()),
    "delattr after leaf only": Spec((), ("delattr",)),
    "inherited setattr": Spec(("plain", "inherited setattr"), ("inherited setattr",)),
    "all after": Spec(
        ("shadowed", "setattr", "delattr", "plain"), ("delattr", "shadowed", "setattr")
    ),
    "overrides and setattr after": Spec(
        ("setattr", "shadowed"), ("delattr",), tuple(OVERRIDABLE), tuple(OVERRIDABLE)
    ),
    "setattr before": Spec(root_before=("setattr",), leaf_before=("setattr",)),
    "delattr before, shadowed after": Spec(
        ("shadowed",), ("shadowed",), root_before=("delattr",), leaf_before=("delattr",)
    ),
    "setattr before and after": Spec(
        ("setattr",), ("delattr",), root_before=("setattr",), leaf_before=("inherited setattr",)
    ),
}


@pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
def test_synthetic_mixins(spec: Spec) -> None:
    assert_synthetic_parity(spec)


AFTER_LISTS = st.lists(st.sampled_from(sorted(AFTER_KINDS)), unique=True, max_size=3).map(tuple)
BEFORE_LISTS = st.lists(st.sampled_from(BEFORE_KINDS), unique=True, max_size=2).map(tuple)
OVERRIDE_SETS = st.lists(st.sampled_from(OVERRIDABLE), unique=True, max_size=6).map(tuple)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    root_after=AFTER_LISTS,
    leaf_after=AFTER_LISTS,
    root_overrides=OVERRIDE_SETS,
    leaf_overrides=OVERRIDE_SETS,
    root_before=BEFORE_LISTS,
    leaf_before=BEFORE_LISTS,
)
def test_random_mixins(
    root_after: tuple[str, ...],
    leaf_after: tuple[str, ...],
    root_overrides: tuple[str, ...],
    leaf_overrides: tuple[str, ...],
    root_before: tuple[str, ...],
    leaf_before: tuple[str, ...],
) -> None:
    """Random mixins after nn.Module (in any order), random overrides and
    __setattr__/__delattr__ mixins before it, at the root and at its leaf class."""
    assert_synthetic_parity(
        Spec(root_after, leaf_after, root_overrides, leaf_overrides, root_before, leaf_before)
    )


def runtime_scenario(fast: bool) -> list[Any]:
    """Mixins after nn.Module changed at run time, each followed by registrations,
    train/eval and loads on a live tree: ``__setattr__``/``__delattr__`` assigned to
    and deleted from an empty mixin, the root's ``__bases__`` reassigned, and the
    same after the classes' version tags were used up (CPython 3.12+ gives a class
    at most 1000), so nothing remembered about a class may outlive a change."""
    log: list[Any] = []

    class Empty:
        pass

    class Other:
        pass

    Counting = setattr_mixin(log)

    def set_logged(self: Any, name: str, value: Any) -> None:
        log.append(("assigned __setattr__", type(self).__name__, name, describe(value)))
        super(Empty, self).__setattr__(name, value)

    def del_logged(self: Any, name: str) -> None:
        log.append(("assigned __delattr__", type(self).__name__, name))
        super(Empty, self).__delattr__(name)

    class Leaf(nn.Module, Empty):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

    class Root(nn.Module, Other):
        def __init__(self) -> None:
            super().__init__()
            self.leaf = Leaf()
            self.seq = nn.Sequential(Leaf(), nn.ReLU())

    template = Root()
    ctx = fastmodule.accelerated(template) if fast else contextlib.nullcontext()
    out: list[Any] = []
    with ctx:
        root = seeded(Root)

        def ops(tag: str) -> None:
            record = Recorder(log)
            record("train", lambda: flags(root.train()))
            record("eval", lambda: flags(root.eval()))
            record("set plain", lambda: setattr(root.leaf, "x", 1))
            record("del plain", lambda: delattr(root.leaf, "x"))
            record("set module", lambda: setattr(root.leaf, "m", nn.Identity()))
            record("del module", lambda: delattr(root.leaf, "m"))
            record("root set plain", lambda: setattr(root, "y", 2))
            record("root del plain", lambda: delattr(root, "y"))
            record("load", lambda: tuple(root.load_state_dict(root.state_dict())))
            record("names", lambda: structure(root))
            record("new leaf", lambda: registries(Leaf()))
            out.append((tag, record.steps))

        def use_up_versions() -> None:
            for i in range(1100):
                Empty.counter = Other.counter = i
                # A lookup gives the class (and its bases) a new version tag.
                assert Root.counter == Leaf.counter == i

        ops("plain")
        Empty.__setattr__ = set_logged  # type: ignore[method-assign,assignment]
        ops("__setattr__ assigned")
        Empty.__delattr__ = del_logged  # type: ignore[method-assign,assignment]
        ops("both assigned")
        del Empty.__setattr__
        ops("__setattr__ deleted")
        del Empty.__delattr__
        ops("both deleted")
        Root.__bases__ = (nn.Module, Counting)
        ops("root's bases: setattr mixin")
        Root.__bases__ = (nn.Module, Other)
        ops("root's bases back")
        use_up_versions()
        ops("versions used up")
        Empty.__setattr__ = set_logged  # type: ignore[method-assign,assignment]
        ops("versions used up, __setattr__ assigned")
        del Empty.__setattr__
        ops("versions used up, __setattr__ deleted")
        Other.__delattr__ = del_logged  # type: ignore[method-assign,assignment]
        ops("other mixin's __delattr__ assigned")
    return out


def test_mixins_changed_at_run_time() -> None:
    expected = runtime_scenario(fast=False)
    got = runtime_scenario(fast=True)
    assert [tag for tag, _ in got] == [tag for tag, _ in expected]
    for (tag, g), (_, e) in zip(got, expected, strict=True):
        same(g, e, tag)
    # The assigned methods were really reached (the scenario means something).
    assert any(s[2] for tag, steps in expected if "assigned" in tag for s in steps.values())


def install_scenario(tf: Any, installed: bool) -> Recorder:
    """Classes defined while ``fastmodule.install()`` is in effect (accelerated through
    ``nn.Module.__init_subclass__``): a mixin after nn.Module still gets its
    ``__init_subclass__`` call with the class keyword, errors for unknown keywords
    are stock's, and so are the trees; the same for a subclass of an HF root
    (``PreTrainedModel.__init_subclass__`` first)."""
    log: list[Any] = []
    record = Recorder(log)
    if installed:
        fastmodule.install()
    try:
        Shadowed = shadowed_mixin(log)

        class Root(nn.Module, Shadowed, tag="root"):  # type: ignore[call-arg]
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(2, 2)

        def sub() -> Any:
            class Sub(Root, tag="sub"):  # type: ignore[call-arg]
                pass

            return registries(Sub()), fastmodule.is_accelerated(Sub())

        def bad() -> None:
            class Bad(Root, unknown=1):  # type: ignore[call-arg]
                pass

        def hf_sub() -> Any:
            class TinyGPT2(tf.GPT2LMHeadModel):
                pass

            config = tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=16)
            model = seeded(lambda: TinyGPT2(config)).eval()
            own = {k: describe(v) for k, v in vars(TinyGPT2).items() if k not in NOT_SHADOWED}
            with torch.no_grad():
                logits = model(torch.arange(6).reshape(1, 6)).logits
            return own, structure(model), logits, fastmodule.is_accelerated(model)

        record("root", lambda: (registries(seeded(Root)), fastmodule.is_accelerated(Root())))
        record("subclass with a keyword", sub)
        record("subclass with an unknown keyword", bad)
        record("HF subclass", hf_sub)
        record("tree", lambda: structure(seeded(Root)))
    finally:
        if installed:
            fastmodule.uninstall()
    return record


def test_install_mixin_init_subclass(tf: Any) -> None:
    expected = install_scenario(tf, installed=False)
    got = install_scenario(tf, installed=True)
    assert not fastmodule.installed()
    # The one intended difference: classes defined under install() are accelerated
    # (where a native path is on: else install() changes nothing).
    for name in ("root", "subclass with a keyword", "HF subclass"):
        (kind, value), warned, log = got.steps[name]
        assert kind == "ok" and value[-1] is NATIVE, name
        got.steps[name] = ((kind, (*value[:-1], False)), warned, log)
    assert_same_steps(got, expected)
    assert ("__init_subclass__", "Sub", "sub") in expected.steps["subclass with a keyword"][2]


def hiding_mixin() -> type:
    """``__getattribute__`` (nn.Module defines none, so a mixin's is the class's, before
    or after nn.Module): once ``hide`` is set, ``_parameters`` reads leave out ``frozen``."""

    class HideFrozen:
        def __getattribute__(self, name: str) -> Any:
            value = super().__getattribute__(name)
            if name == "_parameters" and super().__getattribute__("__dict__").get("hide"):
                return {k: v for k, v in value.items() if k != "frozen"}
            return value

    return HideFrozen


def hiding_scenario(position: str, fast: bool) -> Recorder:
    Hide = hiding_mixin()
    bases = (nn.Module, Hide) if position == "after" else (Hide, nn.Module)

    def init(self: nn.Module) -> None:
        super(Root, self).__init__()
        self.lin = nn.Linear(2, 2)
        self.frozen = nn.Parameter(torch.zeros(2))
        self.hide = True

    Root = type("Root", bases, {"__init__": init})
    record = Recorder()
    model = seeded(Root)
    ctx = fastmodule.accelerated(model) if fast else contextlib.nullcontext()
    with ctx:
        record("structure", lambda: structure(model))
        record("state_dict", model.state_dict)
        record("parameters", lambda: len(list(model.parameters())))
        load_cases(model, record)
        record("float", lambda: dtypes(model.double()))
    return record


@pytest.mark.parametrize("position", ["after", "before"])
def test_getattribute_mixin(position: str) -> None:
    """A mixin defining ``__getattribute__``: torch's whole-tree code reads
    ``self._parameters``/``_modules``/``__dict__`` through it."""
    expected = hiding_scenario(position, fast=False)
    got = hiding_scenario(position, fast=True)
    assert_same_steps(got, expected)
