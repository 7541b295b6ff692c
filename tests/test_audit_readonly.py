"""``fastmodule.audit`` only reads: no class code, hook or forward runs; and its
FM016 findings say what fastmodule itself decides for a class."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule.tools.audit.walk import native_limits
from tests.audit_support import audit_both

READS: list[str] = []


class Watched(nn.Module):
    """Records every attribute read through its own __getattribute__."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.plain = [nn.Linear(2, 2)]

    def __getattribute__(self, name: str) -> Any:
        READS.append(name)
        return super().__getattribute__(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the audit ran forward")


def test_no_class_code_hook_or_forward_runs() -> None:
    m = nn.Sequential(Watched(), nn.Linear(2, 2))

    def hook(*args: Any) -> None:
        raise AssertionError("the audit ran a hook")

    m.register_forward_pre_hook(hook)
    m[1].register_forward_hook(hook)
    READS.clear()
    report = fastmodule.audit(m)
    assert READS == []
    with fastmodule.accelerated(m):
        READS.clear()
        assert fastmodule.audit(m) == report
        assert READS == []
    assert report.codes() == ["FM001", "FM016"]
    assert audit_both(m) == report


class OwnCall(nn.Module):
    def __call__(self, *args: Any) -> Any:
        return super().__call__(*args)


class OwnGetattr(nn.Module):
    def __getattr__(self, name: str) -> Any:
        return super().__getattr__(name)


class OwnGetattribute(nn.Module):
    def __getattribute__(self, name: str) -> Any:
        return super().__getattribute__(name)


class OwnSetattr(nn.Module):
    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)


class OwnDelattr(nn.Module):
    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)


class Mixin:
    pass


class MixinAfter(nn.Module, Mixin):
    pass


class MixinBefore(Mixin, nn.Module):
    pass


class SetattrMixin:
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class SetattrMixinAfter(nn.Module, SetattrMixin):
    pass


class Plain(nn.Module):
    pass


CLASSES = [
    OwnCall,
    OwnGetattr,
    OwnGetattribute,
    OwnSetattr,
    OwnDelattr,
    MixinAfter,
    MixinBefore,
    SetattrMixinAfter,
]


def test_limits_name_the_reason() -> None:
    said = {cls: native_limits(cls) for cls in [*CLASSES, Plain]}
    assert said[OwnCall] == ["module calls run OwnCall.__call__"]
    assert said[OwnGetattr] == ["registered names are read through OwnGetattr.__getattr__"]
    assert said[OwnGetattribute] == ["attribute reads run OwnGetattribute.__getattribute__"]
    assert said[OwnSetattr] == ["m.x = v runs OwnSetattr.__setattr__"]
    assert said[OwnDelattr] == ["del m.x runs OwnDelattr.__delattr__"]
    # A mixin after torch.nn.Module loses nothing unless super().__setattr__ or
    # super().__delattr__ (which torch's own ends in) reaches it.
    assert said[MixinAfter] == said[MixinBefore] == said[Plain] == []
    [limit] = said[SetattrMixinAfter]
    assert "super().__setattr__ after torch.nn.Module is SetattrMixin's" in limit
    # torch's own classes: RNNBase keeps _flat_weights in step through __setattr__.
    assert native_limits(nn.LSTM) == ["m.x = v runs RNNBase.__setattr__"]
    assert native_limits(nn.Linear) == native_limits(nn.ParameterList) == []


def _core_paths_on() -> bool:
    on = {r.name: r.on for r in fastmodule.diagnostics()}
    return all(on.get(name) for name in ("module call", "attribute read", "registration"))


@pytest.mark.skipif(not _core_paths_on(), reason="fastmodule's core native paths are off here")
@pytest.mark.parametrize("cls", [*CLASSES, Plain], ids=lambda c: c.__name__)
def test_limits_agree_with_the_slots_fastmodule_installs(cls: type[nn.Module]) -> None:
    m = cls()
    with fastmodule.accelerated(m):
        call, getattr_, setattr_ = fastmodule.slots_of(cls)
    said = " ".join(native_limits(cls))
    assert call is not ("module calls" in said)
    assert getattr_ is not ("attribute reads" in said or "registered names" in said)
    assert setattr_ is not ("m.x = v" in said or "del m.x" in said)
