"""The example from fastmodule issue 18: a model whose layers live in a plain list and
whose mask is a plain tensor trains 50 AdamW steps with only its head's 17 numbers,
silently. ``fastmodule.audit`` reports both, with their fixes."""

from __future__ import annotations

import torch
from torch import nn

from tests.audit_example import FixedNet, Net
from tests.audit_support import audit_both


def train(model: nn.Module, steps: int = 50) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_the_bug_is_silent() -> None:
    model = Net()
    before = [layer.weight.detach().clone() for layer in model.layers]
    train(model)
    assert sum(p.numel() for p in model.parameters()) == 17
    assert all(torch.equal(layer.weight, w) for layer, w in zip(model.layers, before, strict=True))
    assert "mask" not in model.state_dict()


def test_audit_reports_the_list_and_the_tensor_with_their_fixes() -> None:
    report = audit_both(Net())
    assert not report.ok
    layers, mask = report.findings
    assert (layers.code, layers.severity, layers.where, layers.cls) == (
        "FM001",
        "error",
        "layers",
        "Net",
    )
    assert layers.message.startswith("3 modules in a plain list attribute 'layers'")
    assert "not trained" in layers.why and "not saved" in layers.why
    assert layers.fix == "use nn.ModuleList"
    assert (mask.code, mask.severity, mask.where) == ("FM005", "warning", "mask")
    assert mask.message == "tensor of shape (16,) kept as a plain attribute 'mask'"
    assert mask.fix.startswith("self.register_buffer('mask', tensor)")
    assert "persistent=False" in mask.fix
    assert report.summary()["parameter_elements"] == 17
    text = report.format()
    assert text.splitlines()[0].split()[:4] == ["layers", "Net", "FM001", "error"]
    assert text.splitlines()[-1] == (
        "Net: 2 modules, 2 parameters (17 elements), 0 buffers audited: 1 error, 1 warning, 0 info"
    )


def test_the_fixed_model_is_clean_and_trains_everything() -> None:
    model = FixedNet()
    report = audit_both(model)
    assert report.ok and report.findings == ()
    assert report.summary()["parameter_elements"] == 3 * (16 * 16 + 16) + 17
    before = [layer.weight.detach().clone() for layer in model.layers]
    train(model)
    assert not any(
        torch.equal(layer.weight, w) for layer, w in zip(model.layers, before, strict=True)
    )
    assert "mask" in model.state_dict()
