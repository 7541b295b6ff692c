"""Factories for ``python -m fastmodule check``: the real models of the benchmark
(random weights from configs, nothing downloaded), each with example inputs.

    python -m fastmodule check benches/check_models.py:gpt2
    python -m fastmodule check benches/check_models.py:resnet18 --train
"""

from __future__ import annotations

import torch
from torch import nn


def gpt2() -> tuple[nn.Module, dict[str, object]]:
    """HF GPT-2 LM head, 12 small layers, 8 token ids; logits only (no KV cache)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=12,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=128,
        bos_token_id=999,
        eos_token_id=999,
    )
    model = GPT2LMHeadModel(config).eval()
    return model, {"input_ids": torch.randint(0, 1000, (1, 8)), "use_cache": False}


def bert() -> tuple[nn.Module, torch.Tensor]:
    """HF BERT, 4 small layers, 16 token ids."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=1000,
    )
    return BertModel(config).eval(), torch.randint(0, 1000, (1, 16))


def resnet18() -> tuple[nn.Module, torch.Tensor]:
    """timm resnet18, 10 classes, one 64x64 image."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10).eval()
    return model, torch.randn(1, 3, 64, 64)


def vit() -> tuple[nn.Module, torch.Tensor]:
    """timm ViT-tiny on 32x32 images with 8x8 patches, 10 classes."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=10
    ).eval()
    return model, torch.randn(1, 3, 32, 32)
