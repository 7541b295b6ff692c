"""``fastmodule.diagnostics()``, ``python -m fastmodule doctor``, and what fastmodule
does where it cannot verify what a native path relies on: that path stays torch's
(stock behaviour) and ``import fastmodule`` warns once, naming it.

The unverified cases change what import sees (a torch function, the interpreter's
build flags), so each runs in a fresh interpreter and compares stock
``nn.Module`` with ``fastmodule.Module`` there.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from torch import nn

import fastmodule
from fastmodule import _core, native_paths
from fastmodule.__main__ import DOCTOR_PATH_OFF
from fastmodule._verified import verification


def run_script(script: str) -> dict[str, Any]:
    """``script`` in a fresh interpreter; the JSON it prints last."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- here


def test_diagnostics_rows_are_typed_and_complete() -> None:
    rows = fastmodule.diagnostics()
    assert all(isinstance(r, fastmodule.PathStatus) for r in rows)
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    for r in rows:
        assert r.on in (True, False, None) and isinstance(r.detail, str) and r.detail
    expected = {"interpreter", "switch", "tracer check", "quiet dicts", "jit tracing probe"}
    expected |= {"cache validity", "recorded walks", "module call", "attribute read"}
    expected |= {"registration", "layer forwards", "container methods", "conversion closures"}
    expected |= {"hook dispatch"}
    expected |= {f"nn.Module.{m}" for m in verification.METHOD_PATHS}
    assert set(names) == expected


@pytest.mark.requires_native("every row on (where none is: tests/test_unverified_mode.py)")
def test_diagnostics_on_this_interpreter_and_torch() -> None:
    """The suite runs on a verified interpreter and torch: everything is on but
    what this build reports otherwise (cache validity, recorded walks)."""
    rows = {r.name: r for r in fastmodule.diagnostics()}
    assert fastmodule.unverified_message() is None
    assert not any(r.unverified for r in rows.values())
    reported = {"cache validity", "recorded walks"}
    assert all(r.on is True for name, r in rows.items() if name not in reported)
    validity = getattr(_core, "cache_validity", None)
    if validity is None:
        assert rows["cache validity"].on is None
        assert rows["cache validity"].detail.startswith("unknown")
    else:
        assert rows["cache validity"].detail == validity()
    recorded = getattr(_core, "recorded_walks", None)
    assert rows["recorded walks"].on is (None if recorded is None else recorded())
    assert rows["jit tracing probe"].on is _core.native_tracing_probe()


def test_doctor_table_json_and_exit_status() -> None:
    rows = fastmodule.diagnostics()
    want = DOCTOR_PATH_OFF if any(r.on is False for r in rows) else 0
    cmd = [sys.executable, "-m", "fastmodule", "doctor"]
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert table.returncode == want, table.stderr[-2000:]
    for r in rows:
        assert r.name in table.stdout
    as_json = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=600)
    assert as_json.returncode == want
    data = json.loads(as_json.stdout)
    assert data["torch"] == torch.__version__ and data["fastmodule"] == fastmodule.__version__
    assert data["paths"] == [dataclasses.asdict(r) for r in rows]


def test_format_table_marks_unverified_and_counts_off() -> None:
    rows = [
        fastmodule.PathStatus("a", True, "in use"),
        fastmodule.PathStatus("b", False, "why", unverified=True),
        fastmodule.PathStatus("c", None, "unknown"),
    ]
    lines = native_paths.format_table(rows).splitlines()
    assert lines[1].split()[:2] == ["a", "on"]
    assert lines[2].split()[:2] == ["b", "off!"]
    assert lines[3].split()[:2] == ["c", "?"]
    assert lines[-1].startswith("1 off")


# --------------------------------------------------------------------------- fingerprints


def _fingerprint(source: str) -> str:
    fn = ast.parse(textwrap.dedent(source)).body[0]
    assert isinstance(fn, ast.FunctionDef)
    return verification.fingerprint(fn)


def test_fingerprint_is_the_code_not_its_comments_docstring_or_annotations() -> None:
    base = _fingerprint(
        '''
        def f(self, x: int = 1) -> int:
            """Doc."""
            return x + 1
        '''
    )
    same = _fingerprint(
        '''

        def f(self, x=1):  # moved down, no annotations
            """Another docstring."""
            # a comment
            return x + 1
        '''
    )
    assert base == same
    assert base != _fingerprint("def f(self, x=1):\n    return x + 2\n")
    assert base != _fingerprint("def f(self, x=2):\n    return x + 1\n")
    assert base != _fingerprint("@staticmethod\ndef f(self, x=1):\n    return x + 1\n")


def test_every_function_a_path_reproduces_is_verified_here() -> None:
    problems = {f: verification.function_problem(f) for f in verification.all_functions()}
    assert {f: p for f, p in problems.items() if p is not None} == {}


# --------------------------------------------------------------------------- unknown torch

# torch's nn.Module._call_impl and state_dict as a newer torch might have them: each
# compiled from torch's own source with one statement put first (it counts the calls)
# in a file of its own, and installed before fastmodule is imported.
NEWER_TORCH = """
import ast, contextlib, inspect, io, json, os, sys, tempfile, textwrap, types, warnings
import torch
import torch.nn.modules.module as torch_module
from torch import nn

COUNTS = {"_call_impl": 0, "state_dict": 0}
torch_module.__dict__["_test_counts"] = COUNTS

def changed(name):
    original = nn.Module.__dict__[name]
    fn = ast.parse(textwrap.dedent(inspect.getsource(original))).body[0]
    fn.body.insert(0, ast.parse(f"_test_counts[{name!r}] += 1").body[0])
    source = "class Module:\\n" + textwrap.indent(ast.unparse(fn), "    ") + "\\n"
    fd, path = tempfile.mkstemp(suffix="_module.py")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    code = compile(source, path, "exec")
    code = next(c for c in code.co_consts if isinstance(c, types.CodeType))  # class body
    code = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name)
    new = types.FunctionType(code, vars(torch_module), name, original.__defaults__)
    new.__kwdefaults__ = original.__kwdefaults__
    new.__qualname__ = original.__qualname__
    setattr(nn.Module, name, new)

changed("_call_impl")
changed("state_dict")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastmodule
    import fastmodule.__main__
warned = [
    [w.category.__name__, str(w.message), w.filename]
    for w in caught
    if "fastmodule" in str(w.message) or issubclass(w.category, fastmodule.UnverifiedWarning)
]

def scenario(base):
    class Inner(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    class Outer(base):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.register_buffer("b", torch.ones(2))

        def forward(self, x):
            return self.inner(x) + self.b

    torch.manual_seed(0)
    m = Outer()
    before = dict(COUNTS)
    y = m(torch.ones(1, 2))
    keys = list(m.state_dict())
    seen = []
    m.register_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
    m(torch.ones(1, 2))
    counts = {k: COUNTS[k] - before[k] for k in COUNTS}
    return {"y": y.tolist(), "keys": keys, "hooks": seen, "counts": counts}, Outer

stock, _ = scenario(nn.Module)
fast, Outer = scenario(fastmodule.Module)
with contextlib.redirect_stdout(io.StringIO()):
    doctor = fastmodule.__main__.main(["doctor"])
print(json.dumps({
    "warned": warned,
    "stock": stock,
    "fast": fast,
    "slots": fastmodule.slots_of(Outer),
    "own_state_dict": "state_dict" in fastmodule.Module.__dict__,
    "rows": {r.name: [r.on, r.unverified] for r in fastmodule.diagnostics()},
    "doctor": doctor,
}))
"""


@pytest.mark.requires_native("one unverified torch function turns off its paths, not the others")
def test_unknown_torch_code_runs_stock_and_warns_once_naming_it() -> None:
    out = run_script(NEWER_TORCH)
    # Exactly one warning, attributed to the importing line, naming both functions
    # and the paths left to torch.
    assert len(out["warned"]) == 1, out["warned"]
    category, message, filename = out["warned"][0]
    assert category == "UnverifiedWarning" and filename == "<string>"
    assert "nn.Module._call_impl (source differs" in message
    assert "nn.Module.state_dict (source differs" in message
    assert "module call" in message and "nn.Module.state_dict" in message.split("for:")[1]
    # Stock behaviour, torch's code included: the changed functions ran as often.
    assert out["fast"] == out["stock"]
    assert out["stock"]["counts"] == {"_call_impl": 6, "state_dict": 3}
    # The call slot is off, the others on; state_dict is torch's, inherited.
    assert out["slots"] == [False, True, True]
    assert out["own_state_dict"] is False
    rows = out["rows"]
    assert rows["module call"] == [False, True]
    assert rows["nn.Module.state_dict"] == [False, True]
    assert rows["layer forwards"][0] is False
    assert rows["hook dispatch"] == [False, True]
    assert rows["attribute read"] == [True, False]
    assert rows["nn.Module.named_modules"] == [True, False]
    assert out["doctor"] == DOCTOR_PATH_OFF


# --------------------------------------------------------------------------- interpreter

# A free-threaded build, as import sees it: sysconfig says Py_GIL_DISABLED.
UNVERIFIED_INTERPRETER = """
import json, sys, sysconfig, types, warnings
import torch
import torch.nn.modules.module as torch_module
from torch import nn

real = sysconfig.get_config_var
sysconfig.get_config_var = lambda name: 1 if name == "Py_GIL_DISABLED" else real(name)
torch_names = set(vars(torch_module))
codes = {k: v.__code__ for k, v in vars(nn.Module).items() if isinstance(v, types.FunctionType)}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastmodule
sysconfig.get_config_var = real
warned = [[w.category.__name__, str(w.message)] for w in caught]

def scenario(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

        def forward(self, x):
            return self.seq(self.lin(x))

    torch.manual_seed(0)
    m = Net()
    fastmodule.accelerate(m)
    m.float()
    m.eval()
    out = {
        "y": m(torch.ones(1, 2)).tolist(),
        "keys": list(m.state_dict()),
        "params": [n for n, _ in m.named_parameters()],
        "accelerated": fastmodule.is_accelerated(m) or fastmodule.is_accelerated(m.lin),
        "training": m.training,
    }
    return out, Net

stock, _ = scenario(nn.Module)
fast, Net = scenario(fastmodule.Module)
from fastmodule import nn as drop_in
fastmodule.install()
drop_in_linear = drop_in.Linear(2, 2)
try:
    fastmodule._core.installed(Net)
    initialised = True
except RuntimeError:
    initialised = False
class _Empty:
    pass


# What every class statement defines (3.13 adds __firstlineno__, __static_attributes__).
methods = set(fastmodule.Module.__dict__) & set(vars(nn.Module)) - set(vars(_Empty))
print(json.dumps({
    "warned": warned,
    "stock": stock,
    "fast": fast,
    "initialised": initialised,
    "slots": fastmodule.slots_of(Net),
    "drop_in_accelerated": fastmodule.is_accelerated(drop_in_linear),
    "installed": fastmodule.installed(),
    "init_subclass": "__init_subclass__" in vars(nn.Module),
    "torch_module_untouched": set(vars(torch_module)) == torch_names,
    "torch_code_untouched": all(
        getattr(nn.Module, k).__code__ is c for k, c in codes.items()
    ),
    "methods_defined": sorted(methods - {"__init_subclass__", "__doc__", "__module__"}),
    "rows": {r.name: [r.on, r.unverified] for r in fastmodule.diagnostics()},
}))
"""


def test_unverified_interpreter_runs_stock_and_warns_once() -> None:
    out = run_script(UNVERIFIED_INTERPRETER)
    # (On an interpreter fastmodule has not verified, or with FASTMODULE_UNVERIFIED=1,
    # the warning names that first.)
    problem = verification.interpreter_problem() or "a free-threaded CPython build"
    assert out["warned"] == [
        [
            "UnverifiedWarning",
            f"fastmodule: {problem}: no native path is on, torch's own "
            "code runs everywhere (python -m fastmodule doctor lists every path)",
        ]
    ]
    assert out["fast"] == out["stock"]
    assert out["fast"]["accelerated"] is False
    assert out["initialised"] is False
    assert out["slots"] == [False, False, False]
    assert not out["drop_in_accelerated"] and not out["installed"] and not out["init_subclass"]
    assert out["torch_module_untouched"] and out["torch_code_untouched"]
    assert out["methods_defined"] == []
    rows = out["rows"]
    assert rows["interpreter"] == [False, True]
    assert all(on is False for on, _ in rows.values())
    assert [name for name, (_, unverified) in rows.items() if unverified] == ["interpreter"]


# --------------------------------------------------------------------------- tracing probe


@pytest.fixture
def restore_tracing_probe() -> Any:
    yield
    assert _core.resolve_tracing_probe(torch._C.__file__)[0] is True


def _jit_graph(base: type[nn.Module]) -> str:
    class Inner(base):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    class Outer(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 2

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Outer(), torch.ones(2))
    # (Same-named classes traced twice get numbered names: those differ.)
    return re.sub(r"___torch_mangle_\d+\.", "", str(traced.inlined_graph))


def test_tracing_probe_found_without_file_names(restore_tracing_probe: Any) -> None:
    on, through_torch = _core.resolve_tracing_probe(torch._C.__file__, False)
    assert on and "found from" in through_torch
    # Without torch's extension: among the loaded libraries, at one address.
    on, walked = _core.resolve_tracing_probe("/no/such/library.so", True)
    assert on and "found among the loaded libraries" in walked
    assert walked.split(" (")[0] == through_torch.split(" (")[0]
    on, walked = _core.resolve_tracing_probe(None)
    assert on and _core.tracing_probe() == (True, walked)


@pytest.mark.requires_native("the jit-tracing probe's diagnostics row when the probe is not found")
def test_tracing_probe_fallback_is_torchs_python_check(restore_tracing_probe: Any) -> None:
    on, detail = _core.resolve_tracing_probe("/no/such/library.so", False)
    assert on is False and "not found" in detail
    assert _core.native_tracing_probe() is False
    row = next(r for r in fastmodule.diagnostics() if r.name == "jit tracing probe")
    assert row.on is False and row.unverified and "torch._C._is_tracing()" in row.detail
    # Module calls under torch.jit.trace still hand over to torch (scopes recorded).
    assert _jit_graph(fastmodule.Module) == _jit_graph(nn.Module)
    assert "inner" in _jit_graph(fastmodule.Module)
