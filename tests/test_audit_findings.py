"""Each kind of ``fastmodule.audit`` finding: present on a model with the bug, absent
on the same model written correctly; stock and accelerated give the same report."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import pytest
import torch
from torch import nn

from fastmodule.tools.audit import KINDS, Finding
from tests.audit_support import audit_both


class Body(nn.Module):
    """A correct model: every module, parameter and tensor registered."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))


def modules_in_list() -> nn.Module:
    m = Body()
    m.extra = [nn.Linear(4, 4), nn.ReLU()]
    return m


def modules_nested() -> nn.Module:
    m = Body()
    m.groups = {"enc": [nn.Linear(4, 4)], "dec": (nn.Linear(4, 4), {"x": nn.Linear(4, 4)})}
    return m


def modules_in_set() -> nn.Module:
    m = Body()
    m.pool = {nn.Linear(4, 4)}
    return m


def modules_registered() -> nn.Module:
    m = Body()
    m.extra = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])
    m.groups = nn.ModuleDict({"enc": nn.ModuleList([nn.Linear(4, 4)])})
    return m


def params_in_list() -> nn.Module:
    m = Body()
    m.gains = [nn.Parameter(torch.ones(4)) for _ in range(2)]
    return m


def params_registered() -> nn.Module:
    m = Body()
    m.gains = nn.ParameterList([nn.Parameter(torch.ones(4)) for _ in range(2)])
    return m


def tensors_in_dict() -> nn.Module:
    m = Body()
    m.tables = {"sin": torch.zeros(4), "cos": torch.zeros(4)}
    return m


def tensors_registered() -> nn.Module:
    m = Body()
    m.register_buffer("sin", torch.zeros(4))
    m.register_buffer("cos", torch.zeros(4), persistent=False)
    return m


def param_plain() -> nn.Module:
    m = Body()
    object.__setattr__(m, "gain", nn.Parameter(torch.ones(4)))
    return m


def param_registered() -> nn.Module:
    m = Body()
    m.gain = nn.Parameter(torch.ones(4))
    return m


def tensor_plain() -> nn.Module:
    m = Body()
    m.mask = torch.ones(4)
    return m


def module_plain() -> nn.Module:
    m = Body()
    object.__setattr__(m, "teacher", nn.Linear(4, 4))
    return m


def module_registered() -> nn.Module:
    m = Body()
    m.teacher = nn.Linear(4, 4)
    return m


def shadow_instance() -> nn.Module:
    m = Body()
    m.a.__dict__["weight"] = torch.zeros(4, 4)
    return m


def shadow_class() -> nn.Module:
    class Late(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("offset", torch.zeros(4))

    m = Late()
    Late.offset = 0.0  # a class of this test's own: nothing shared is patched
    return m


def cached_registered() -> nn.Module:
    m = Body()
    m.a.__dict__["weight"] = m.a._parameters["weight"]
    return m


def two_devices() -> nn.Module:
    m = Body()
    m.c = nn.Linear(4, 4, device="meta")
    return m


def two_dtypes() -> nn.Module:
    m = Body()
    m.c = nn.Linear(4, 4).double()
    return m


def buffer_with_grad() -> nn.Module:
    m = Body()
    m.register_buffer("bias", torch.zeros(4, requires_grad=True))
    return m


def buffer_plain() -> nn.Module:
    m = Body()
    m.register_buffer("bias", torch.zeros(4))
    return m


def tied() -> nn.Module:
    m = Body()
    m.b.weight = m.a.weight
    return m


def shared() -> nn.Module:
    m = Body()
    m.b = m.a
    return m


def alias_list() -> nn.Module:
    m = Body()
    m.hooked = [m.a, m.b.weight]
    return m


def computed() -> nn.Module:
    m = Body()
    m.cache = m.a(torch.ones(4))
    return m


class OwnGetattr(nn.Module):
    def __getattr__(self, name: str) -> object:
        return super().__getattr__(name)


def own_getattr() -> nn.Module:
    m = Body()
    m.c = OwnGetattr()
    return m


def ordered_registry() -> nn.Module:
    m = Body()
    m.a._parameters = OrderedDict(m.a._parameters)
    return m


class Helper:
    """A plain object (not a module) that holds a module and a parameter."""

    def __init__(self) -> None:
        self.proj = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.ones(4))


class HelperModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.ones(4))


def module_in_helper() -> nn.Module:
    m = Body()
    m.helper = Helper()
    del m.helper.gain
    return m


def param_in_helper() -> nn.Module:
    m = Body()
    m.helper = Helper()
    del m.helper.proj
    return m


def helper_registered() -> nn.Module:
    m = Body()
    m.helper = HelperModule()
    return m


Factory = Callable[[], nn.Module]
# code -> (models with the bug, the same models written correctly)
CASES: dict[str, tuple[list[Factory], list[Factory]]] = {
    "FM001": ([modules_in_list, modules_nested, modules_in_set], [modules_registered]),
    "FM002": ([params_in_list], [params_registered]),
    "FM003": ([tensors_in_dict], [tensors_registered]),
    "FM004": ([param_plain], [param_registered]),
    "FM005": ([tensor_plain], [tensors_registered]),
    "FM006": ([module_plain], [module_registered]),
    "FM007": ([shadow_instance, shadow_class], [Body]),
    "FM008": ([cached_registered], [Body]),
    "FM009": ([two_devices], [Body]),
    "FM010": ([two_dtypes], [Body]),
    "FM011": ([buffer_with_grad], [buffer_plain]),
    "FM012": ([tied], [Body]),
    "FM013": ([shared], [Body]),
    "FM014": ([alias_list], [Body]),
    "FM015": ([computed], [Body]),
    "FM016": ([own_getattr], [Body]),
    "FM017": ([ordered_registry], [Body]),
    "FM018": ([module_in_helper], [helper_registered]),
    "FM019": ([param_in_helper], [helper_registered]),
}


def test_every_kind_has_a_case() -> None:
    assert sorted(CASES) == sorted(KINDS)


def cases() -> list[object]:
    return [
        pytest.param(code, f, id=f"{code}-{f.__name__}")
        for code, (buggy, _) in CASES.items()
        for f in buggy
    ]


def fixed() -> list[object]:
    return [
        pytest.param(code, f, id=f"{code}-{f.__name__}")
        for code, (_, right) in CASES.items()
        for f in right
    ]


@pytest.mark.parametrize(("code", "factory"), cases())
def test_found_on_the_bug(code: str, factory: Factory) -> None:
    report = audit_both(factory())
    found = [f for f in report.findings if f.code == code]
    assert found, report.format()
    kind = KINDS[code]
    for f in found:
        assert f.severity == kind.severity
        assert f.message and f.why and f.fix
    # Each bug is only that bug (the correct Body beside it adds nothing).
    assert {f.code for f in report.findings} == {code}, report.format()


@pytest.mark.parametrize(("code", "factory"), fixed())
def test_absent_when_correct(code: str, factory: Factory) -> None:
    report = audit_both(factory())
    assert report.findings == (), report.format()


def only(factory: Factory, code: str) -> Finding:
    (finding,) = [f for f in audit_both(factory()).findings if f.code == code]
    return finding


def test_container_findings_name_every_place() -> None:
    f = only(modules_nested, "FM001")
    assert (f.path, f.attribute, f.cls) == ("", "groups", "Body")
    assert f.message.startswith("3 modules in a plain dict attribute 'groups'")
    assert "groups['enc'][0]" in f.message and "groups['dec'][1]['x']" in f.message
    assert f.fix.startswith("use nn.ModuleDict") and "nested" in f.fix
    assert only(modules_in_list, "FM001").fix == "use nn.ModuleList"
    assert only(params_in_list, "FM002").fix == "use nn.ParameterList"


def test_findings_are_placed_at_the_module_that_holds_them() -> None:
    f = only(shadow_instance, "FM007")
    assert (f.path, f.attribute, f.cls, f.where) == ("a", "weight", "Linear", "a.weight")
    assert "Tensor" in f.message and "registered parameter 'weight'" in f.message
    f = only(shadow_class, "FM007")
    assert "class attribute" in f.message and f.where == "offset"
    f = only(tied, "FM012")
    assert f.where == "b.weight" and "'a.weight'" in f.message
    f = only(shared, "FM013")
    assert f.where == "a" and "'b'" in f.message
    f = only(two_devices, "FM009")
    assert f.where == "(root)" and "cpu: 5 tensors" in f.message and "meta: 2" in f.message


def test_registered_aliases_are_not_errors() -> None:
    # A plain list of modules that are registered elsewhere only refers to them.
    f = only(alias_list, "FM014")
    assert "1 module and 1 parameter" in f.message
    m = Body()
    m.mixed = [m.a, nn.Linear(4, 4)]
    report = audit_both(m)
    assert report.codes() == ["FM001", "FM014"]
    assert report.findings[0].message.startswith("1 module in a plain list")


def test_a_plain_tensor_that_is_a_buffer_goes_stale() -> None:
    m = Body()
    m.alias = m.scale
    (f,) = audit_both(m).findings
    assert f.code == "FM005" and "'scale' today" in f.message


def test_cycles_and_deep_containers_end() -> None:
    m = Body()
    loop: list[object] = [nn.Linear(4, 4)]
    loop.append(loop)
    m.loop = loop
    deep: list[object] = [nn.Linear(4, 4)]
    for _ in range(100):
        deep = [deep]
    m.deep = deep
    report = audit_both(m)
    assert [(f.code, f.attribute) for f in report.findings] == [("FM001", "loop")]


def test_container_subclasses_are_read_without_their_code() -> None:
    class Loud(list):  # type: ignore[type-arg]
        def __iter__(self) -> object:
            raise AssertionError("the audit ran the container's own code")

    m = Body()
    m.extra = Loud([nn.Linear(4, 4)])
    (f,) = audit_both(m).findings
    assert f.code == "FM001" and "plain Loud attribute" in f.message
