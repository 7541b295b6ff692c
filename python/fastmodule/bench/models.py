"""Real-model cases: HF transformers GPT-2 and BERT, timm resnet18 and a small ViT.

Each model is built from a config with random weights (nothing is
downloaded). The three columns time the very same model object:

- stock: torch's module machinery as installed;
- fast: the model under ``fastmodule.accelerated(model)`` (its classes
  accelerated for that column only: acceleration is per class);
- lower: every module call goes straight to ``forward`` (``nn.Module.__call__``
  replaced by a direct call for that column only): the same math without the
  module-call machinery.

Cases whose package is not installed are not offered.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fastmodule.acceleration import accelerated
from fastmodule.bench.case import Case, Variant, decode, direct_forward, have, sync_for

__all__ = ["MODEL_CASES", "bert_model", "gpt2_model", "resnet18_model", "vit_model"]


def _three_contexts(
    model: nn.Module, stmt: str, namespace: dict[str, Any], sync: Callable[[], None] | None
) -> dict[str, Variant]:
    @contextlib.contextmanager
    def stock() -> Iterator[None]:
        with torch.inference_mode():
            yield

    @contextlib.contextmanager
    def fast() -> Iterator[None]:
        with torch.inference_mode(), accelerated(model):
            yield

    @contextlib.contextmanager
    def lower() -> Iterator[None]:
        with torch.inference_mode(), direct_forward():
            yield

    return {
        "stock": Variant(stmt, namespace, stock, sync),
        "fast": Variant(stmt, namespace, fast, sync),
        "lower": Variant(stmt, namespace, lower, sync),
    }


def _checked(model: nn.Module, run: Callable[[], Any], same: Callable[[Any, Any], bool]) -> None:
    """The three ways of running ``model`` give the same result."""
    with torch.inference_mode():
        ref = run()
        with accelerated(model):
            fast = run()
        with direct_forward():
            lower = run()
    if not (same(ref, fast) and same(ref, lower)):
        raise RuntimeError("stock, fast and lower bound disagree")


def gpt2_model(device: torch.device) -> nn.Module:
    """HF GPT-2 LM head: 12 small layers (64 wide, 4 heads), 1000 tokens, seed 0."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    # Its special tokens inside this small vocabulary (the defaults, 50256, are not).
    config = GPT2Config(
        n_layer=12,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=128,
        bos_token_id=999,
        eos_token_id=999,
    )
    return GPT2LMHeadModel(config).eval().to(device)


def _build_gpt2_forward(device: torch.device) -> dict[str, Variant]:
    model = gpt2_model(device)
    ids = torch.randint(0, 1000, (1, 8), device=device)

    def run() -> torch.Tensor:
        return model(ids, use_cache=False).logits

    _checked(model, run, torch.equal)
    variants = _three_contexts(model, "run()", {"run": run}, sync_for(device))
    # torch.compile of a stock copy (only timed with --compile).
    compiled = torch.compile(copy.deepcopy(model))

    def run_compiled() -> torch.Tensor:
        return compiled(ids, use_cache=False).logits

    variants["compiled"] = Variant(
        "run()", {"run": run_compiled}, torch.inference_mode, sync_for(device)
    )
    return variants


def _build_gpt2_decode(device: torch.device) -> dict[str, Variant]:
    model = gpt2_model(device)
    ids = torch.randint(0, 1000, (1, 8), device=device)

    def run() -> torch.Tensor:
        return decode(model, ids, 16)

    _checked(model, run, torch.equal)
    return _three_contexts(model, "run()", {"run": run}, sync_for(device))


def bert_model(device: torch.device) -> nn.Module:
    """HF BERT: 4 small layers (64 wide, 4 heads), 1000 tokens, seed 0."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
    )
    return BertModel(config).eval().to(device)


def _build_bert_forward(device: torch.device) -> dict[str, Variant]:
    model = bert_model(device)
    ids = torch.randint(0, 1000, (1, 16), device=device)

    def run() -> torch.Tensor:
        return model(ids).last_hidden_state

    _checked(model, run, torch.equal)
    return _three_contexts(model, "run()", {"run": run}, sync_for(device))


def resnet18_model(device: torch.device) -> nn.Module:
    """timm resnet18 with 10 classes, seed 0."""
    import timm

    torch.manual_seed(0)
    return timm.create_model("resnet18", pretrained=False, num_classes=10).eval().to(device)


def _build_resnet18_forward(device: torch.device) -> dict[str, Variant]:
    model = resnet18_model(device)
    x = torch.randn(1, 3, 64, 64, device=device)

    def run() -> torch.Tensor:
        return model(x)

    _checked(model, run, torch.equal)
    return _three_contexts(model, "run()", {"run": run}, sync_for(device))


def vit_model(device: torch.device) -> nn.Module:
    """timm ViT-tiny for 32x32 images in 8x8 patches, 10 classes, seed 0."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10
    )
    return model.eval().to(device)


def _build_vit_forward(device: torch.device) -> dict[str, Variant]:
    model = vit_model(device)
    x = torch.randn(1, 3, 32, 32, device=device)

    def run() -> torch.Tensor:
        return model(x)

    _checked(model, run, torch.equal)
    return _three_contexts(model, "run()", {"run": run}, sync_for(device))


MODEL_CASES: tuple[Case, ...] = tuple(
    case
    for case, package in (
        (
            Case(
                "gpt2_forward",
                "HF GPT-2 (12 layers, n_embd 64) forward, seq 8, batch 1; fastmodule.accelerate",
                _build_gpt2_forward,
                uses_device=True,
            ),
            "transformers",
        ),
        (
            Case(
                "gpt2_decode",
                "HF GPT-2 greedy decode of 16 tokens with the KV cache, batch 1",
                _build_gpt2_decode,
                uses_device=True,
            ),
            "transformers",
        ),
        (
            Case(
                "bert_forward",
                "HF BERT (4 layers, hidden 64) forward, seq 16, batch 1",
                _build_bert_forward,
                uses_device=True,
            ),
            "transformers",
        ),
        (
            Case(
                "resnet18_forward",
                "timm resnet18, 1x3x64x64, batch 1",
                _build_resnet18_forward,
                uses_device=True,
            ),
            "timm",
        ),
        (
            Case(
                "vit_forward",
                "timm ViT-Tiny (12 blocks, dim 192), 1x3x32x32 in 8x8 patches, batch 1",
                _build_vit_forward,
                uses_device=True,
            ),
            "timm",
        ),
    )
    if have(package)
)
