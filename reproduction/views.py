"""One engine run, written as each framework's logger would write it (SPEC section 4).

The engine records verl's names plus, under :data:`ENGINE_PREFIX`,
what other frameworks log and verl does not (the total loss, per-side clip ratios, reward
components, group statistics). A view is a pure function of the whole trace (``[{"step": k,
"values": {...}}]``) that keeps only the names its framework really logs, with their meanings:

- ``verl``: verl's names (``compute_data_metrics``, the actor's and rollout-correction metrics),
  and the engine-only diagnostics :data:`ENGINE_ONLY` (``moe/*``), which no framework logs and
  which are kept because routing faults are about them. verl hands reward components
  (``reward_extra_info``) to its rollout dump, not to the step metrics, so this view has none.
- ``trl``: TRL 1.16's ``GRPOTrainer`` with a separate vLLM generation engine (what the engine
  models: a rollout copy of its own): ``loss`` is the whole loss, ``kl`` is absent when the
  configured beta is 0, ``rewards/<function>/{mean,std}`` per reward function, ``sampling/*`` in
  log space (its probability-space counterpart is verl's, not TRL's); steps counted from 1.
- ``openrlhf``: OpenRLHF's PPO trainer (``train/*``): policy loss, KL to the reference, vLLM KL,
  reward, lengths, clip ratio, LR, grad norm.
- ``raw``: everything the engine recorded.

Pure Python: imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from moeproxy.reproduction.errors import UnknownView

#: Prefix of what the engine records beside verl's names so that other frameworks' views can be
#: written from the same run: the total loss, per-side clip ratios, reward components, group
#: statistics, terminated lengths. The verl view drops it. Here, not in :mod:`.metrics`, so that
#: readers of traces (the signature library) can project a view without importing torch.
ENGINE_PREFIX = "engine/"

Trace = list[dict[str, Any]]
E = ENGINE_PREFIX

#: Diagnostics of the engine that no framework logs; kept in the verl view, marked as such.
ENGINE_ONLY: tuple[str, ...] = ("moe/",)

#: TRL's reward-function names for the components of :mod:`moeproxy.reproduction.formats`.
TRL_REWARD_FUNCTIONS: dict[str, str] = {"accuracy": "accuracy_reward", "format": "format_reward"}


def _verl(values: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if not k.startswith(E)}


# TRL name -> engine name, for the metrics that are a plain rename.
_TRL_RENAMES: dict[str, str] = {
    "loss": f"{E}total_loss",
    "grad_norm": "actor/grad_norm",
    "learning_rate": "actor/lr",
    "completions/mean_length": "response_length/mean",
    "completions/min_length": "response_length/min",
    "completions/max_length": "response_length/max",
    "completions/clipped_ratio": "response_length/clip_ratio",
    "completions/mean_terminated_length": f"{E}terminated_length/mean",
    "completions/min_terminated_length": f"{E}terminated_length/min",
    "completions/max_terminated_length": f"{E}terminated_length/max",
    "reward": "critic/score/mean",
    "reward_std": f"{E}reward_std",
    "frac_reward_zero_std": f"{E}frac_reward_zero_std",
    "entropy": "actor/entropy",
    "clip_ratio/low_mean": f"{E}clip_ratio/low",
    "clip_ratio/low_min": f"{E}clip_ratio/low",  # one process: the min over processes is the mean
    "clip_ratio/high_mean": f"{E}clip_ratio/high",
    "clip_ratio/high_max": f"{E}clip_ratio/high",
    "sampling/sampling_logp_difference/mean": f"{E}logp_abs_diff/mean",
    "sampling/sampling_logp_difference/max": f"{E}logp_abs_diff/max",
    "sampling/importance_sampling_ratio/min": "rollout_corr/rollout_is_min",
    "sampling/importance_sampling_ratio/mean": "rollout_corr/rollout_is_mean",
    "sampling/importance_sampling_ratio/max": "rollout_corr/rollout_is_max",
    "step_time": "timing_s/step",
}


def _trl(values: Mapping[str, float]) -> dict[str, float]:
    out = {name: values[src] for name, src in _TRL_RENAMES.items() if src in values}
    if f"{E}clip_ratio/low" in values:
        out["clip_ratio/region_mean"] = values[f"{E}clip_ratio/low"] + values[f"{E}clip_ratio/high"]
    # TRL computes kl only when beta != 0 (SPEC section 4: "no kl when beta is 0").
    if values.get("actor/kl_coef", 0.0) != 0.0 and f"{E}kl_mean" in values:
        out["kl"] = values[f"{E}kl_mean"]
    for component, function in TRL_REWARD_FUNCTIONS.items():
        for stat in ("mean", "std"):
            src = f"{E}reward/{component}/{stat}"
            if src in values:
                out[f"rewards/{function}/{stat}"] = values[src]
    return out


_OPENRLHF_RENAMES: dict[str, str] = {
    "train/policy_loss": f"{E}pg_loss_mean",
    "train/kl": f"{E}kl_mean",
    "train/ppo_kl": "actor/ppo_kl",
    "train/vllm_kl": "rollout_corr/kl",
    "train/reward": "critic/score/mean",
    "train/response_length": "response_length/mean",
    "train/ppo_clip_ratio": "actor/pg_clipfrac",
    "train/entropy_loss": "actor/entropy",
    "train/actor_lr": "actor/lr",
    "train/actor_grad_norm": "actor/grad_norm",
}


def _openrlhf(values: Mapping[str, float]) -> dict[str, float]:
    return {name: values[src] for name, src in _OPENRLHF_RENAMES.items() if src in values}


def _raw(values: Mapping[str, float]) -> dict[str, float]:
    return dict(values)


#: Registry: view name -> (per-record projection, offset added to the step number).
VIEWS: dict[str, tuple[Callable[[Mapping[str, float]], dict[str, float]], int]] = {
    "verl": (_verl, 0),
    "trl": (_trl, 1),  # TRL counts optimizer steps from 1 (trainer.state.log_history)
    "openrlhf": (_openrlhf, 0),
    "raw": (_raw, 0),
}

#: Every name each framework view can contain (tests check views against these).
VIEW_NAMES: dict[str, frozenset[str]] = {
    "trl": frozenset(_TRL_RENAMES) | {"clip_ratio/region_mean", "kl"}
    | {f"rewards/{f}/{s}" for f in TRL_REWARD_FUNCTIONS.values() for s in ("mean", "std")},
    "openrlhf": frozenset(_OPENRLHF_RENAMES),
}


def project(trace: Trace, view: str) -> Trace:
    """``trace`` as framework ``view`` would log it (step numbers shifted where the framework's are)."""
    if view not in VIEWS:
        raise UnknownView(f"unknown view {view!r}; known: {sorted(VIEWS)}")
    fn, offset = VIEWS[view]
    return [{"step": int(r["step"]) + offset, "values": fn(r["values"])} for r in trace]
