"""``fastmodule.accelerate`` on torch's module database and on real model families.

Every observation is made on stock classes first (the oracle), then on an
identically seeded instance after ``fastmodule.accelerate``, and compared
exactly; every class accelerated by a test is restored by its teardown.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from tests.conftest import NATIVE, outcome
from tests.test_accelerate import (
    Accel,
    accelerating,
    no_leftovers,
    observed,
    same,
    via_c,
)

try:
    from torch.testing._internal.common_modules import module_db

    MODULE_DB_ERROR = ""
except Exception as e:  # noqa: BLE001 - any import failure means "not in this torch"
    module_db = []
    MODULE_DB_ERROR = f"torch.testing._internal.common_modules: {type(e).__name__}: {e}"

SAMPLES_PER_MODULE = 2


@pytest.fixture(autouse=True)
def _nothing_left_accelerated() -> Iterator[None]:
    """Fail (after cleaning up) any test that leaves a module class accelerated."""
    with no_leftovers():
        yield


@pytest.fixture
def accel() -> Iterator[Accel[Any]]:
    """``fastmodule.accelerate``, with every class it reached restored at teardown."""
    with accelerating() as go:
        yield go


# --------------------------------------------------------------------------- module_db


def fresh(x: Any) -> Any:
    """A copy of a (nested) input whose tensors are new leaves, so runs never share grads."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
        return type(x)(fresh(v) for v in x)
    if isinstance(x, dict):
        return {k: fresh(v) for k, v in x.items()}
    return x


def tensors_of(x: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) output, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, list | tuple):
        return [t for v in x for t in tensors_of(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors_of(v)]
    return []


def grads_of(model: nn.Module, inputs: Any) -> dict[str, Any]:
    """Gradients of every parameter (by name) and of every input tensor."""
    params = {
        k: None if p.grad is None else p.grad.clone()
        for k, p in nn.Module.named_parameters(model, remove_duplicate=False)
    }
    return {"params": params, "inputs": [t.grad for t in tensors_of(inputs)]}


class _Stopped(Exception):
    """A step raised: the observation ends there (the exception is recorded)."""


def observe_sample(cls: type[nn.Module], sample: Any, accel: Accel[Any] | None) -> list[Any]:
    """Construct ``cls`` for ``sample`` (seeded), accelerate it if ``accel`` is given,
    and record forward (train and eval), backward, state_dict and names, each as
    an :func:`observed` outcome. Stops at the first step that raises."""
    log: list[Any] = []

    def step(fn: Callable[[], Any], show: Callable[[Any], Any] = lambda v: v) -> Any:
        result, warned = observed(fn)
        log.append((result if result[0] == "raised" else ("ok", show(result[1])), warned))
        if result[0] == "raised":
            raise _Stopped
        return result[1]

    ctor, fwd = sample.constructor_input, sample.forward_input

    def build() -> nn.Module:
        torch.manual_seed(0)
        m = cls(*fresh(ctor.args), **fresh(ctor.kwargs))
        if accel is not None:
            accel(m)
            # (Where no native path is on, accelerate() changes nothing.)
            assert all(fastmodule.is_accelerated(s) for s in nn.Module.modules(m)) is NATIVE
        return m

    def forward(m: nn.Module, args: Any, kwargs: Any) -> Any:
        torch.manual_seed(1)
        return m(*args, **kwargs)

    try:
        m = step(build, repr)
        step(lambda: [k for k, _ in m.named_parameters()])
        step(lambda: [k for k, _ in via_c("named_parameters", m)])
        step(lambda: [(k, type(s).__name__) for k, s in via_c("named_modules", m)])
        step(lambda: m.state_dict())
        args, kwargs = fresh(fwd.args), fresh(fwd.kwargs)
        out = step(lambda: forward(m.train(), args, kwargs))
        outs = [t for t in tensors_of(out) if t.requires_grad]

        def backward() -> Any:
            if outs:
                sum(t.sum() for t in outs).backward()
            return grads_of(m, (args, kwargs))

        step(backward)
        step(lambda: type(m).__name__)  # lazy modules become their eager class
        step(lambda: via_c("state_dict", m))
        step(lambda: forward(m.eval(), fresh(fwd.args), fresh(fwd.kwargs)))
        step(lambda: [(k, s.training) for k, s in m.named_modules()])
        step(lambda: tuple(via_c("load_state_dict", m, m.state_dict())))
        step(lambda: via_c("_apply", m, lambda t: t.double()), dtypes)
    except _Stopped:
        pass
    return log


def dtypes(m: nn.Module) -> list[tuple[str, torch.dtype]]:
    return [(k, t.dtype) for k, t in m.state_dict(keep_vars=True).items()]


def db_params() -> list[Any]:
    if not module_db:
        return [pytest.param(None, marks=pytest.mark.skip(reason=MODULE_DB_ERROR), id="module_db")]
    return [pytest.param(info, id=info.name) for info in module_db]


def samples_for(info: Any) -> list[Any]:
    """The first sample inputs on CPU float32, or a skip with the reason."""
    try:
        gen = info.module_inputs_func(
            info, device="cpu", dtype=torch.float32, requires_grad=True, training=True
        )
        return list(itertools.islice(gen, SAMPLES_PER_MODULE))
    except Exception as e:  # noqa: BLE001 - any failure means "not on CPU float32"
        pytest.skip(f"module_inputs_func fails on CPU float32: {type(e).__name__}: {e}")


@pytest.mark.parametrize("info", db_params())
def test_module_db(info: Any, accel: Accel[Any]) -> None:
    if torch.float32 not in info.dtypes:
        pytest.skip(f"{info.name} does not support float32")
    samples = samples_for(info)
    if not samples:
        pytest.skip(f"{info.name} has no CPU float32 samples")
    expected = [observe_sample(info.module_cls, s, None) for s in samples]
    got = [observe_sample(info.module_cls, s, accel) for s in samples]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert len(g) == len(e), f"sample {i}: {g[-1]} vs {e[-1]}"
        for j, (gs, es) in enumerate(zip(g, e, strict=True)):
            same(gs, es, f"sample {i} ({samples[i].desc!r}) step {j}")


# --------------------------------------------------------------------------- real models


def build_twice(factory: Callable[[], nn.Module]) -> tuple[nn.Module, nn.Module]:
    """Two identically seeded instances, both built on stock classes, in eval mode."""
    torch.manual_seed(0)
    a = factory().eval()
    torch.manual_seed(0)
    b = factory().eval()
    return a, b


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def hf_observe(model: nn.Module, inputs: dict[str, torch.Tensor], save: Path) -> dict[str, Any]:
    """Outputs, state, and a save_pretrained/from_pretrained round trip of an HF model."""
    out: dict[str, Any] = {}
    with torch.no_grad():
        res = model(**inputs, output_hidden_states=True, use_cache=False)
    out["first"] = res[0]
    out["hidden"] = res.hidden_states
    out["keys"] = list(res.keys())
    out["sd"] = model.state_dict()
    out["c_sd"] = via_c("state_dict", model)
    out["names"] = [k for k, _ in via_c("named_parameters", model)]
    model.save_pretrained(save)
    out["files"] = files(save)
    loaded = type(model).from_pretrained(save).eval()
    out["loaded_accelerated"] = fastmodule.is_accelerated(loaded)
    with torch.no_grad():
        out["loaded"] = loaded(**inputs, use_cache=False)[0]
    out["loaded_sd"] = loaded.state_dict()
    return out


def hf_compare(
    factory: Callable[[], nn.Module],
    inputs: dict[str, torch.Tensor],
    accel: Accel[Any],
    tmp_path: Path,
    extra: Callable[[nn.Module], Any] | None = None,
) -> None:
    stock, fast = build_twice(factory)
    expected = hf_observe(stock, inputs, tmp_path / "stock")
    expected["extra"] = outcome(lambda: extra(stock)) if extra else None
    assert expected["loaded_accelerated"] is False
    accel(fast)
    assert all(fastmodule.is_accelerated(m) for m in fast.modules()) is NATIVE
    got = hf_observe(fast, inputs, tmp_path / "fast")
    got["extra"] = outcome(lambda: extra(fast)) if extra else None
    assert got.pop("loaded_accelerated") is NATIVE
    expected.pop("loaded_accelerated")
    same(got, expected)
    same(got["loaded"], got["first"])


@pytest.fixture
def quiet_transformers() -> Iterator[Any]:
    transformers = pytest.importorskip("transformers")
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        yield transformers
    finally:
        transformers.logging.set_verbosity(level)


def test_gpt2(quiet_transformers: Any, accel: Accel[Any], tmp_path: Path) -> None:
    tf = quiet_transformers
    config = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=64)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(5))

    def generate(model: nn.Module) -> torch.Tensor:
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )

    hf_compare(lambda: tf.GPT2LMHeadModel(config), {"input_ids": ids}, accel, tmp_path, generate)


def test_bert(quiet_transformers: Any, accel: Accel[Any], tmp_path: Path) -> None:
    tf = quiet_transformers
    config = tf.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=128,
    )
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 128, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    def pooled(model: nn.Module) -> Any:
        with torch.no_grad():
            return model(**inputs).pooler_output

    hf_compare(lambda: tf.BertModel(config), inputs, accel, tmp_path, pooled)


def timm_compare(factory: Callable[[], nn.Module], x: torch.Tensor, accel: Accel[Any]) -> None:
    def scenario(model: nn.Module) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with torch.no_grad():
            out["eval"] = model(x)
        out["sd"] = model.state_dict()
        out["c_sd"] = via_c("state_dict", model)
        out["names"] = [k for k, _ in via_c("named_parameters", model)]
        model.train()
        torch.manual_seed(2)
        y = model(x)
        y.sum().backward()
        out["train"] = y
        out["grads"] = {k: p.grad for k, p in model.named_parameters()}
        out["after_train_sd"] = model.state_dict()
        return out

    stock, fast = build_twice(factory)
    expected = scenario(stock)
    accel(fast)
    assert all(fastmodule.is_accelerated(m) for m in fast.modules()) is NATIVE
    same(scenario(fast), expected)


def test_timm_resnet18(accel: Accel[Any]) -> None:
    timm = pytest.importorskip("timm")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    timm_compare(lambda: timm.create_model("resnet18", pretrained=False, num_classes=10), x, accel)


def test_timm_vit(accel: Accel[Any]) -> None:
    timm = pytest.importorskip("timm")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(8))

    def factory() -> nn.Module:
        return timm.create_model(
            "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10
        )

    timm_compare(factory, x, accel)
