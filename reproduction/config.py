"""The GRPO engine's configuration: one frozen dataclass, validated at construction.

Defaults follow verl's GRPO recipe where a CPU allows it (clip 0.2, dual-clip c = 3, grad clip 1.0,
``low_var_kl`` KL loss, token-mean aggregation, AdamW with weight decay 0.01, several mini-batch
updates per rollout batch: verl's ``train_batch_size / ppo_mini_batch_size`` is 4 in its examples,
here 16 prompts / 4 per mini-batch), scaled down in batch size and sequence length so a 100-step run
of a reference model takes minutes.  A short warm-up is on by default so that the ``no_warmup``
variant of ``lr_misconfiguration`` has something to remove.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moeproxy.reproduction.algos import KL_ESTIMATORS, LOSS_AGG_MODES
from moeproxy.reproduction.device import DTYPES
from moeproxy.reproduction.errors import InvalidEngineConfig

LR_SCHEDULES = ("constant", "cosine", "linear")  # linear decay to 0: TRL's (transformers') default
OLD_LOGPROB_SOURCES = ("trainer", "rollout")


@dataclass(frozen=True)
class EngineConfig:
    # rollout
    prompts_per_step: int = 16
    group_size: int = 4  # verl actor_rollout_ref.rollout.n
    max_new_tokens: int | None = None  # None: the model's response format decides (formats.py)
    temperature: float = 1.0
    rollout_dtype: str = "float32"
    # trainer
    trainer_dtype: str = "float32"
    ppo_mini_batch_size: int = 4  # in prompts, as verl (multiplied by group_size)
    ppo_epochs: int = 1
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.01
    kl_loss_type: str = "low_var_kl"
    norm_adv_by_std_in_grpo: bool = True
    # "trainer": old log-probs recomputed by the trainer before the update (verl's default);
    # "rollout": the rollout engine's log-probs are the behaviour policy (verl's bypass mode).
    old_logprob_source: str = "trainer"
    skip_nonfinite_grad: bool = True  # verl skips the optimizer step when grad_norm is not finite
    # optimizer
    lr: float = 2e-5
    lr_warmup_steps: int = 5
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.0
    total_steps_hint: int = 100  # cosine horizon
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    # data
    tasks: tuple[str, ...] | None = None
    prompt_split: str = "train"
    # execution
    experts_implementation: str | None = "grouped_mm"  # transformers 5 kernel; None = the checkpoint default (eager loop)
    threads: int = 1

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidEngineConfig(msg)

        if self.prompts_per_step < 1 or self.group_size < 1:
            bad("prompts_per_step and group_size must be >= 1")
        if self.ppo_mini_batch_size < 1 or self.prompts_per_step % self.ppo_mini_batch_size:
            bad(
                f"ppo_mini_batch_size={self.ppo_mini_batch_size} must divide prompts_per_step="
                f"{self.prompts_per_step} (both counted in prompts, as in verl)"
            )
        if self.ppo_epochs < 1:
            bad("ppo_epochs must be >= 1")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            bad("max_new_tokens must be >= 1 (or unset: the model's response format decides)")
        if not self.temperature > 0:
            bad("temperature must be > 0")
        for name in ("rollout_dtype", "trainer_dtype"):
            if str(getattr(self, name)).lower() not in DTYPES:
                bad(f"{name}={getattr(self, name)!r}; use one of {sorted(set(DTYPES))}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            bad(f"loss_agg_mode={self.loss_agg_mode!r}; known: {sorted(LOSS_AGG_MODES)}")
        if self.kl_loss_type not in KL_ESTIMATORS:
            bad(f"kl_loss_type={self.kl_loss_type!r}; known: {sorted(KL_ESTIMATORS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            bad(f"lr_schedule={self.lr_schedule!r}; known: {LR_SCHEDULES}")
        if self.old_logprob_source not in OLD_LOGPROB_SOURCES:
            bad(f"old_logprob_source={self.old_logprob_source!r}; known: {OLD_LOGPROB_SOURCES}")
        if self.lr < 0 or self.lr_warmup_steps < 0 or self.grad_clip <= 0:
            bad("lr and lr_warmup_steps must be >= 0 and grad_clip > 0")
        if not 0 <= self.clip_ratio_low < 1 or self.clip_ratio_high < 0 or self.clip_ratio_c <= 1:
            bad("need 0 <= clip_ratio_low < 1, clip_ratio_high >= 0 and clip_ratio_c > 1 (verl's dual-clip)")
        if self.tasks is not None:
            from moeproxy.reproduction.tasks import TASKS

            unknown = [t for t in self.tasks if t not in TASKS]
            if unknown or not self.tasks:
                bad(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def mini_batches_per_step(self) -> int:
        return self.prompts_per_step // self.ppo_mini_batch_size

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["tasks"] = None if self.tasks is None else list(self.tasks)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidEngineConfig(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        data = dict(data)
        if data.get("betas") is not None:
            data["betas"] = tuple(data["betas"])
        if data.get("tasks") is not None:
            data["tasks"] = tuple(data["tasks"])
        return cls(**data)

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def with_strings(self, raw: dict[str, str]) -> EngineConfig:
        """Apply ``key=value`` strings (command lines), typed by the field they set."""
        fields = {f.name for f in dataclasses.fields(self)}
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in fields:
                raise InvalidEngineConfig(f"unknown engine option {key!r}; known: {', '.join(sorted(fields))}")
            current = getattr(self, key)
            try:
                if key == "tasks":
                    out[key] = tuple(v for v in value.split(",") if v) or None
                elif key == "betas":
                    out[key] = tuple(float(v) for v in value.split(","))
                elif key == "experts_implementation":
                    out[key] = value or None
                elif key == "max_new_tokens":
                    out[key] = int(value) if value else None
                elif isinstance(current, bool):
                    out[key] = value.lower() in ("1", "true", "yes", "on")
                elif isinstance(current, int):
                    out[key] = int(value)
                elif isinstance(current, float):
                    out[key] = float(value)
                else:
                    out[key] = value
            except ValueError:
                raise InvalidEngineConfig(f"engine option {key}={value!r}: expected {type(current).__name__}") from None
        return self.replace(**out)


def lr_at(config: EngineConfig, step: int) -> float:
    """The learning rate of RL step ``step`` (0-based), as verl's and transformers' schedulers: linear
    warm-up from 0, then constant, cosine or linear down to ``min_lr_ratio`` of the peak."""
    import math

    warm = config.lr_warmup_steps
    if step < warm:
        return config.lr * (step + 1) / (warm + 1)  # never exactly 0 at step 0 (that is a fault of its own)
    if config.lr_schedule == "constant":
        return config.lr
    horizon = max(1, config.total_steps_hint - warm)
    progress = min(1.0, (step - warm) / horizon)
    if config.lr_schedule == "linear":
        return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * (1 - progress))
    cos = 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cos)
