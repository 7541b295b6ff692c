"""Training-side PyTorch tools on fastmodule trees, compared exactly with stock.

Every test runs one scenario on stock ``torch.nn.Module`` and on the ``base``
fixture's class with the same seeds, and compares what the scenario observed
(outputs, gradients, state dicts, registry contents, parameter identities)
bitwise. ``tests/test_compat_ecosystem.py`` covers compile/fx/export/jit,
pickling, basic ``functional_call`` and a symmetric parametrization; this file
covers the tools people train with: ``torch.func`` transforms, the deprecated
stateless API, parametrizations with inverses, weight and spectral norm,
pruning while training, autocast, activation checkpointing, lazy modules,
meta-device initialisation and optimizers across dtype conversions.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
import torch.nn.utils.prune as prune
from torch import nn
from torch.nn.utils import parametrizations
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from tests.conftest import outcome

STOCK = torch.nn.Module
Scenario = Callable[[type[nn.Module]], Any]

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.nn.utils.stateless.functional_call`:FutureWarning"),
    pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning"),
]


# --------------------------------------------------------------------------- helpers


def x_in(rows: int = 3, cols: int = 4, seed: int = 1234) -> torch.Tensor:
    """A fixed input batch."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g)


def same(got: Any, want: Any, path: str = "") -> None:
    """Exact, recursive equality; tensors bitwise, with equal dtype, device and grad flag."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert type(got).__name__ == type(want).__name__, path
        assert (got.dtype, got.device, got.shape) == (want.dtype, want.device, want.shape), path
        assert got.requires_grad == want.requires_grad, path
        if want.device.type != "meta":
            assert torch.equal(got, want), path
    elif isinstance(want, dict):
        assert isinstance(got, dict), path
        assert list(got) == list(want), path
        for k in want:
            same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            same(a, b, f"{path}[{i}]")
    else:
        assert got == want, path


def check(base: type[nn.Module], scenario: Scenario) -> Any:
    """Run ``scenario`` on ``base`` and on stock and require identical observations."""
    got = scenario(base)
    want = scenario(STOCK)
    same(got, want)
    return got


def sd_of(model: nn.Module) -> dict[str, Any]:
    """A state dict's tensors (detached copies), keys and metadata."""
    sd = model.state_dict()
    return {
        "tensors": {k: v.detach().clone() for k, v in sd.items()},
        "metadata": dict(getattr(sd, "_metadata", {})),
    }


def grads_of(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Gradients by parameter name (copies), or None."""
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def registries(model: nn.Module) -> list[tuple[str, str, list[str], list[str], list[str]]]:
    """Per module: path, class name, parameter, buffer and child names."""
    return [
        (n, type(m).__name__, list(m._parameters), list(m._buffers), list(m._modules))
        for n, m in model.named_modules()
    ]


def train(model: nn.Module, steps: int = 3, lr: float = 0.1, cols: int = 4) -> list[torch.Tensor]:
    """A few SGD steps on fixed inputs; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(x_in(seed=step, cols=cols)).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


# --------------------------------------------------------------------------- models


def make_net(base: type[nn.Module]) -> type[nn.Module]:
    """Two blocks with a buffer each, a head and a parameter of the root's own."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("scale", torch.tensor(1.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x)) * self.scale

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.b1 = Block()
            self.b2 = Block()
            self.head = nn.Linear(4, 2)
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.b2(self.b1(x) + self.w))

    return Net


def make_square(base: type[nn.Module]) -> type[nn.Module]:
    """A module with its own 2-D parameter and buffer next to a Linear child."""

    class Square(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.m = nn.Parameter(torch.randn(4, 4))
            self.register_buffer("shift", torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x)) @ self.m + self.shift

    return Square


def make_bn_net(base: type[nn.Module]) -> type[nn.Module]:
    """A module whose forward updates buffers in place (BatchNorm running stats)."""

    class BnNet(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.norm = nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.lin(x))

    return BnNet


def build(base: type[nn.Module], factory: Callable[..., type[nn.Module]], seed: int = 0) -> Any:
    """Instantiate ``factory(base)()`` with a fixed seed, so stock and fast share weights."""
    torch.manual_seed(seed)
    return factory(base)()


# ------------------------------------------------------------------------ torch.func


def test_vmap_over_stacked_models(base: type[nn.Module]) -> None:
    """Model ensembling: ``stack_module_state`` + ``vmap(functional_call)``."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        cls = make_net(b)
        models = []
        for seed in range(3):
            torch.manual_seed(seed)
            models.append(cls())
        params, buffers = torch.func.stack_module_state(models)
        skeleton = copy.deepcopy(models[0]).to("meta")

        def one(p: dict[str, Any], bu: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(skeleton, (p, bu), (x,))

        x = x_in()
        same_x = torch.vmap(one, in_dims=(0, 0, None))(params, buffers, x)
        per_x = torch.vmap(one)(params, buffers, torch.stack([x_in(seed=s) for s in range(3)]))
        loop = torch.stack([m(x) for m in models])
        torch.testing.assert_close(same_x, loop)
        return {
            "params": {k: v.detach() for k, v in params.items()},
            "buffers": buffers,
            "same_x": same_x.detach(),
            "per_x": per_x.detach(),
            "skeleton": registries(skeleton),
        }

    check(base, scenario)


def test_per_sample_grads(base: type[nn.Module]) -> None:
    """``vmap(grad(functional_call))``: one gradient per sample, summing to the batch's."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        params = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}
        x, y = x_in(5), x_in(5, 2, seed=7)

        def loss(p: dict[str, Any], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
            out = torch.func.functional_call(model, (p, buffers), (xi.unsqueeze(0),))
            return (out - yi.unsqueeze(0)).square().sum()

        per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
        value_and_grad = torch.func.grad_and_value(lambda p: loss(p, x[0], y[0]))(params)
        model(x).sub(y).square().sum().backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(per_sample[n].sum(0), p.grad)
        return {
            "per_sample": per_sample,
            "grad_and_value": value_and_grad,
            "grads": grads_of(model),
            "untouched": all(model._parameters[k] is v for k, v in model._parameters.items()),
        }

    check(base, scenario)


def test_functional_call_options(base: type[nn.Module]) -> None:
    """Tied weights, ``strict``, in-place buffer updates on the substitutes, errors."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        model.b2.lin = model.b1.lin  # tied: one Linear under two names
        x = x_in()
        w = torch.full((4, 4), 0.1)
        tied = torch.func.functional_call(model, {"b1.lin.weight": w}, (x,))
        untied = torch.func.functional_call(model, {"b1.lin.weight": w}, (x,), tie_weights=False)
        strict_err = outcome(
            lambda: torch.func.functional_call(model, {"w": torch.zeros(4)}, (x,), strict=True)
        )
        unknown = outcome(
            lambda: torch.func.functional_call(model, {"nope.weight": w}, (x,), strict=True)
        )
        bn = build(b, make_bn_net)
        own = {k: v.clone() for k, v in bn.named_buffers()}
        subs = {k: v.clone() for k, v in bn.named_buffers()}
        bn_out = torch.func.functional_call(bn, subs, (x,))
        return {
            "tied": tied.detach(),
            "untied": untied.detach(),
            "strict_err": strict_err,
            "unknown": unknown,
            "bn_out": bn_out.detach(),
            "subs_updated": subs,  # BatchNorm updated the substitutes in place ...
            "own_untouched": [torch.equal(v, own[k]) for k, v in bn.named_buffers()],
            "still_tied": model.b2.lin is model.b1.lin,
        }

    got = check(base, scenario)
    assert all(got["own_untouched"])  # ... and not the module's own buffers
    assert got["strict_err"][0] == "raised"


def test_stateless_functional_call(base: type[nn.Module]) -> None:
    """The deprecated ``torch.nn.utils.stateless.functional_call``: values and gradients."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        leaves = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = torch.nn.utils.stateless.functional_call(model, leaves, (x_in(),))
            kw = torch.nn.utils.stateless.functional_call(
                model, {"b1.scale": torch.tensor(-1.0)}, (), {"x": x_in()}
            )
        out.sum().backward()
        return {
            "out": out.detach(),
            "kw": kw.detach(),
            "leaf_grads": {k: v.grad for k, v in leaves.items()},
            "module_grads": grads_of(model),  # the module's own parameters took no part
            "warnings": [type(w.message).__name__ for w in caught],
            "scale": model.b1.scale.clone(),
        }

    got = check(base, scenario)
    assert "FutureWarning" in got["warnings"]
    assert all(g is None for g in got["module_grads"].values())


# ----------------------------------------------------------------- parametrizations


class Positive(nn.Module):
    """``exp`` with a ``right_inverse``, so assignments go through ``log``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.exp()

    def right_inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y.log()


class Scaled(nn.Module):
    """A parametrization with a buffer of its own, and an inverse."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k

    def right_inverse(self, y: torch.Tensor) -> torch.Tensor:
        return y / self.k


class Shifted(nn.Module):
    """A parametrization without ``right_inverse``: assignments raise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_parametrize_orthogonal_training(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_square)
        parametrizations.orthogonal(model.lin)
        parametrizations.orthogonal(model, "m")  # on the fastmodule class's own parameter
        q = model.m
        torch.testing.assert_close(q @ q.T, torch.eye(4), atol=1e-5, rtol=0)
        losses = train(model)
        torch.testing.assert_close(model.m @ model.m.T, torch.eye(4), atol=1e-5, rtol=0)
        mid = {
            "cls": type(model).__name__,
            "registries": registries(model),
            "sd": sd_of(model),
            "losses": losses,
            "m": model.m.detach(),
        }
        parametrize.remove_parametrizations(model, "m")
        parametrize.remove_parametrizations(model.lin, "weight", leave_parametrized=False)
        return {
            **mid,
            "after": registries(model),
            "after_sd": sd_of(model),
            "m_is_param": model.m is model._parameters["m"],
            "out": model(x_in()).detach(),
        }

    got = check(base, scenario)
    assert got["cls"] == "ParametrizedSquare" and got["after"][0][1] == "Square"


def test_custom_parametrization_inverse_chain_and_buffer(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_square)
        model.m.data.abs_().add_(0.1)
        parametrize.register_parametrization(model, "m", Positive())
        parametrize.register_parametrization(model, "m", Scaled())  # chained
        parametrize.register_parametrization(model, "shift", Shifted())  # on a buffer
        original = model.parametrizations.m.original
        first = model.m.detach().clone()
        model.m = torch.full((4, 4), 3.0)  # through both right_inverses
        assigned = model.m.detach().clone()
        refused = outcome(lambda: setattr(model, "shift", torch.zeros(4)))
        out = model(x_in())
        out.sum().backward()
        with parametrize.cached():
            cached = (model.m is model.m, model(x_in()).detach())
        snap = sd_of(model)
        clone = copy.deepcopy(model)
        fresh = build(b, make_square, seed=5)
        parametrize.register_parametrization(fresh, "m", Positive())
        parametrize.register_parametrization(fresh, "m", Scaled())
        parametrize.register_parametrization(fresh, "shift", Shifted())
        loaded = fresh.load_state_dict(model.state_dict())
        return {
            "first": first,
            "assigned": assigned,
            "refused": refused,
            "same_original": model.parametrizations.m.original is original,
            "out": out.detach(),
            "grad": original.grad,
            "cached": cached,
            "sd": snap,
            "registries": registries(model),
            "clone_out": clone(x_in()).detach(),
            "loaded": (loaded.missing_keys, loaded.unexpected_keys),
            "fresh_out": fresh(x_in()).detach(),
            "shift_is_buffer": "original" in model.parametrizations.shift._buffers,
        }

    got = check(base, scenario)
    same(got["fresh_out"], got["out"])
    torch.testing.assert_close(got["assigned"], torch.full((4, 4), 3.0))
    assert got["refused"][0] == "raised" and got["shift_is_buffer"]


@pytest.mark.parametrize("api", ["hooks", "parametrizations"])
def test_weight_norm(base: type[nn.Module], api: str) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_square)
        if api == "hooks":
            nn.utils.weight_norm(model.lin)
            nn.utils.weight_norm(model, "m", dim=1)  # pre-hook sets a plain tensor attr
        else:
            parametrizations.weight_norm(model.lin)
            parametrizations.weight_norm(model, "m", dim=1)
        mid = {"registries": registries(model), "sd": sd_of(model), "hooks": None}
        if api == "hooks":
            mid["hooks"] = (len(model._forward_pre_hooks), len(model.lin._forward_pre_hooks))
        losses = train(model)
        mid.update(losses=losses, grads=grads_of(model), m=model.m.detach())
        if api == "hooks":
            nn.utils.remove_weight_norm(model.lin)
            nn.utils.remove_weight_norm(model, "m")
        else:
            parametrize.remove_parametrizations(model.lin, "weight")
            parametrize.remove_parametrizations(model, "m")
        return {
            **mid,
            "after": registries(model),
            "after_sd": sd_of(model),
            "m_is_param": model.m is model._parameters["m"],
            "out": model(x_in()).detach(),
        }

    check(base, scenario)


@pytest.mark.parametrize("api", ["hooks", "parametrizations"])
def test_spectral_norm(base: type[nn.Module], api: str) -> None:
    """Power iteration updates buffers in training forwards; state-dict hooks version it."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        def normed(seed: int) -> nn.Module:
            model = build(b, make_square, seed=seed)
            torch.manual_seed(seed + 100)  # the random u/v vectors
            if api == "hooks":
                nn.utils.spectral_norm(model.lin)
                nn.utils.spectral_norm(model, "m")
            else:
                parametrizations.spectral_norm(model.lin)
                parametrizations.spectral_norm(model, "m")
            return model

        model = normed(0)
        losses = train(model)
        snap = sd_of(model)
        model.eval()
        eval_out = model(x_in()).detach()
        fresh = normed(3).eval()
        r = fresh.load_state_dict(model.state_dict())
        return {
            "losses": losses,
            "sd": snap,
            "registries": registries(model),
            "eval_out": eval_out,
            "load": (r.missing_keys, r.unexpected_keys),
            "fresh_out": fresh(x_in()).detach(),
            "fresh_sd": sd_of(fresh),
        }

    got = check(base, scenario)
    same(got["fresh_out"], got["eval_out"])
    if api == "hooks":
        assert got["sd"]["metadata"][""]["spectral_norm"] == {"m.version": 1}


def test_prune_while_training(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_square)
        prune.global_unstructured(
            [(model.lin, "weight"), (model, "m")], prune.L1Unstructured, amount=0.4
        )
        torch.manual_seed(11)
        prune.random_structured(model.lin, "weight", amount=0.25, dim=0)  # second pass:
        prune.ln_structured(model, "m", amount=0.25, n=2, dim=1)  # a PruningContainer
        prune.l1_unstructured(model.lin, "bias", amount=0.5)
        mid = {
            "registries": registries(model),
            "sd": sd_of(model),
            "hooks": [type(h).__name__ for h in model._forward_pre_hooks.values()],
        }
        losses = train(model)
        grads = grads_of(model)
        zeros = (int((model.m == 0).sum()), int((model.lin.weight == 0).sum()))
        for mod, name in ((model.lin, "weight"), (model.lin, "bias"), (model, "m")):
            prune.remove(mod, name)
        return {
            **mid,
            "losses": losses,
            "grads": grads,
            "zeros": zeros,
            "after": registries(model),
            "after_sd": sd_of(model),
            "no_hooks": (len(model._forward_pre_hooks), len(model.lin._forward_pre_hooks)),
            "out": model(x_in()).detach(),
        }

    got = check(base, scenario)
    assert got["no_hooks"] == (0, 0) and got["zeros"][0] > 0
    assert got["hooks"] == ["PruningContainer"]


# --------------------------------------------------------------- autocast, checkpoint


def test_autocast_bfloat16(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        seen: list[Any] = []
        model.b1.register_forward_hook(
            lambda m, a, o: seen.append((o.dtype, torch.is_autocast_enabled("cpu")))
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x_in())
            loss = out.float().square().sum()
        loss.backward()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
            plain = model(x_in()).detach()
        return {
            "out": out.detach(),
            "grads": grads_of(model),
            "param_dtypes": [p.dtype for p in model.parameters()],
            "seen": seen,
            "plain": plain,
        }

    got = check(base, scenario)
    assert got["out"].dtype == torch.bfloat16 and got["plain"].dtype == torch.float32
    assert all(d == torch.float32 for d in got["param_dtypes"])


def make_ckpt_net(base: type[nn.Module], reentrant: bool, log: list[str]) -> type[nn.Module]:
    """Checkpointed blocks with dropout (the RNG state must be replayed) and a log."""

    class Block(base):  # type: ignore[misc, valid-type]
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.lin = nn.Linear(4, 4)
            self.drop = nn.Dropout(0.3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            log.append(f"{self.name}:{torch.is_grad_enabled()}")
            return self.drop(torch.tanh(self.lin(x)))

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.b1 = Block("b1")
            self.b2 = Block("b2")
            self.seq = nn.Sequential(Block("s1"), Block("s2"))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = checkpoint(self.b1, x, use_reentrant=reentrant)
            x = checkpoint(lambda y: self.b2(y) * 2, x, use_reentrant=reentrant)
            return checkpoint_sequential(self.seq, 2, x, use_reentrant=reentrant)

    return Net


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "nonreentrant"])
def test_checkpoint(base: type[nn.Module], reentrant: bool) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        log: list[str] = []
        torch.manual_seed(0)
        model = make_ckpt_net(b, reentrant, log)()
        hooks: list[str] = []
        model.b1.register_forward_hook(lambda m, a, o: hooks.append("b1"))
        model.seq[1].register_forward_pre_hook(lambda m, a: hooks.append("s2"))
        x = x_in().requires_grad_()
        torch.manual_seed(42)
        out = model(x)
        forward_log = list(log)
        out.sum().backward()
        return {
            "out": out.detach(),
            "x_grad": x.grad,
            "grads": grads_of(model),
            "forward_log": forward_log,
            "log": log,
            "hooks": hooks,
        }

    got = check(base, scenario)
    assert len(got["log"]) > len(got["forward_log"])  # recomputed in backward
    # reentrant recomputation reruns whole forwards, hooks included; non-reentrant stops
    # early, once the saved tensors it needs are back
    assert got["hooks"].count("b1") == (2 if reentrant else 1)


# ---------------------------------------------------------------- lazy and meta init


def make_lazy_net(base: type[nn.Module]) -> type[nn.Module]:
    """A fastmodule tree with stock lazy layers and a lazy module of its own."""
    from torch.nn.modules.lazy import LazyModuleMixin
    from torch.nn.parameter import UninitializedParameter

    class LazyScale(LazyModuleMixin, base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.weight = UninitializedParameter()

        def initialize_parameters(self, x: torch.Tensor) -> None:
            if self.has_uninitialized_params():
                with torch.no_grad():
                    self.weight.materialize((x.shape[-1],))
                    self.weight.fill_(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    class LazyNet(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.LazyLinear(5)
            self.scale = LazyScale()
            self.norm = nn.LazyBatchNorm1d()
            self.head = nn.Linear(5, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.norm(self.scale(self.inp(x))))

    return LazyNet


def lazy_view(model: nn.Module) -> list[tuple[str, str, tuple[int, ...] | None]]:
    """Every state-dict entry: name, tensor class and shape (None while uninitialized)."""
    from torch.nn.parameter import UninitializedTensorMixin

    return [
        (k, type(v).__name__, None if isinstance(v, UninitializedTensorMixin) else tuple(v.shape))
        for k, v in model.state_dict(keep_vars=True).items()
    ]


def test_lazy_modules_materialise(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_lazy_net)
        before = {
            "view": lazy_view(model),
            "classes": [type(m).__name__ for m in model.modules()],
            "uninit": model.inp.has_uninitialized_params(),
        }
        torch.manual_seed(3)
        out = model(x_in(4, 3))
        after = {
            "view": lazy_view(model),
            "classes": [type(m).__name__ for m in model.modules()],
            "pre_hooks": [len(m._forward_pre_hooks) for m in model.modules()],
            "sd": sd_of(model),
        }
        losses = train(model, cols=3)
        # a state dict materialises a second, uninitialized tree on load
        fresh = build(b, make_lazy_net, seed=9)
        r = fresh.load_state_dict(model.state_dict())
        return {
            "before": before,
            "out": out.detach(),
            "after": after,
            "losses": losses,
            "load": (r.missing_keys, r.unexpected_keys),
            "fresh_view": lazy_view(fresh),
            "fresh_out": fresh.eval()(x_in(4, 3)).detach(),
            "out_eval": model.eval()(x_in(4, 3)).detach(),
        }

    got = check(base, scenario)
    assert got["before"]["uninit"] and got["after"]["classes"][1] == "Linear"
    same(got["fresh_out"], got["out_eval"])


def test_meta_device_to_empty_and_assign(base: type[nn.Module]) -> None:
    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        reference = build(b, make_net, seed=4)
        sd = reference.state_dict()
        with torch.device("meta"):
            model = make_net(b)()
        on_meta = [(n, p.device.type) for n, p in model.named_parameters()]
        before = {n: p for n, p in model.named_parameters()}
        model.to_empty(device="cpu")
        after_empty = {
            "devices": {n: t.device.type for n, t in model.state_dict().items()},
            "same_objects": [p is before[n] for n, p in model.named_parameters()],
            "is_param": [type(p).__name__ for p in model.parameters()],
        }
        kept = {n: p for n, p in model.named_parameters()}
        r = model.load_state_dict(sd, assign=True)
        assigned = {
            "load": (r.missing_keys, r.unexpected_keys),
            "shares_storage": [model.get_parameter(n).data_ptr() == sd[n].data_ptr() for n in kept],
            "same_objects": [model.get_parameter(n) is kept[n] for n in kept],
            "is_sd_object": [model.get_parameter(n) is sd[n] for n in kept],
            "buffer_is_sd": model.b1.scale is sd["b1.scale"],
            "requires_grad": [p.requires_grad for p in model.parameters()],
        }
        # straight from meta to loaded weights, the usual pattern
        with torch.device("meta"):
            direct = make_net(b)()
        r2 = direct.load_state_dict(sd, assign=True)
        out = model(x_in())
        out.sum().backward()
        return {
            "on_meta": on_meta,
            "after_empty": after_empty,
            "assigned": assigned,
            "out": out.detach(),
            "grads": grads_of(model),
            "direct_load": (r2.missing_keys, r2.unexpected_keys),
            "direct_out": direct(x_in()).detach(),
            "ref_out": reference(x_in()).detach(),
        }

    got = check(base, scenario)
    same(got["out"], got["ref_out"])
    same(got["direct_out"], got["ref_out"])


@pytest.fixture
def conversion_flags() -> Iterator[None]:
    """Restore torch's module-conversion future flags after the test."""
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    swap = torch.__future__.get_swap_module_params_on_conversion()
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)
        torch.__future__.set_swap_module_params_on_conversion(swap)


@pytest.mark.parametrize("flag", ["default", "overwrite", "swap"])
def test_optimizer_built_before_dtype_conversion(
    base: type[nn.Module], flag: str, conversion_flags: None
) -> None:
    torch.__future__.set_overwrite_module_params_on_conversion(flag == "overwrite")
    torch.__future__.set_swap_module_params_on_conversion(flag == "swap")

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        ids = {n: p for n, p in model.named_parameters()}
        model.zero_grad()
        model(x_in()).sum().backward()  # grads exist before the conversion
        model.to(torch.float64)
        same_objects = [p is ids[n] for n, p in model.named_parameters()]
        in_opt = [any(p is q for q in opt.param_groups[0]["params"]) for p in model.parameters()]
        before_step = {n: p.detach().clone() for n, p in model.named_parameters()}
        result = outcome(lambda: opt.step())
        changed = [not torch.equal(p.detach(), before_step[n]) for n, p in model.named_parameters()]
        model.double()
        model.float()
        return {
            "same_objects": same_objects,
            "in_opt": in_opt,
            "step": result,
            "changed": changed,
            "dtypes": [p.dtype for p in model.parameters()],
            "grad_dtypes": [None if p.grad is None else p.grad.dtype for p in model.parameters()],
            "sd": sd_of(model),
        }

    got = check(base, scenario)
    if flag == "default":
        assert all(got["same_objects"]) and all(got["in_opt"])
        assert got["step"] == ("ok", None) and all(got["changed"])


def test_averaged_model_and_grad_utils(base: type[nn.Module]) -> None:
    """``swa_utils.AveragedModel`` (deepcopy + EMA), grad clipping, vector round trips."""

    def scenario(b: type[nn.Module]) -> dict[str, Any]:
        model = build(b, make_net)
        ema = torch.optim.swa_utils.AveragedModel(
            model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        norms = []
        for step in range(3):
            opt.zero_grad()
            model(x_in(seed=step)).square().sum().backward()
            norms.append(nn.utils.clip_grad_norm_(model.parameters(), 0.5))
            opt.step()
            ema.update_parameters(model)
        vec = nn.utils.parameters_to_vector(model.parameters())
        nn.utils.vector_to_parameters(vec * 2, model.parameters())
        return {
            "norms": norms,
            "ema_sd": sd_of(ema),
            "ema_out": ema(x_in()).detach(),
            "ema_module": type(ema.module).__name__,
            "vec": vec.detach(),
            "doubled": sd_of(model),
        }

    check(base, scenario)
