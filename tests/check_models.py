"""Models for ``fastmodule.check``'s tests and ``python -m fastmodule check`` factories:
one that agrees with stock, one made to differ when accelerated, one that differs from
itself, one with running statistics, and one whose inputs are keyword arguments."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

import fastmodule
from fastmodule.bench.workloads import CleanRLAgent

#: The reason the tests of a reported difference skip where no native path is on: these
#: models differ only when ``fastmodule.is_accelerated``, which no module is there.
DIFFERS_WHEN_ACCELERATED = "its model differs from stock only when accelerated"


class Small(nn.Module):
    """Linear -> ReLU -> Linear with a BatchNorm (running statistics in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Differs(Small):
    """Adds 1 to its output when accelerated: a parity failure made on purpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + 1 if fastmodule.is_accelerated(self) else out


_calls = itertools.count()


class Nondeterministic(Small):
    """Each call adds a different number: two stock runs differ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + next(_calls)


class Keywords(Small):
    """Takes its input as a keyword argument and returns a dict."""

    def forward(self, *, x: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"out": super().forward(x) * scale}


def small() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(4, 8),)


def differs() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Differs().eval(), (torch.randn(4, 8),)


def nondeterministic() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Nondeterministic().eval(), torch.randn(4, 8)


def keywords() -> tuple[nn.Module, dict[str, object]]:
    torch.manual_seed(0)
    return Keywords().eval(), {"x": torch.randn(4, 8), "scale": 2.0}


def without_inputs() -> nn.Module:
    return Small().eval()


# What models return and do, beyond a tensor (issue 29): each factory builds a model
# that shows one case.


def _tiny_config(name: str) -> object:
    import transformers

    common = {"vocab_size": 64}
    if name == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, **common)
    return transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        **common,
    )


def gpt2() -> tuple[nn.Module, dict[str, object]]:
    """HF GPT-2 LM head from a tiny config, default configuration (it returns a
    ``ModelOutput`` holding a ``DynamicCache``)."""
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_tiny_config("gpt2")).eval()  # type: ignore[arg-type]
    return model, {"input_ids": torch.randint(0, 64, (1, 8))}


def llama() -> tuple[nn.Module, dict[str, object]]:
    """HF Llama causal LM from a tiny config, default configuration."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_tiny_config("llama")).eval()  # type: ignore[arg-type]
    return model, {"input_ids": torch.randint(0, 64, (1, 8))}


def lora() -> tuple[nn.Module, dict[str, object]]:
    """The tiny Llama wrapped by PEFT's LoRA (q_proj, v_proj), default configuration."""
    import peft

    model, inputs = llama()
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(model, config).eval(), inputs  # type: ignore[arg-type]


class Distribution(nn.Module):
    """Returns a ``torch.distributions.Normal`` (an object with a ``__dict__``)."""

    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.distributions.Normal:
        return torch.distributions.Normal(self.loc(x), 1.0)


def distribution() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Distribution().eval(), torch.randn(3, 4)


class Namespace(nn.Module):
    """Returns a ``SimpleNamespace`` holding a tensor, a number and a cycle back to it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> object:
        import types

        out = types.SimpleNamespace(y=self.proj(x), n=3, extras=[])
        out.extras.append(out)  # a cycle
        return out


def namespace() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Namespace().eval(), torch.randn(3, 4)


class NanOutput(nn.Module):
    """Returns a tuple holding a tensor with NaNs and a Python ``nan``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        return self.proj(x) * torch.tensor([float("nan"), 1.0]), float("nan")


def nan_output() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return NanOutput().eval(), torch.randn(3, 4)


def lazy() -> tuple[nn.Module, torch.Tensor]:
    """Lazy modules: their parameters exist after the first call only."""
    torch.manual_seed(0)
    return nn.Sequential(nn.LazyLinear(3), nn.ReLU(), nn.LazyLinear(2)).eval(), torch.randn(2, 5)


class RebindsBuffer(nn.Module):
    """Forward rebinds a registered buffer to a new, longer tensor (a growing history)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("history", torch.zeros(0))
        self.proj = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.history = torch.cat([self.history, self.proj(x).sum(0)])
        return self.history * 2


def rebinds_buffer() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return RebindsBuffer().eval(), torch.randn(2, 3)


def rejects() -> tuple[nn.Module, torch.Tensor]:
    """Inputs of the wrong width: the model raises on them in every run."""
    torch.manual_seed(0)
    return Small().eval(), torch.randn(4, 5)


class Shift(nn.Module):
    """Adds 1 when accelerated: a difference deep in the tree."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1 if fastmodule.is_accelerated(self) else x


class RaisesAccelerated(nn.Module):
    """Raises only when accelerated."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fastmodule.is_accelerated(self):
            raise ValueError("only when accelerated")
        return x


class RaisesDifferently(nn.Module):
    """Raises in every run, with another message when accelerated."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("accelerated" if fastmodule.is_accelerated(self) else "stock")


def _deep(inner: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), inner), nn.Linear(4, 2))
    return model.eval(), torch.randn(2, 4)


def shift() -> tuple[nn.Module, torch.Tensor]:
    return _deep(Shift())


def raises_accelerated() -> tuple[nn.Module, torch.Tensor]:
    return _deep(RaisesAccelerated())


def raises_differently() -> tuple[nn.Module, torch.Tensor]:
    return _deep(RaisesDifferently())


class QuickStart(fastmodule.Module):
    """The README's quick start: a ``fastmodule.Module`` subclass holding torch layers."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def quick_start() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return QuickStart().eval(), torch.randn(4, 8)


class Interrupted(Small):
    """Its second call is interrupted, as Ctrl-C interrupts it (KeyboardInterrupt)."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls == 2:
            raise KeyboardInterrupt
        return super().forward(x)


def interrupted() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    Interrupted.calls = 0
    return Interrupted().eval(), torch.randn(4, 8)


# Models driven through a method, not forward (issue 37, item 2): check --method NAME.


class Agent(CleanRLAgent):
    """CleanRL's PPO ``Agent`` (the benchmark's workload model), smaller: a critic and an
    actor, no forward; it is driven through ``get_value`` and ``get_action_and_value``,
    which samples an action from a ``Categorical`` unless one is given."""

    def __init__(self, observations: int = 4, actions: int = 2, hidden: int = 16) -> None:
        super().__init__(observations, actions, hidden)


def agent() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """An ``Agent`` and a batch of observations with the actions taken (a PPO update's
    call: deterministic)."""
    torch.manual_seed(0)
    return Agent(), (torch.randn(32, 4), torch.randint(0, 2, (32,)))


def agent_sampling() -> tuple[nn.Module, torch.Tensor]:
    """An ``Agent`` and observations only: each call samples the actions (a rollout's
    call), reproducible because every run starts from the same RNG state."""
    torch.manual_seed(0)
    return Agent(), torch.randn(32, 4)


class Policy(nn.Module):
    """What Stable-Baselines3's ``BasePolicy`` does around its network, without SB3:
    ``set_training_mode``, a ``device`` property, and ``predict`` taking and returning
    NumPy arrays (and a recurrent state, None)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp_extractor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16))
        self.action_net = nn.Linear(16, 3)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def set_training_mode(self, mode: bool) -> None:
        self.train(mode)

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        logits = self.action_net(self.mlp_extractor(obs))
        if deterministic:
            return logits.argmax(-1)
        return torch.distributions.Categorical(logits=logits).sample()

    def predict(self, observation: np.ndarray, deterministic: bool = True) -> tuple[object, None]:
        self.set_training_mode(False)
        obs = torch.as_tensor(observation, device=self.device)
        with torch.no_grad():
            actions = self(obs, deterministic=deterministic)
        return actions.cpu().numpy(), None


def policy() -> tuple[nn.Module, tuple[np.ndarray]]:
    torch.manual_seed(0)
    return Policy(), (np.random.default_rng(0).standard_normal((5, 4), dtype=np.float32),)


class ScalesObservations(Policy):
    """``predict`` scales its observation array in place (each run gets a fresh copy)."""

    def predict(self, observation: np.ndarray, deterministic: bool = True) -> tuple[object, None]:
        observation *= 2
        return super().predict(observation, deterministic)


def scales_observations() -> tuple[nn.Module, tuple[np.ndarray]]:
    torch.manual_seed(0)
    obs = np.random.default_rng(0).standard_normal((5, 4), dtype=np.float32)
    return ScalesObservations(), (obs,)


def gpt2_generate() -> tuple[nn.Module, dict[str, object]]:
    """A tiny HF GPT-2 LM head (no download) and greedy ``generate`` arguments."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=100,
        n_positions=64,
        bos_token_id=None,  # GPT-2's 50256 is outside the tiny vocabulary
        eos_token_id=None,  # no end of sequence: max_new_tokens every time
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, {
        "input_ids": torch.randint(0, 100, (1, 6)),
        "attention_mask": torch.ones(1, 6, dtype=torch.int64),
        "do_sample": False,
        "max_new_tokens": 5,
        "pad_token_id": 0,
    }


class ShiftedAgent(Agent):
    """An ``Agent`` whose actor shifts its hidden state by 1 when accelerated (a
    ``Shift`` module inside ``actor``)."""

    def __init__(self) -> None:
        super().__init__()
        self.actor.insert(2, Shift())


def shifted_agent() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return ShiftedAgent(), (torch.randn(8, 4), torch.randint(0, 2, (8,)))


class MethodDiffers(Agent):
    """``get_value`` adds 1 in its own code (outside any module call) when accelerated."""

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        value = super().get_value(x)
        return value + 1 if fastmodule.is_accelerated(self) else value


def method_differs() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return MethodDiffers(), torch.randn(8, 4)
