"""Factories for ``python -m fastmodule check``: the benchmark's real models
(``fastmodule.bench.models``: random weights from configs, nothing downloaded), each
with example inputs drawn as the benchmark draws them.

    python -m fastmodule check benches/check_models.py:gpt2
    python -m fastmodule check benches/check_models.py:resnet18 --train
"""

from __future__ import annotations

import torch
from torch import nn

from fastmodule.bench import models

CPU = torch.device("cpu")


def gpt2() -> tuple[nn.Module, dict[str, object]]:
    """HF GPT-2 LM head, 12 small layers, 8 token ids; logits only (no KV cache)."""
    model = models.gpt2_model(CPU)
    return model, {"input_ids": torch.randint(0, 1000, (1, 8)), "use_cache": False}


def bert() -> tuple[nn.Module, torch.Tensor]:
    """HF BERT, 4 small layers, 16 token ids."""
    return models.bert_model(CPU), torch.randint(0, 1000, (1, 16))


def resnet18() -> tuple[nn.Module, torch.Tensor]:
    """timm resnet18, 10 classes, one 64x64 image."""
    return models.resnet18_model(CPU), torch.randn(1, 3, 64, 64)


def vit() -> tuple[nn.Module, torch.Tensor]:
    """timm ViT-tiny on 32x32 images with 8x8 patches, 10 classes."""
    return models.vit_model(CPU), torch.randn(1, 3, 32, 32)
