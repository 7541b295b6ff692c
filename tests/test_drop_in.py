"""``from fastmodule import nn`` (a drop-in for ``torch.nn``) and
``python -m fastmodule run script.py`` (a script run with every class accelerated).

Reading a module class from ``fastmodule.nn`` accelerates torch's class in place,
process-wide; every test here restores the classes it reached, so later stock
oracles run stock code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import fastmodule
from fastmodule import _core
from tests.conftest import NATIVE


def accelerated_classes() -> set[type]:
    """Module classes accelerated in place right now."""
    out: set[type] = set()
    stack: list[type] = [torch.nn.Module]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            stack.append(sub)
            if _core.is_accelerated_class(sub):
                out.add(sub)
    return out


@pytest.fixture(autouse=True)
def _restore_what_the_test_accelerated() -> Iterator[None]:
    before = accelerated_classes()
    assert not fastmodule.installed()
    try:
        yield
    finally:
        for cls in accelerated_classes() - before:
            _core.restore_class(cls)


# --------------------------------------------------------------------------- fastmodule.nn


def test_nn_module_is_fastmodule_module() -> None:
    from fastmodule import nn

    assert nn.Module is fastmodule.Module
    assert issubclass(nn.Module, torch.nn.Module)


def test_nn_module_classes_are_torch_classes_accelerated_on_first_read() -> None:
    from fastmodule import nn

    assert not _core.is_accelerated_class(torch.nn.GELU)
    gelu = nn.GELU
    assert gelu is torch.nn.GELU
    # (Where no native path is on, reading it accelerates nothing.)
    assert _core.is_accelerated_class(torch.nn.GELU) is NATIVE
    m = nn.GELU()
    assert type(m) is torch.nn.GELU and isinstance(m, torch.nn.Module)
    assert fastmodule.is_accelerated(m) is NATIVE
    assert repr(m) == repr(torch.nn.GELU())


def test_nn_other_names_are_torch_objects() -> None:
    from fastmodule import nn

    for name in ("functional", "init", "utils", "Parameter", "Buffer", "parameter", "modules"):
        if hasattr(torch.nn, name):
            assert getattr(nn, name) is getattr(torch.nn, name), name
    assert not _core.is_accelerated_class(torch.nn.Parameter)


def test_nn_submodule_imports_are_torch_modules() -> None:
    import fastmodule.nn.functional as F
    import fastmodule.nn.init as init
    from fastmodule.nn.utils import parametrize

    assert F is torch.nn.functional
    assert init is torch.nn.init
    assert parametrize is torch.nn.utils.parametrize


def test_nn_namespace_listing_and_missing_names() -> None:
    from fastmodule import nn

    assert {"Module", "Linear", "Sequential", "functional"} <= set(dir(nn))
    assert {"Module", "Linear", "Sequential"} <= set(nn.__all__)
    with pytest.raises(AttributeError, match="^module 'fastmodule.nn' has no attribute 'Nope'$"):
        _ = nn.Nope
    assert not hasattr(nn, "Nope")
    with pytest.raises(ImportError, match="cannot import name 'Nope'"):
        from fastmodule.nn import Nope  # noqa: F401


def test_from_import_accelerates_the_class() -> None:
    assert not _core.is_accelerated_class(torch.nn.SiLU)
    from fastmodule.nn import SiLU

    assert SiLU is torch.nn.SiLU and _core.is_accelerated_class(torch.nn.SiLU) is NATIVE


def build(nn: Any) -> torch.nn.Module:
    """The same user model, written against ``torch.nn`` or ``fastmodule.nn``."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU())
            self.heads = nn.ModuleList([nn.Linear(8, 2), nn.Linear(8, 3)])
            self.register_buffer("scale", torch.tensor(0.5))

        def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
            h = self.body(x) * self.scale
            return [nn.functional.relu(head(h)) for head in self.heads]

    torch.manual_seed(0)
    return Net()


def test_model_written_against_fastmodule_nn_matches_torch_nn() -> None:
    from fastmodule import nn

    stock = build(torch.nn)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    expected = (
        [t.detach() for t in stock(x)],
        {k: v.clone() for k, v in stock.state_dict().items()},
        [n for n, _ in stock.named_modules()],
    )
    fast = build(nn)
    assert isinstance(fast, fastmodule.Module)
    assert all(fastmodule.is_accelerated(m) for m in fast.modules()) is NATIVE
    assert isinstance(fast.body[0], torch.nn.Linear) and type(fast.body[0]) is torch.nn.Linear
    out = fast(x)
    for got, want in zip(out, expected[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    sd = fast.state_dict()
    assert list(sd) == list(expected[1])
    for k, v in expected[1].items():
        torch.testing.assert_close(sd[k], v, rtol=0, atol=0)
    assert [n for n, _ in fast.named_modules()] == expected[2]
    assert sd._metadata == stock.state_dict()._metadata  # type: ignore[attr-defined]


# ------------------------------------------------------------------ python -m fastmodule run

SCRIPT = textwrap.dedent(
    """
    import sys

    import torch

    import helper  # a module next to the script: its directory is on sys.path


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x).relu()


    torch.manual_seed(0)
    net = Net()
    out = net(torch.ones(1, 3))
    print("result", __name__, sys.argv[1:], helper.VALUE, list(net.state_dict()), out.tolist())
    try:
        import fastmodule
    except ImportError:
        print("accelerated n/a")
    else:
        print("accelerated", fastmodule.installed(), fastmodule.is_accelerated(net),
              fastmodule.is_accelerated(net.lin))
    raise SystemExit(int(sys.argv[-1]))
    """
)


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def lines(proc: subprocess.CompletedProcess[str], tag: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith(tag)]


def test_run_script_accelerates_and_matches_plain_python(tmp_path: Path) -> None:
    (tmp_path / "prog").mkdir()
    script = tmp_path / "prog" / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "prog" / "helper.py").write_text("VALUE = 42\n")
    plain = run([str(script), "--lr", "0.1", "3"], cwd=tmp_path)
    fast = run(["-m", "fastmodule", "run", str(script), "--lr", "0.1", "3"], cwd=tmp_path)
    assert plain.returncode == fast.returncode == 3, (plain.stderr, fast.stderr)
    assert lines(fast, "result") == lines(plain, "result")
    assert lines(plain, "result")[0].startswith("result __main__ ['--lr', '0.1', '3'] 42")
    # (Where no native path is on, install() changes nothing.)
    assert lines(fast, "accelerated") == [f"accelerated {NATIVE} {NATIVE} {NATIVE}"]


def test_run_script_errors(tmp_path: Path) -> None:
    missing = run(["-m", "fastmodule", "run", str(tmp_path / "nope.py")], cwd=tmp_path)
    assert missing.returncode == 2
    assert "no such script" in missing.stderr
    boom = tmp_path / "boom.py"
    boom.write_text("raise ValueError('boom from the script')\n")
    failed = run(["-m", "fastmodule", "run", str(boom)], cwd=tmp_path)
    assert failed.returncode == 1
    assert "ValueError: boom from the script" in failed.stderr
