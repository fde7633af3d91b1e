"""The injection points the engine exposes, and the no-op injector that a healthy run uses.

A fault injector overrides some of these methods; the engine calls every one of them at the
place the corresponding production fault lives (SPEC section 3).  None of them sees or returns a
metric: metrics are computed by :mod:`moeproxy.reproduction.metrics` from what the run did.

Before the run, ``configure`` turns the engine configuration into the one a misconfigured job
would have (configuration faults live there, and are logged at their faulty value from step 0).

Order inside one RL step (0-based ``step``)::

    on_step_start -> rollout (router_logits[rollout], rollout_logits_dtype, rollout_log_probs)
    -> reward -> trainer old/ref log-probs -> advantages
    -> per mini-batch: trainer forward (router_logits[trainer], trainer_log_probs) -> kl -> loss
       -> backward -> gradients -> clip -> skip_nonfinite / optimizer_step
    -> weight_sync
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.policy import Policy


@dataclass
class FaultContext:
    """State the engine shares with an injector: its own random stream and the rollout's position."""

    generator: torch.Generator  # the injector's own stream: injected noise never shifts the sampler's
    seq_len: int = 0  # total length (prompt + generated) of the forward pass now running on the rollout
    step: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncPlan:
    """What the trainer → rollout weight transfer of one step does."""

    enabled: bool = True
    include: Callable[[str], bool] | None = None  # None = every tensor
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None  # applied in transit


class Injector:
    """No fault: every hook leaves the run as it is."""

    fault_class = "healthy"
    variant = "none"

    def __init__(self, params: dict[str, Any] | None = None):
        self.params = dict(params or {})
        self.ctx: FaultContext | None = None

    # -- configuration (before the engine is built)
    def configure(self, config: EngineConfig) -> EngineConfig:
        """The configuration the faulty job runs with (a configuration fault changes it here)."""
        return config

    # -- lifetime
    def bind(self, ctx: FaultContext, trainer: Policy, rollout: Policy) -> None:
        """Called once before step 0; module hooks on a copy are installed here."""
        self.ctx = ctx

    def active(self, step: int) -> bool:
        onset = int(self.params.get("onset", 0))
        duration = self.params.get("duration")
        if step < onset:
            return False
        return duration is None or step < onset + int(duration)

    def on_step_start(self, step: int, trainer: Policy, rollout: Policy) -> None:
        return None

    # -- rollout engine
    def router_logits(self, step: int, side: str, layer: int, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def rollout_logits_dtype(self, step: int) -> torch.dtype | None:
        return None

    def rollout_log_probs(self, step: int, logp: torch.Tensor) -> torch.Tensor:
        return logp

    # -- reward
    def reward(self, step: int, examples: Sequence, completions: Sequence[str],
               components: list[dict[str, float]]) -> list[dict[str, float]]:
        """Per sample, the reward components (``accuracy``, ``format``…) the reward function returns."""
        return components

    # -- trainer
    def trainer_log_probs(self, step: int, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return logp

    def kl(self, step: int, coef: float, estimator: Callable) -> tuple[float, Callable]:
        return coef, estimator

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def gradients(self, step: int, policy: Policy) -> None:
        return None

    def skip_nonfinite(self, step: int, default: bool) -> bool:
        return default

    def optimizer_step(self, step: int) -> bool:
        return True

    # -- weight sync
    def weight_sync(self, step: int, plan: SyncPlan) -> SyncPlan:
        return plan
