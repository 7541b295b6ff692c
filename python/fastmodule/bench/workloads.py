"""Workloads: whole programs as users write them around small models, batch 1 or close.

Each ``workload_*`` case times one step of a realistic program written here in torch
(no dependency beyond torch, numpy and, for some cases, timm and transformers), three
ways, on the CPU:

- stock: the program as written, torch's module machinery as installed;
- fast: the same program and the very same model object under
  ``fastmodule.accelerated(model)`` (``workload_ode_rk4_install``: under
  ``fastmodule.install()``, undone after each timed loop);
- lower: the same work without module machinery. For the RL, ODE and PINN cases: the
  same program with the model's math written functionally (``F.linear``,
  ``torch.tanh``) on the very same weights, no ``.train()`` per step, the device known.
  For the timm and BERT cases (as for the real models of
  :mod:`~fastmodule.bench.models`): every module call goes straight to ``forward``.

At build, every case runs its program stock, fast and lower and checks that the
results are bitwise equal (raising ``RuntimeError`` otherwise); random draws are
seeded the same on each side.

The cases:

- ``workload_sb3_predict``: a Stable-Baselines3-style ``ActorCriticPolicy`` (flatten
  features extractor, separate 64-64 Tanh policy and value nets, action and value heads)
  with SB3's ``predict``: ``set_training_mode(False)`` (``self.train(False)``), the
  ``device`` property (the first parameter's device, read on every call), the
  observation as a tensor, a no-grad forward of the policy branch, the Categorical's
  mode, numpy out; then one step of a CartPole-like environment in numpy.
- ``workload_cleanrl_agent``: CleanRL's PPO ``Agent`` (orthogonally initialised actor
  and critic ``nn.Sequential`` nets) acting on one observation:
  ``get_action_and_value(obs)`` under no_grad, the action sampled from a Categorical.
- ``workload_timm_<name>``: small timm image models (random weights), eval, no_grad,
  one 1x3x224x224 image.
- ``workload_ode_rk4_accelerate`` and ``workload_ode_rk4_install``: a fixed-step RK4
  solver in torch integrating an MLP vector field ``forward(t, y)`` (2-64-64-2 Tanh)
  from a batch-1 state, 4 field calls per step. As torchdiffeq does, the solver wraps
  the user's function in a small module of its own (``_PerturbFunc``) for each solve:
  ``accelerate(field)`` does not reach the wrapper's class, ``install()`` does.
- ``workload_sentence_encoder``: sentence-transformers' ``encode`` around a small HF
  BERT (hidden 128, 2 layers): ``eval()`` on every call, a no-grad forward of 4
  sequences of 16 tokens with padding, mean pooling under the attention mask, L2
  normalisation.
- ``workload_pinn_inference`` and ``workload_pinn_train_step``: a physics-informed MLP
  ``u(x, t)`` (2-64x4-1 Tanh): a no-grad forward on 256 points; one Adam training step
  on the viscous Burgers residual (``u_t + u u_x - nu u_xx`` with ``torch.autograd.grad``
  and ``create_graph=True``) at 256 collocation points plus an initial-condition loss
  at 64 points. The three columns train their own identical copies.

Cases whose package (timm, transformers) is not installed are not offered. A plain
``fastmodule bench`` runs the group, last (about a minute); ``--only 'workload_*'`` runs
it alone.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from fastmodule.acceleration import accelerated, install, installed, uninstall
from fastmodule.bench.case import Case, Variant, direct_forward, have, scaled, three

__all__ = [
    "WORKLOAD_CASES",
    "ActorCriticPolicy",
    "CartPole",
    "CleanRLAgent",
    "VectorField",
    "installed_everywhere",
    "pinn_model",
    "rk4",
]

#: The CartPole observation and action sizes.
OBS_DIM, N_ACTIONS = 4, 2
#: RK4 steps of one solve (4 vector-field calls each), at scale 1.
ODE_STEPS = 200
#: The timm models timed (small ones, random weights).
TIMM_MODELS: tuple[str, ...] = ("mobilenetv3_small_050", "lcnet_050", "efficientnet_lite0")


# --- helpers --------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Bitwise equality of tensors, arrays, numbers and (nested) tuples or lists of them."""
    if isinstance(a, tuple | list):
        return (
            isinstance(b, tuple | list)
            and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def _check(name: str, stock: Any, fast: Any, lower: Any) -> None:
    """Raise unless the three results are bitwise equal."""
    if not _same(stock, fast):
        raise RuntimeError(f"{name}: stock and fast results differ")
    if not _same(stock, lower):
        raise RuntimeError(f"{name}: stock and lower-bound results differ")


def _contexts(
    *makers: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """One context made of ``makers``' contexts, entered in order."""

    @contextlib.contextmanager
    def context() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for make in makers:
                stack.enter_context(make())
            yield

    return context


@contextlib.contextmanager
def installed_everywhere() -> Iterator[None]:
    """``fastmodule.install()`` for the block, undone after it (left as it was if it was
    already in effect)."""
    if installed():
        yield
        return
    install()
    try:
        yield
    finally:
        uninstall()


def _tanh_mlp(x: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The math of Linear/Tanh/.../Linear on the given ``(weight, bias)`` pairs."""
    for weight, bias in layers[:-1]:
        x = torch.tanh(F.linear(x, weight, bias))
    weight, bias = layers[-1]
    return F.linear(x, weight, bias)


def _linears(*modules: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(weight, bias)`` of every ``nn.Linear`` in ``modules``, in order."""
    return [
        (m.weight, m.bias)
        for module in modules
        for m in module.modules()
        if isinstance(m, nn.Linear)
    ]


# --- RL: Stable-Baselines3 ------------------------------------------------------------


class CartPole:
    """CartPole's dynamics in numpy (Euler steps of 0.02 s, reset when the pole falls or
    the cart leaves the track); the observation is ``float32`` as Gymnasium's."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.obs = self.reset()

    def reset(self) -> np.ndarray:
        """A new episode: a small random state."""
        self.obs = self.rng.uniform(-0.05, 0.05, size=OBS_DIM).astype(np.float32)
        return self.obs

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        """Push left (0) or right (1); returns ``(obs, reward, done)``."""
        x, x_dot, theta, theta_dot = (float(v) for v in self.obs)
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.obs = np.array([x, x_dot, theta, theta_dot], dtype=np.float32)
        done = abs(x) > 2.4 or abs(theta) > 0.2095
        if done:
            self.reset()
        return self.obs, 1.0, done


class FlattenExtractor(nn.Module):
    """SB3's default features extractor."""

    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.flatten(observations)


class MlpExtractor(nn.Module):
    """SB3's ``MlpExtractor`` with ``net_arch=dict(pi=[64, 64], vf=[64, 64])``, Tanh."""

    def __init__(self, feature_dim: int) -> None:
        super().__init__()
        self.policy_net = nn.Sequential(
            nn.Linear(feature_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()
        )
        self.value_net = nn.Sequential(
            nn.Linear(feature_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh()
        )
        self.latent_dim_pi = self.latent_dim_vf = 64

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: torch.Tensor) -> torch.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: torch.Tensor) -> torch.Tensor:
        return self.value_net(features)


class ActorCriticPolicy(nn.Module):
    """SB3's ``ActorCriticPolicy`` for a discrete action space, reduced to what
    ``predict`` and ``forward`` run (no optimizer, no spaces objects)."""

    def __init__(self, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS) -> None:
        super().__init__()
        self.obs_shape = (obs_dim,)
        self.features_extractor = FlattenExtractor()
        self.mlp_extractor = MlpExtractor(obs_dim)
        self.action_net = nn.Linear(64, n_actions)
        self.value_net = nn.Linear(64, 1)

    @property
    def device(self) -> torch.device:
        """The first parameter's device (SB3's ``get_device``), read on every predict."""
        for param in self.parameters():
            return param.device
        return torch.device("cpu")

    def set_training_mode(self, mode: bool) -> None:
        """Training or evaluation mode (BatchNorm, dropout)."""
        self.train(mode)

    def extract_features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.features_extractor(obs.float())

    def get_distribution(self, obs: torch.Tensor) -> Categorical:
        latent_pi = self.mlp_extractor.forward_actor(self.extract_features(obs))
        return Categorical(logits=self.action_net(latent_pi))

    def forward(
        self, obs: torch.Tensor, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        latent_pi, latent_vf = self.mlp_extractor(self.extract_features(obs))
        values = self.value_net(latent_vf)
        distribution = Categorical(logits=self.action_net(latent_pi))
        actions = distribution.probs.argmax(dim=1) if deterministic else distribution.sample()
        return actions, values, distribution.log_prob(actions)

    def _predict(self, observation: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        distribution = self.get_distribution(observation)
        if deterministic:
            return torch.argmax(distribution.probs, dim=1)
        return distribution.sample()

    def predict(self, observation: np.ndarray, deterministic: bool = True) -> tuple[Any, None]:
        """SB3's ``BasePolicy.predict`` for one (not vectorized) observation."""
        self.set_training_mode(False)
        observation = np.array(observation).reshape((-1, *self.obs_shape))
        obs_tensor = torch.as_tensor(observation, device=self.device)
        with torch.no_grad():
            actions = self._predict(obs_tensor, deterministic=deterministic)
        return actions.cpu().numpy().squeeze(axis=0), None


def _functional_predict(
    layers: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> Callable[[np.ndarray], tuple[Any, None]]:
    """``predict``'s work on the policy's weights: the device known, no ``train``."""

    def predict(observation: np.ndarray, deterministic: bool = True) -> tuple[Any, None]:
        observation = np.array(observation).reshape((-1, OBS_DIM))
        obs_tensor = torch.as_tensor(observation, device=device)
        with torch.no_grad():
            logits = _tanh_mlp(obs_tensor.float().flatten(1), layers)
            distribution = Categorical(logits=logits)
            actions = (
                torch.argmax(distribution.probs, dim=1) if deterministic else distribution.sample()
            )
        return actions.cpu().numpy().squeeze(axis=0), None

    return predict


#: One agent-environment step of ``workload_sb3_predict``.
_SB3_STEP = "env.step(int(predict(env.obs)[0]))"


def _build_sb3_predict(device: torch.device) -> dict[str, Variant]:
    torch.manual_seed(0)
    policy = ActorCriticPolicy()
    lower = _functional_predict(
        _linears(policy.mlp_extractor.policy_net, policy.action_net), torch.device("cpu")
    )

    def rollout(predict: Callable[[np.ndarray], tuple[Any, None]]) -> list[Any]:
        env = CartPole(seed=1)
        return [env.step(int(predict(env.obs)[0]))[0].copy() for _ in range(scaled(50))]

    stock = rollout(policy.predict)
    with accelerated(policy):
        fast = rollout(policy.predict)
    _check("workload_sb3_predict", stock, fast, rollout(lower))
    return three(
        Variant(_SB3_STEP, {"env": CartPole(seed=1), "predict": policy.predict}),
        Variant(
            _SB3_STEP,
            {"env": CartPole(seed=1), "predict": policy.predict},
            lambda: accelerated(policy),
        ),
        Variant(_SB3_STEP, {"env": CartPole(seed=1), "predict": lower}),
    )


# --- RL: CleanRL ----------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """CleanRL's orthogonal initialisation."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class CleanRLAgent(nn.Module):
    """CleanRL's ``ppo.py`` ``Agent`` for a discrete action space."""

    def __init__(
        self, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS, hidden: int = 64
    ) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, n_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def _functional_agent(
    actor: list[tuple[torch.Tensor, torch.Tensor]], critic: list[tuple[torch.Tensor, torch.Tensor]]
) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    """``get_action_and_value``'s math on the agent's weights."""

    def get_action_and_value(
        x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        probs = Categorical(logits=_tanh_mlp(x, actor))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), _tanh_mlp(x, critic)

    return get_action_and_value


#: One action of ``workload_cleanrl_agent`` (as in CleanRL's rollout loop).
_CLEANRL_STEP = "with no_grad(): act(obs)"


def _build_cleanrl_agent(device: torch.device) -> dict[str, Variant]:
    torch.manual_seed(0)
    agent = CleanRLAgent()
    lower = _functional_agent(_linears(agent.actor), _linears(agent.critic))
    obs = torch.randn(1, OBS_DIM)

    def act(get_action_and_value: Callable[..., Any]) -> Any:
        torch.manual_seed(2)
        with torch.no_grad():
            return [get_action_and_value(obs) for _ in range(8)]

    stock = act(agent.get_action_and_value)
    with accelerated(agent):
        fast = act(agent.get_action_and_value)
    _check("workload_cleanrl_agent", stock, fast, act(lower))

    def namespace(fn: Callable[..., Any]) -> dict[str, Any]:
        return {"act": fn, "obs": obs, "no_grad": torch.no_grad}

    return three(
        Variant(_CLEANRL_STEP, namespace(agent.get_action_and_value)),
        Variant(_CLEANRL_STEP, namespace(agent.get_action_and_value), lambda: accelerated(agent)),
        Variant(_CLEANRL_STEP, namespace(lower)),
    )


# --- the forward-only real models (timm, BERT) ----------------------------------------


def _forward_cases(
    name: str, model: nn.Module, run: Callable[[], Any], *outer: Callable[[], Any]
) -> dict[str, Variant]:
    """Stock, ``accelerated(model)`` and every module call straight to ``forward``, each
    inside ``outer``'s contexts; ``run()``'s results checked bitwise equal first."""
    contexts = (
        _contexts(*outer),
        _contexts(*outer, lambda: accelerated(model)),
        _contexts(*outer, direct_forward),
    )
    results = []
    for context in contexts:
        with context():
            results.append(run())
    _check(name, *results)
    return three(*(Variant("run()", {"run": run}, context) for context in contexts))


def _timm_builder(model_name: str) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        import timm

        torch.manual_seed(0)
        model = timm.create_model(model_name, pretrained=False).eval()
        x = torch.randn(1, 3, 224, 224)

        def run() -> torch.Tensor:
            return model(x)

        return _forward_cases(f"workload_timm_{model_name}", model, run, torch.no_grad)

    return build


def _build_sentence_encoder(device: torch.device) -> dict[str, Variant]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        vocab_size=1000,
    )
    model = BertModel(config)
    ids = torch.randint(1, 1000, (4, 16))
    mask = torch.ones_like(ids)
    for row, length in enumerate((16, 12, 9, 5)):  # padded sentences
        ids[row, length:] = 0
        mask[row, length:] = 0

    def encode() -> torch.Tensor:
        """sentence-transformers' ``encode``: eval, forward, mean pooling, normalise."""
        model.eval()
        with torch.no_grad():
            tokens = model(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return F.normalize(pooled, p=2, dim=1)

    return _forward_cases("workload_sentence_encoder", model, encode)


# --- ODE ------------------------------------------------------------------------------


class VectorField(nn.Module):
    """The user's vector field ``dy/dt = f(t, y)``: an MLP 2-64-64-2 with Tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
        )

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(y)


class _PerturbFunc(nn.Module):
    """The solver's wrapper around the user's function (torchdiffeq's), one per solve."""

    def __init__(self, base_func: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.base_func = base_func

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.base_func(t.to(y.dtype), y)


def rk4(
    func: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    y0: torch.Tensor,
    t1: float,
    steps: int,
    wrap: bool = True,
) -> torch.Tensor:
    """``y(t1)`` from ``y(0) = y0`` by ``steps`` classic Runge-Kutta steps; ``func`` is
    wrapped in a :class:`_PerturbFunc` made for this solve unless ``wrap`` is False."""
    f = _PerturbFunc(func) if wrap else func
    h = t1 / steps
    t = torch.zeros((), dtype=y0.dtype)
    y = y0
    for _ in range(steps):
        k1 = f(t, y)
        k2 = f(t + h / 2, y + h / 2 * k1)
        k3 = f(t + h / 2, y + h / 2 * k2)
        k4 = f(t + h, y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = t + h
    return y


def _ode_builder(install_everything: bool) -> Callable[[torch.device], dict[str, Variant]]:
    def build(device: torch.device) -> dict[str, Variant]:
        torch.manual_seed(0)
        field = VectorField()
        layers = _linears(field)

        def functional_field(t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return _tanh_mlp(y, layers)

        y0 = torch.randn(1, 2)
        steps = scaled(ODE_STEPS)

        def solve() -> torch.Tensor:
            return rk4(field, y0, 1.0, steps)

        def solve_lower() -> torch.Tensor:
            return rk4(functional_field, y0, 1.0, steps, wrap=False)

        fast = installed_everywhere if install_everything else lambda: accelerated(field)
        with torch.no_grad():
            stock_y = solve()
            with fast():
                fast_y = solve()
            lower_y = solve_lower()
        _check(
            f"workload_ode_rk4_{'install' if install_everything else 'accelerate'}",
            stock_y,
            fast_y,
            lower_y,
        )
        return three(
            Variant("solve()", {"solve": solve}, torch.no_grad),
            Variant("solve()", {"solve": solve}, _contexts(torch.no_grad, fast)),
            Variant("solve()", {"solve": solve_lower}, torch.no_grad),
        )

    return build


# --- PINN -----------------------------------------------------------------------------

#: Viscosity of the Burgers equation of the PINN cases.
NU = 0.01 / math.pi


def pinn_model() -> nn.Module:
    """The PINN's ``u(x, t)``: Linear(2, 64), 4 x (Tanh, Linear(64, 64)) ... Linear(64, 1)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(2, 64)]
    for _ in range(3):
        layers += [nn.Tanh(), nn.Linear(64, 64)]
    return nn.Sequential(*layers, nn.Tanh(), nn.Linear(64, 1))


def _pinn_points() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collocation points ``(x, t)`` in [-1, 1] x [0, 1], initial-condition points and
    their values ``-sin(pi x)``; seed 3."""
    gen = torch.Generator().manual_seed(3)
    inside = torch.rand(256, 2, generator=gen) * torch.tensor([2.0, 1.0]) - torch.tensor([1.0, 0])
    x0 = torch.rand(64, 1, generator=gen) * 2 - 1
    initial = torch.cat([x0, torch.zeros_like(x0)], dim=1)
    return inside, initial, -torch.sin(math.pi * x0)


def _build_pinn_inference(device: torch.device) -> dict[str, Variant]:
    model = pinn_model()
    layers = _linears(model)
    points, _, _ = _pinn_points()

    def run() -> torch.Tensor:
        return model(points)

    def run_lower() -> torch.Tensor:
        return _tanh_mlp(points, layers)

    with torch.no_grad():
        stock = run()
        with accelerated(model):
            fast = run()
        lower = run_lower()
    _check("workload_pinn_inference", stock, fast, lower)
    return three(
        Variant("run()", {"run": run}, torch.no_grad),
        Variant("run()", {"run": run}, _contexts(torch.no_grad, lambda: accelerated(model))),
        Variant("run()", {"run": run_lower}, torch.no_grad),
    )


def _pinn_step(
    u: Callable[[torch.Tensor], torch.Tensor],
    opt: torch.optim.Optimizer,
    points: torch.Tensor,
    initial: torch.Tensor,
    u0: torch.Tensor,
) -> torch.Tensor:
    """One training step on the Burgers residual and the initial condition; the loss."""
    opt.zero_grad()
    xt = points.clone().requires_grad_(True)
    out = u(xt)
    grads = torch.autograd.grad(out, xt, torch.ones_like(out), create_graph=True)[0]
    u_x, u_t = grads[:, :1], grads[:, 1:]
    u_xx = torch.autograd.grad(u_x, xt, torch.ones_like(u_x), create_graph=True)[0][:, :1]
    residual = u_t + out * u_x - NU * u_xx
    loss = residual.pow(2).mean() + (u(initial) - u0).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


def _build_pinn_train_step(device: torch.device) -> dict[str, Variant]:
    points, initial, u0 = _pinn_points()
    base = pinn_model()

    def trainer(lower: bool) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
        """A copy of the model and one training step of it (Adam, lr 1e-3)."""
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        if lower:
            layers = _linears(model)

            def u(x: torch.Tensor) -> torch.Tensor:
                return _tanh_mlp(x, layers)

        else:
            u = model

        def step() -> torch.Tensor:
            return _pinn_step(u, opt, points, initial, u0)

        return model, step

    runs = []
    for kind in ("stock", "fast", "lower"):
        model, step = trainer(lower=kind == "lower")
        context = accelerated(model) if kind == "fast" else contextlib.nullcontext()
        with context:
            losses = [step() for _ in range(3)]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    _check("workload_pinn_train_step", *runs)
    stock_model, stock_step = trainer(lower=False)
    fast_model, fast_step = trainer(lower=False)
    _, lower_step = trainer(lower=True)
    return three(
        Variant("step()", {"step": stock_step}),
        Variant("step()", {"step": fast_step}, lambda: accelerated(fast_model)),
        Variant("step()", {"step": lower_step}),
    )


# --- the cases ------------------------------------------------------------------------

_LOWER_FUNCTIONAL = "lower bound: the same math in functional calls on the same weights"
_LOWER_DIRECT = "lower bound: module calls straight to forward"

WORKLOAD_CASES: tuple[Case, ...] = (
    (
        Case(
            "workload_sb3_predict",
            "SB3-style ActorCriticPolicy (64-64 Tanh pi/vf nets): predict(obs) at batch 1 "
            f"(train(False), device, no_grad, Categorical mode) + a CartPole step in numpy; "
            f"{_LOWER_FUNCTIONAL}, no train(), device known",
            _build_sb3_predict,
        ),
        Case(
            "workload_cleanrl_agent",
            "CleanRL PPO Agent (orthogonal-init 64-64 Tanh actor and critic Sequentials): "
            f"get_action_and_value(obs) on one observation, no_grad, sampled; {_LOWER_FUNCTIONAL}",
            _build_cleanrl_agent,
        ),
    )
    + tuple(
        Case(
            f"workload_timm_{name}",
            f"timm {name} (random weights), eval, no_grad, 1x3x224x224; {_LOWER_DIRECT}",
            _timm_builder(name),
        )
        for name in TIMM_MODELS
        if have("timm")
    )
    + tuple(
        Case(
            f"workload_ode_rk4_{how}",
            f"fixed-step RK4, {ODE_STEPS} steps x 4 calls of an MLP field 2-64-64-2 Tanh, "
            f"batch 1, no_grad, the solver's own wrapper module per solve; fast: {text}; "
            f"{_LOWER_FUNCTIONAL}, no wrapper",
            _ode_builder(how == "install"),
        )
        for how, text in (
            ("accelerate", "accelerate(field) (the wrapper's class stays stock)"),
            ("install", "fastmodule.install() (the wrapper's class too)"),
        )
    )
    + (
        (
            Case(
                "workload_sentence_encoder",
                "sentence-transformers-style encode: HF BERT (2 layers, hidden 128), eval() "
                f"per call, no_grad, 4 x 16 tokens padded, masked mean pooling, L2 norm; "
                f"{_LOWER_DIRECT}",
                _build_sentence_encoder,
            ),
        )
        if have("transformers")
        else ()
    )
    + (
        Case(
            "workload_pinn_inference",
            f"PINN MLP 2-64x4-1 Tanh, no_grad forward on 256 points; {_LOWER_FUNCTIONAL}",
            _build_pinn_inference,
        ),
        Case(
            "workload_pinn_train_step",
            "PINN MLP 2-64x4-1 Tanh: one Adam step on the Burgers residual (u_x, u_t, u_xx "
            "by autograd.grad, create_graph) at 256 points + initial loss at 64; "
            f"{_LOWER_FUNCTIONAL}",
            _build_pinn_train_step,
        ),
    )
)
