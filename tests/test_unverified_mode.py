"""The stock fallback as a user on an interpreter fastmodule has not verified meets it
(a future CPython, a free-threaded build, PyPy...): ``FASTMODULE_UNVERIFIED=1`` forces
that mode. ``import fastmodule`` warns once, naming why; ``python -m fastmodule doctor``
says why in its first row and exits 3; every public entry point works and gives
stock's results, errors included.

Each scenario runs in a fresh interpreter with the variable set, so these tests run
in the normal suite too. ``make test-unverified`` runs the whole suite in that mode
(tests of what only the native paths do skip there: ``requires_native``, conftest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import fastmodule
from fastmodule.__main__ import DOCTOR_PATH_OFF
from fastmodule._verified import verification
from tests.conftest import NATIVE, NO_NATIVE

#: Why the interpreter is refused with the variable set.
REASON = f"{verification.UNVERIFIED_ENV_VAR} is set: this interpreter is treated as unverified"
#: The one warning ``import fastmodule`` gives then.
WARNING = (
    f"fastmodule: {REASON}: no native path is on, torch's own code runs everywhere "
    "(python -m fastmodule doctor lists every path)"
)


def unverified(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a fresh interpreter with ``FASTMODULE_UNVERIFIED=1`` (and no
    warning filters or switch from this process's environment)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONWARNINGS", "FASTMODULE_DISABLE", verification.UNVERIFIED_ENV_VAR)
    }
    env[verification.UNVERIFIED_ENV_VAR] = "1"
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def script_json(script: str) -> Any:
    """``script`` in a fresh unverified interpreter: the JSON it prints last."""
    proc = unverified("-c", textwrap.dedent(script))
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- import


IMPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastmodule
    import fastmodule.nn, fastmodule.tools.check, fastmodule.tools.audit, fastmodule.bench
    import importlib
    importlib.reload(fastmodule.native_paths)  # asking again warns no more
print(json.dumps([[w.category.__name__, str(w.message), w.filename] for w in caught]))
"""


def test_import_warns_once_naming_the_reason() -> None:
    warned = script_json(IMPORT)
    # One warning, attributed to the importing line.
    assert warned == [["UnverifiedWarning", WARNING, "<string>"]]


def test_import_under_default_filters_prints_one_line() -> None:
    proc = unverified("-c", "import fastmodule; import fastmodule.nn")
    assert proc.stdout == ""
    assert proc.stderr.count("UnverifiedWarning") == 1, proc.stderr
    assert f"<string>:1: UnverifiedWarning: {WARNING}\n" in proc.stderr


def test_the_warning_is_an_error_where_asked() -> None:
    # Filters for fastmodule's category work as for any warning (here: before import,
    # by message, as a user's -W would).
    proc = unverified(
        "-W", "error:fastmodule:RuntimeWarning", "-c", "import fastmodule", check=False
    )
    assert proc.returncode == 1 and "UnverifiedWarning" in proc.stderr
    assert issubclass(fastmodule.UnverifiedWarning, RuntimeWarning)


# --------------------------------------------------------------------------- doctor


def test_doctor_says_why_first_and_exits_3() -> None:
    proc = unverified("-m", "fastmodule", "doctor", check=False)
    assert proc.returncode == DOCTOR_PATH_OFF == 3, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("path "))
    state, detail = lines[header].index("state"), lines[header].index("detail")
    rows = lines[header + 1 : lines.index("", header)]
    first = rows[0]
    assert first[:state].strip() == "interpreter" and first[state:detail].strip() == "off!"
    assert first[detail:].startswith(REASON)
    assert len(rows) > 30 and all(row[state:detail].strip() in ("off", "off!") for row in rows)
    assert lines[-1].startswith(f"{len(rows)} off: torch's own code runs")
    # The import's warning, once, is all it adds on stderr.
    assert proc.stderr.count("UnverifiedWarning") == 1, proc.stderr


def test_doctor_json_says_the_same() -> None:
    proc = unverified("-m", "fastmodule", "doctor", "--json", check=False)
    assert proc.returncode == DOCTOR_PATH_OFF, proc.stderr[-3000:]
    paths = json.loads(proc.stdout)["paths"]
    assert paths[0] == {
        "name": "interpreter",
        "on": False,
        "detail": f"{REASON}: no native path is on (see interpreter)",
        "unverified": True,
    }
    assert all(p["on"] is False for p in paths)
    assert [p["name"] for p in paths if p["unverified"]] == ["interpreter"]
    names = {p["name"] for p in paths}
    assert {"module call", "switch", "nn.Module.state_dict"} <= names


# --------------------------------------------------------------------------- parity

PARITY = """
import json, warnings
import torch
from torch import nn
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    import fastmodule
    from fastmodule import nn as fnn


def outcome(fn):
    try:
        value = fn()
    except Exception as e:
        return ["raised", type(e).__name__, str(e)]
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    return ["ok", value]


def tree(base):
    class Block(base):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)
            self.register_buffer("scale", torch.tensor(0.5))

        def forward(self, x):
            return torch.relu(self.norm(self.lin(x))) * self.scale

    class Net(base):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.head = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.5))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    torch.manual_seed(0)
    return Net()


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.LayerNorm(8), nn.Linear(8, 2))


def observe(m):
    # Everything a user sees: outputs (train and eval), grads, walks, state_dict,
    # loading, conversions, registration and the errors of each.
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    out = {}
    torch.manual_seed(1)
    y = m(x)
    y.sum().backward()
    out["train"] = y.tolist()
    out["grads"] = {k: p.grad.tolist() for k, p in m.named_parameters()}
    m.zero_grad()
    out["zeroed"] = [p.grad is None for p in m.parameters()]
    m.eval()
    out["training"] = [s.training for s in m.modules()]
    out["eval"] = outcome(lambda: m(x))
    out["modules"] = [n for n, _ in m.named_modules()]
    out["buffers"] = [n for n, _ in m.named_buffers()]
    sd = m.state_dict()
    out["state_dict"] = {k: v.tolist() for k, v in sd.items()}
    out["metadata"] = {k: dict(v) for k, v in sd._metadata.items()}
    out["load"] = outcome(lambda: repr(m.load_state_dict(sd)))
    extra = dict(sd, bogus=torch.zeros(1))
    out["load_extra"] = outcome(lambda: m.load_state_dict(extra))
    out["load_lax"] = outcome(lambda: repr(m.load_state_dict(extra, strict=False)))
    bad = {k: torch.zeros(7) for k in sd}
    out["load_bad"] = outcome(lambda: m.load_state_dict(bad))
    out["bad_input"] = outcome(lambda: m(torch.ones(3, 5)))
    out["missing"] = outcome(lambda: m.nope)
    out["set_param"] = outcome(lambda: setattr(m, "w", nn.Parameter(torch.ones(1))))
    out["params"] = [n for n, _ in m.named_parameters()]
    out["bad_register"] = outcome(lambda: m.register_buffer("a.b", torch.ones(1)))
    out["double"] = outcome(lambda: [str(t.dtype) for t in m.double().state_dict().values()])
    out["repr"] = repr(m)
    return out


results = {}
results["mlp_stock"] = observe(mlp())
model = mlp()
results["accelerate_returns"] = fastmodule.accelerate(model) is model
results["mlp_accelerated"] = observe(model)
results["restore_returns"] = fastmodule.restore(model) is model
with fastmodule.accelerated(mlp()) as m:
    results["accelerated_block"] = [fastmodule.is_accelerated(s) for s in m.modules()]
results["tree_stock"] = observe(tree(nn.Module))
fast = tree(fastmodule.Module)
results["tree_fast"] = observe(fast)
results["fast_is_accelerated"] = fastmodule.is_accelerated(fast)
results["slots"] = list(fastmodule.slots_of(type(fast)))
results["own_methods"] = sorted(
    k for k in ("state_dict", "load_state_dict", "named_modules", "_apply")
    if k in vars(fastmodule.Module)
)
fastmodule.install()
fastmodule.install()
results["installed"] = fastmodule.installed()
results["install_accelerates"] = fastmodule.is_accelerated(nn.Linear(1, 1))
fastmodule.uninstall()
results["drop_in"] = [fnn.Linear is nn.Linear, fnn.Module is fastmodule.Module]
results["drop_in_accelerated"] = fastmodule.is_accelerated(fnn.Linear(1, 1))
with fastmodule.disabled():
    y = fast(torch.ones(1, 4, dtype=torch.float64))  # (observe() left it in double)
    results["disabled"] = [fastmodule.switch.is_disabled(), y.shape[1]]
results["type_errors"] = [
    outcome(lambda: fastmodule.accelerate(3)),
    outcome(lambda: fastmodule.restore(None)),
]
report = fastmodule.check(mlp(), torch.ones(2, 4), timing=False, progress=False)
results["check"] = [
    report.parity.identical,
    report.exit_status,
    report.calls.calls,
    report.calls.native_calls,
    sorted({h.reason for h in report.calls.handovers}),
]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with fastmodule.strict():
        fast.hidden = [nn.Linear(1, 1)]
results["strict"] = [type(w.message).__name__ for w in caught]
results["audit"] = sorted({f.code for f in fastmodule.audit(fast).findings})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def parity() -> dict[str, Any]:
    result: dict[str, Any] = script_json(PARITY)
    return result


def test_an_accelerated_mlp_is_stock(parity: dict[str, Any]) -> None:
    assert parity["mlp_accelerated"] == parity["mlp_stock"]
    # The comparison saw results and errors alike.
    stock = parity["mlp_stock"]
    assert stock["eval"][0] == "ok" and stock["load"][0] == "ok"
    for key in ("load_extra", "load_bad", "bad_input", "missing", "bad_register"):
        assert stock[key][0] == "raised", key
    assert parity["accelerate_returns"] and parity["restore_returns"]
    assert parity["accelerated_block"] == [False] * 5


def test_a_fastmodule_module_model_is_stock(parity: dict[str, Any]) -> None:
    assert parity["tree_fast"] == parity["tree_stock"]
    # It runs torch's own code: no native slot, torch's methods inherited.
    assert parity["fast_is_accelerated"] is False
    assert parity["slots"] == [False, False, False]
    assert parity["own_methods"] == []


def test_the_public_api_falls_back_without_errors(parity: dict[str, Any]) -> None:
    # install() and the drop-in namespace change nothing; disabled() still nests.
    assert parity["installed"] is False and parity["install_accelerates"] is False
    assert parity["drop_in"] == [True, True] and parity["drop_in_accelerated"] is False
    assert parity["disabled"] == [True, 2]
    assert parity["type_errors"] == [
        ["raised", "TypeError", "accelerate() expects a torch.nn.Module, got int"],
        ["raised", "TypeError", "restore() expects a torch.nn.Module, got NoneType"],
    ]
    # check compares (identical: exit 0) and says why no call is native.
    identical, status, calls, native, reasons = parity["check"]
    assert identical is True and status == 0 and calls == 5 and native == 0
    assert reasons == ["fastmodule's native paths are off here (fastmodule doctor says why)"]
    assert parity["strict"] == ["StrictRegistrationWarning"]
    # audit reports the list of modules strict() warned about (FM001), and only that.
    assert parity["audit"] == ["FM001"]


# --------------------------------------------------------------------------- this process


@pytest.mark.skipif(NATIVE, reason="native paths are on here (the tests above cover this mode)")
def test_diagnostics_here_where_no_native_path_is_on() -> None:
    rows = fastmodule.diagnostics()
    assert rows[0].name == "interpreter" and rows[0].on is False and rows[0].unverified
    assert rows[0].detail.startswith(f"{NO_NATIVE}: ")
    assert all(r.on is False for r in rows)
    assert [r.name for r in rows if r.unverified] == ["interpreter"]
    message = fastmodule.unverified_message()
    assert message is not None and message.startswith(f"fastmodule: {NO_NATIVE}: ")
