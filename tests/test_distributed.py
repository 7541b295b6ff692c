"""DistributedDataParallel and FSDP2 train fastmodule models exactly as stock ones.

One spawn of two gloo processes on 127.0.0.1 runs every scenario: each rank trains the
stock model (the oracle), the same model built on ``fastmodule.Module`` and the stock
model under ``fastmodule.accelerate``, with per-rank inputs, and saves what it saw.
The tests below compare those observations: parameters, buffers and gradients must be
bitwise equal to stock on every rank, equal across ranks (so the gradients really were
all-reduced), and DDP's communication hooks must fire as often as on stock.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import fastmodule
from tests.conftest import NATIVE

STOCK = torch.nn.Module
FAST = fastmodule.Module
WORLD = 2
STEPS = 3
LR = 0.1
KINDS = ["stock", "fast", "accelerated"]
DDP_VARIANTS = ["plain", "unused", "no_sync"]
SPAWN_TIMEOUT_S = 180.0

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


# --------------------------------------------------------------------------- models


def make_net(base: type[nn.Module], unused: bool = False) -> type[nn.Module]:
    """A small tree on ``base``: blocks with a BatchNorm (DDP broadcasts its buffers)."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.norm = nn.BatchNorm1d(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.norm(self.lin(x)))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            self.head = nn.Linear(6, 2)
            self.w = nn.Parameter(torch.randn(6))
            if unused:
                self.spare = nn.Linear(6, 6)  # never called: find_unused_parameters

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x) + self.w
            return self.head(x)

    return Net


def make_mlp(base: type[nn.Module]) -> type[nn.Module]:
    """A BatchNorm-free tree for FSDP2, whose layers are sharded one by one."""

    class Layer(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.register_buffer("scale", torch.full((8,), 0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x)) * self.scale + x

    class Mlp(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(2))
            self.head = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    return Mlp


# --------------------------------------------------------------------------- worker


def batch(rank: int, step: int, cols: int) -> torch.Tensor:
    """The input of one rank at one step: different on every rank."""
    g = torch.Generator().manual_seed(1000 * (rank + 1) + step)
    return torch.randn(4, cols, generator=g)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of a state dict (DTensors gathered to full tensors)."""
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach().clone()
    return out


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Each parameter's gradient by name (DTensors gathered), or None."""
    out: dict[str, torch.Tensor | None] = {}
    for n, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out[n] = None if g is None else g.detach().clone()
    return out


def build(kind: str, factory: Callable[[type[nn.Module]], type[nn.Module]]) -> nn.Module:
    """The model of ``kind``, identically seeded on every kind and rank."""
    torch.manual_seed(0)
    return factory(FAST if kind == "fast" else STOCK)()


@contextlib.contextmanager
def maybe_accelerated(kind: str, model: nn.Module) -> Iterator[None]:
    """Accelerate ``model``'s classes for the block when ``kind`` asks for it."""
    if kind == "accelerated":
        with fastmodule.accelerated(model):
            yield
    else:
        yield


def eval_out(ddp: nn.Module, rank: int) -> torch.Tensor:
    """The DDP model's output in eval mode (running statistics, no sync)."""
    with torch.no_grad():
        return ddp.eval()(batch(rank, 99, 6))


def run_ddp(rank: int, kind: str, variant: str) -> dict[str, Any]:
    """Train one DDP model for a few SGD steps; returns what the test compares."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = build(kind, lambda b: make_net(b, unused=variant == "unused"))
    local = build("stock", lambda b: make_net(b, unused=variant == "unused"))
    local(batch(rank, 0, 6)).square().sum().backward()  # no all-reduce: differs by rank
    comm = {"calls": 0}

    # no annotations: DDP inspects them, and ``from __future__ import annotations``
    # would make them strings that it rejects
    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
        state["calls"] += 1
        return allreduce_hook(None, bucket)  # type: ignore[arg-type]

    with maybe_accelerated(kind, model):
        ddp = DDP(model, find_unused_parameters=variant == "unused")
        ddp.register_comm_hook(comm, counting_hook)
        with maybe_accelerated(kind, ddp):
            accelerated = [fastmodule.is_accelerated(m) for m in ddp.modules()]
            opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
            counts = []
            for step in range(STEPS):
                opt.zero_grad()
                if variant == "no_sync":
                    with ddp.no_sync():  # accumulate locally, no communication
                        ddp(batch(rank, 100 + step, 6)).square().sum().backward()
                    counts.append(comm["calls"])
                ddp(batch(rank, step, 6)).square().sum().backward()
                counts.append(comm["calls"])
                opt.step()
            out = {
                "state": snapshot(model),
                "grads": grads(model),
                "local_grads": grads(local),
                "comm_calls": comm["calls"],
                "counts": counts,
                "ddp_keys": list(ddp.state_dict()),
                "ddp_params": [n for n, _ in ddp.named_parameters()],
                "module_is_model": ddp.module is model,
                "accelerated": accelerated,
                "eval_out": eval_out(ddp, rank),
            }
    return out


def run_fsdp(rank: int, kind: str) -> dict[str, Any]:
    """Shard every layer and the root with FSDP2 and train a few SGD steps."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = build(kind, make_mlp)
    with maybe_accelerated(kind, model):
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        info = {
            "root_type": type(model).__name__,
            "layer_type": type(model.layers[0]).__name__,
            "is_fsdp": isinstance(model, FSDPModule),
            "is_fast": isinstance(model, FAST),
            "param_names": [n for n, _ in model.named_parameters()],
        }
        if kind == "fast":
            info["slots"] = fastmodule.slots_of(type(model))
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            loss = model(batch(rank, step, 8)).square().sum()
            loss.backward()
            losses.append(loss.detach())
            opt.step()
        info.update(
            state=snapshot(model),
            grads=grads(model),
            losses=torch.stack(losses),
        )
    return info


def _outcome_of(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("raised", "Type: message")``: results must pickle."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - reported to the parent process
        return ("raised", f"{type(e).__name__}: {e}")


def worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: every DDP and FSDP2 scenario, results saved to ``out_dir``."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        results: dict[str, Any] = {}
        for variant in DDP_VARIANTS:
            for kind in KINDS:
                results[f"ddp/{variant}/{kind}"] = _outcome_of(lambda: run_ddp(rank, kind, variant))
                dist.barrier()
        for kind in KINDS:
            results[f"fsdp/{kind}"] = _outcome_of(lambda: run_fsdp(rank, kind))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Spawn the two ranks once for the whole file; each rank's saved observations."""
    out_dir: Path = tmp_path_factory.mktemp("dist")
    ctx = mp.start_processes(
        worker, args=(free_port(), str(out_dir)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {SPAWN_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def ok(result: tuple[str, Any]) -> dict[str, Any]:
    """The value of a scenario that must have succeeded."""
    assert result[0] == "ok", result[1]
    return result[1]


def same(got: Any, want: Any, path: str = "") -> None:
    """Exact, recursive equality; tensors bitwise (and with the same dtype)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert got.dtype == want.dtype and torch.equal(got, want), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{path}[{i}]")
    else:
        assert got == want, path


@pytest.mark.parametrize("variant", DDP_VARIANTS)
@pytest.mark.parametrize("kind", ["fast", "accelerated"])
def test_ddp_matches_stock(ranks: list[dict[str, Any]], kind: str, variant: str) -> None:
    for rank, res in enumerate(ranks):
        got = ok(res[f"ddp/{variant}/{kind}"])
        want = ok(res[f"ddp/{variant}/stock"])
        assert got["module_is_model"] and want["module_is_model"]
        for key in ("ddp_keys", "ddp_params", "counts", "comm_calls"):
            assert got[key] == want[key], (rank, key)
        for key in ("state", "grads", "local_grads", "eval_out"):
            same(got[key], want[key], f"rank{rank}/{key}")
        assert not any(want["accelerated"])
        if not NATIVE:  # nothing is accelerated: every kind runs torch's code
            assert not any(got["accelerated"])
        elif kind == "accelerated":
            assert got["accelerated"] and all(got["accelerated"])
        else:  # the fastmodule classes are fast, the stock layers inside them are not
            assert any(got["accelerated"]) and not all(got["accelerated"])


@pytest.mark.parametrize("variant", DDP_VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
def test_ddp_gradients_are_all_reduced(
    ranks: list[dict[str, Any]], kind: str, variant: str
) -> None:
    r0, r1 = (ok(res[f"ddp/{variant}/{kind}"]) for res in ranks)
    # without communication the ranks' gradients differ (their inputs do) ...
    assert any(
        g is not None and not torch.equal(g, r1["local_grads"][n])
        for n, g in r0["local_grads"].items()
    )
    # ... with it, every gradient, parameter and the comm-hook count agree across ranks
    same(r0["grads"], r1["grads"], "grads")
    params = [k for k in r0["state"] if "running_" not in k and "num_batches" not in k]
    assert "w" in params and "head.weight" in params
    for k in params:
        assert torch.equal(r0["state"][k], r1["state"][k]), k
    assert r0["comm_calls"] == r1["comm_calls"] > 0
    if variant == "no_sync":  # no_sync steps do not communicate: the count stays put
        counts = r0["counts"]
        assert counts[0] == 0
        assert all(counts[i] == counts[i - 1] for i in range(2, len(counts), 2))
        assert counts[-1] > counts[0]
    if variant == "unused":
        assert r0["grads"]["spare.weight"] is None


def fsdp_or_skip(ranks: list[dict[str, Any]]) -> None:
    """Skip when the installed torch cannot run FSDP2 on CPU/gloo (stock raises too)."""
    status, value = ranks[0]["fsdp/stock"]
    if status == "raised":
        pytest.skip(f"FSDP2 on CPU with gloo is not supported by this torch: {value}")


@pytest.mark.parametrize("kind", ["fast", "accelerated"])
def test_fsdp2_matches_stock(ranks: list[dict[str, Any]], kind: str) -> None:
    fsdp_or_skip(ranks)
    for rank, res in enumerate(ranks):
        got = ok(res[f"fsdp/{kind}"])
        want = ok(res["fsdp/stock"])
        assert got["param_names"] == want["param_names"]
        for key in ("state", "grads", "losses"):
            same(got[key], want[key], f"rank{rank}/{key}")
    # data parallel: the gathered parameters agree across ranks
    same(ok(ranks[0][f"fsdp/{kind}"])["state"], ok(ranks[1][f"fsdp/{kind}"])["state"])


@pytest.mark.parametrize("kind", KINDS)
def test_fsdp2_class_swap(ranks: list[dict[str, Any]], kind: str) -> None:
    fsdp_or_skip(ranks)
    got = ok(ranks[0][f"fsdp/{kind}"])
    assert got["root_type"] == "FSDPMlp"
    assert got["layer_type"] == "FSDPLayer"
    assert got["is_fsdp"]
    assert got["is_fast"] is (kind == "fast")
    if kind == "fast":
        assert got["slots"] == (NATIVE, NATIVE, NATIVE)  # (none where no native path is on)
