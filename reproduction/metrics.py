"""Per-step metrics under verl's names (SPEC section 4), computed from what the run produced.

Definitions read from verl (commit b178a3c):

- ``critic/*``, ``response_length/*``: ``compute_data_metrics`` — sequence score = sum of token
  scores (here the outcome reward), response length = tokens up to and including eos,
  ``clip_ratio`` = share of responses that hit the length limit.
- ``training/rollout_probs_diff_*``, ``training/rollout_actor_probs_pearson_corr``:
  ``calculate_debug_metrics`` — |exp(old_log_prob) − exp(rollout_log_prob)| over response tokens,
  in probability space; old_log_prob is the trainer's recompute before the update.
- ``rollout_corr/*``: ``compute_offpolicy_metrics`` — ``kl`` = mean(rollout − old), ``k3_kl`` =
  mean(exp(old − rollout) − (old − rollout) − 1), per-sequence log-perplexity differences, token
  χ².  ``rollout_corr/rollout_is_*`` are the token importance weights π_train/π_rollout
  (log-ratio clamped at verl's SAFETY_BOUND, not truncated: the engine does not apply them).
- ``moe/routing_agreement``: mean over MoE layers and response-predicting positions of
  |top-k(rollout) ∩ top-k(trainer)| / k.  ``moe/expert_entropy``: per-layer entropy of the
  trainer's expert-selection counts over those positions, divided by log E so that an original
  and a proxy with fewer experts are on one 0–1 scale; ``moe/expert_entropy/layer_N`` per layer.
"""

from __future__ import annotations

import math

import torch
from moeproxy.reproduction.algos import SAFETY_BOUND, masked_mean, masked_sum
from moeproxy.reproduction.views import ENGINE_PREFIX

#: Names every step record carries (tests check them against SPEC section 4 / verl).
STEP_METRICS: tuple[str, ...] = (
    "critic/score/mean", "critic/score/max", "critic/score/min",
    "critic/rewards/mean", "critic/rewards/max", "critic/rewards/min",
    "critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
    "response_length/mean", "response_length/max", "response_length/min", "response_length/clip_ratio",
    "actor/pg_loss", "actor/kl_loss", "actor/kl_coef", "actor/ppo_kl", "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower", "actor/entropy", "actor/grad_norm", "actor/lr",
    "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
    "rollout_corr/kl", "rollout_corr/k3_kl", "rollout_corr/training_log_ppl", "rollout_corr/rollout_log_ppl",
    "rollout_corr/log_ppl_diff", "rollout_corr/log_ppl_abs_diff", "rollout_corr/chi2_token",
    "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max", "rollout_corr/rollout_is_min",
    "moe/routing_agreement", "moe/expert_entropy",
    "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/sync", "timing_s/step",
    "perf/peak_memory_mb",
)


#: Measured, not computed: left out when two traces are compared for determinism.
NONDETERMINISTIC_PREFIXES: tuple[str, ...] = ("timing_s/", "perf/")


def _item(t: torch.Tensor) -> float:
    return float(t.detach().float().item())


def data_metrics(scores: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor, max_len: int):
    lengths = response_mask.sum(dim=-1).float()
    return {
        "critic/score/mean": _item(scores.mean()),
        "critic/score/max": _item(scores.max()),
        "critic/score/min": _item(scores.min()),
        # no token-level reward shaping (use_kl_in_reward=False, verl's GRPO default): rewards = scores
        "critic/rewards/mean": _item(scores.mean()),
        "critic/rewards/max": _item(scores.max()),
        "critic/rewards/min": _item(scores.min()),
        "critic/advantages/mean": _item(advantages.mean()),
        "critic/advantages/max": _item(advantages.max()),
        "critic/advantages/min": _item(advantages.min()),
        "response_length/mean": _item(lengths.mean()),
        "response_length/max": _item(lengths.max()),
        "response_length/min": _item(lengths.min()),
        "response_length/clip_ratio": _item((lengths == max_len).float().mean()),
    }


def reward_metrics(components: list[dict[str, float]], scores: torch.Tensor, group_size: int,
                   response_mask: torch.Tensor, terminated: torch.Tensor) -> dict[str, float]:
    """What the frameworks derive from the per-sample rewards beyond verl's ``critic/score/*``:
    each component's mean and std (TRL's ``rewards/<function>/{mean,std}``), the mean per-group
    std of the total (TRL's ``reward_std``), the share of groups whose total has zero std (TRL's
    ``frac_reward_zero_std``), and the lengths of responses that ended with the end marker
    (TRL's ``completions/*_terminated_length``; 0 when none did, as TRL writes it)."""
    names = list(components[0]) if components else []
    out: dict[str, float] = {}
    for name in names:
        values = torch.tensor([c[name] for c in components], dtype=torch.float32)
        out[f"{ENGINE_PREFIX}reward/{name}/mean"] = _item(values.mean())
        out[f"{ENGINE_PREFIX}reward/{name}/std"] = _item(values.std()) if values.numel() > 1 else 0.0
    totals = scores.reshape(-1, group_size)  # the per-sample totals the advantages were computed from
    group_std = totals.std(dim=1) if group_size > 1 else torch.zeros(totals.shape[0])
    out[f"{ENGINE_PREFIX}reward_std"] = _item(group_std.mean())
    out[f"{ENGINE_PREFIX}frac_reward_zero_std"] = _item((group_std.abs() < 1e-8).float().mean())
    ended = response_mask.sum(dim=-1).float()[terminated.bool()]  # terminated: the response holds eos
    for stat, fn in (("mean", torch.mean), ("min", torch.min), ("max", torch.max)):
        out[f"{ENGINE_PREFIX}terminated_length/{stat}"] = _item(fn(ended)) if ended.numel() else 0.0
    return out


def rollout_train_metrics(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    m = mask.bool()
    p_train, p_roll = old_logp.exp(), rollout_logp.exp()
    diff = (p_train - p_roll).abs()[m]
    out = {
        "training/rollout_probs_diff_mean": _item(diff.mean()),
        "training/rollout_probs_diff_max": _item(diff.max()),
        "training/rollout_probs_diff_std": _item(diff.std()) if diff.numel() > 1 else 0.0,
    }
    pair = torch.stack([p_train[m], p_roll[m]])
    corr = torch.corrcoef(pair)[0, 1] if diff.numel() > 1 else torch.tensor(float("nan"))
    out["training/rollout_actor_probs_pearson_corr"] = _item(corr)
    fmask = mask.float()
    out["rollout_corr/kl"] = _item(masked_mean(rollout_logp - old_logp, fmask))
    log_ratio = old_logp - rollout_logp
    out["rollout_corr/k3_kl"] = _item(masked_mean(torch.exp(log_ratio) - log_ratio - 1, fmask))
    seq_train = masked_mean(old_logp, fmask, dim=-1)
    seq_roll = masked_mean(rollout_logp, fmask, dim=-1)
    out["rollout_corr/training_log_ppl"] = _item((-seq_train).mean())
    out["rollout_corr/rollout_log_ppl"] = _item((-seq_roll).mean())
    ppl_diff = seq_roll - seq_train
    out["rollout_corr/log_ppl_diff"] = _item(ppl_diff.mean())
    out["rollout_corr/log_ppl_abs_diff"] = _item(ppl_diff.abs().mean())
    # token-level |log p_train - log p_rollout| (TRL's sampling/sampling_logp_difference/*)
    abs_diff = log_ratio.abs()[m]
    out[f"{ENGINE_PREFIX}logp_abs_diff/mean"] = _item(abs_diff.mean()) if abs_diff.numel() else 0.0
    out[f"{ENGINE_PREFIX}logp_abs_diff/max"] = _item(abs_diff.max()) if abs_diff.numel() else 0.0
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    out["rollout_corr/chi2_token"] = _item(masked_mean(rho.square(), fmask) - 1.0)
    out["rollout_corr/rollout_is_mean"] = _item(masked_mean(rho, fmask))
    out["rollout_corr/rollout_is_max"] = _item(rho[m].max())
    out["rollout_corr/rollout_is_min"] = _item(rho[m].min())
    return out


def _positions(routing: torch.Tensor, prompt_len: int, resp_len: int) -> torch.Tensor:
    """Routing at the positions whose outputs predicted response tokens: P-1 … P+R-2."""
    return routing[:, :, prompt_len - 1 : prompt_len + resp_len - 1]


def routing_metrics(
    rollout_routing: torch.Tensor | None,
    trainer_routing: torch.Tensor | None,
    response_mask: torch.Tensor,
    prompt_len: int,
    num_experts: int,
    moe_layers: list[int],
) -> dict[str, float]:
    out: dict[str, float] = {}
    if trainer_routing is None:
        return out
    resp_len = response_mask.shape[1]
    tr = _positions(trainer_routing, prompt_len, resp_len).long()  # [L, B, R, k]
    m = response_mask.bool()  # [B, R]
    onehot_t = torch.zeros(*tr.shape[:-1], num_experts, dtype=torch.bool)
    onehot_t.scatter_(-1, tr.cpu(), True)
    n_tok = m.sum().item()
    ent = []
    for li, layer in enumerate(moe_layers):
        counts = onehot_t[li][m.cpu()].sum(dim=0).double()
        p = counts / counts.sum().clamp_min(1)
        h = -(p[p > 0] * p[p > 0].log()).sum().item()
        value = h / math.log(num_experts) if num_experts > 1 else 0.0
        out[f"moe/expert_entropy/layer_{layer}"] = value
        ent.append(value)
    out["moe/expert_entropy"] = float(sum(ent) / len(ent))
    if rollout_routing is not None and n_tok:
        ro = _positions(rollout_routing, prompt_len, resp_len).long()
        onehot_r = torch.zeros_like(onehot_t)
        onehot_r.scatter_(-1, ro.cpu(), True)
        k = tr.shape[-1]
        inter = (onehot_t & onehot_r).sum(dim=-1).float() / k  # [L, B, R]
        out["moe/routing_agreement"] = _item(masked_sum(inter, m.cpu()[None].expand_as(inter)) / (n_tok * len(moe_layers)))
    return out
