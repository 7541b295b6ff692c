"""The prefixed code of torch's whole-tree methods is kept on disk between imports
(``fastmodule._verified.inline_routes``): a later import reuses exactly what compiling and
checking made, and anything that does not match is compiled and checked again."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from fastmodule._methods import dispatch as _dispatch
from fastmodule._verified import inline_routes

pytestmark = pytest.mark.skipif(
    not inline_routes.prefixed(), reason="torch's methods are not prefixed here"
)

# The prefixed code as this import installed it, marshalled per name.
SCRIPT = """
import marshal, sys, torch
import fastmodule
from fastmodule._verified import inline_routes
codes = {n: torch.nn.Module.__dict__[n].__code__ for n in inline_routes.prefixed()}
sys.stdout.buffer.write(marshal.dumps(codes))
"""


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same code objects (marshal's bytes depend on reference counts)."""
    return a.keys() == b.keys() and all(
        a[n] == b[n]
        and a[n].co_filename == b[n].co_filename
        and list(a[n].co_positions()) == list(b[n].co_positions())
        for n in a
    )


def _import(cache: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        timeout=600,
        env={**os.environ, "FASTMODULE_CACHE_DIR": cache},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return marshal.loads(proc.stdout)


def test_cached_code_is_what_compiling_makes(tmp_path: Path) -> None:
    fresh = _import("")  # no cache: compiled and checked
    assert fresh and not list(tmp_path.iterdir())
    first = _import(str(tmp_path))  # compiled, then written
    [kept] = list(tmp_path.iterdir())
    second = _import(str(tmp_path))  # read back
    assert _same(first, fresh) and _same(second, fresh)
    assert list(tmp_path.iterdir()) == [kept]


def _originals() -> tuple[dict[str, types.FunctionType], set[str]]:
    """Copies of torch's functions with their own (unprefixed) code, as install
    found them, and which of them are walked."""
    funcs = {}
    for name in inline_routes.prefixed():
        f = torch.nn.Module.__dict__[name]
        funcs[name] = types.FunctionType(
            inline_routes.original_code(name), f.__globals__, f.__name__, f.__defaults__
        )
    return funcs, set(_dispatch.WALKED) & set(funcs)


def test_damaged_or_foreign_cache_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTMODULE_CACHE_DIR", str(tmp_path))
    funcs, walked = _originals()
    fresh = inline_routes._prefixed_cached(funcs, walked)
    [kept] = list(tmp_path.iterdir())
    data = kept.read_bytes()
    made_from, codes = marshal.loads(data)
    assert _same(codes, fresh)
    for damaged in (
        data[: len(data) // 2],
        b"\x00not marshal",
        marshal.dumps(({name: b"another bytecode" for name in made_from}, codes)),
        marshal.dumps((made_from, {name: "not code" for name in codes})),
    ):
        kept.write_bytes(damaged)
        assert _same(inline_routes._prefixed_cached(funcs, walked), fresh)
        # Rewritten whole by the call that rebuilt it.
        assert _same(marshal.loads(kept.read_bytes())[1], fresh)


def test_unwritable_cache_folder_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    monkeypatch.setenv("FASTMODULE_CACHE_DIR", str(blocked / "sub"))
    funcs, walked = _originals()
    assert inline_routes._prefixed_cached(funcs, walked)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_code_made_for_another_copy_of_torch_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same torch source installed elsewhere (another venv, a fresh clone's) has
    the same hash, but the code objects carry its file: never taken for this one's."""
    monkeypatch.setenv("FASTMODULE_CACHE_DIR", str(tmp_path))
    funcs, walked = _originals()
    fresh = inline_routes._prefixed_cached(funcs, walked)
    [kept] = list(tmp_path.iterdir())
    made_from, codes = marshal.loads(kept.read_bytes())
    elsewhere = {
        n: c.replace(co_filename="/elsewhere/torch/nn/modules/module.py") for n, c in codes.items()
    }
    kept.write_bytes(marshal.dumps((made_from, elsewhere)))
    again = inline_routes._prefixed_cached(funcs, walked)
    assert _same(again, fresh)
    assert all(c.co_filename == funcs[n].__code__.co_filename for n, c in again.items())
