"""GRPO/PPO algorithm pieces as pure tensor functions, following verl's definitions.

Read from verl (``verl/trainer/ppo/core_algos.py``, ``verl/utils/debug/metrics.py``,
``verl/trainer/ppo/rollout_corr_helper.py`` at commit b178a3c): GRPO outcome advantages with a
per-group mean/std (``epsilon=1e-6``, a group of one gets mean 0 and std 1); the vanilla clipped
policy loss with dual-clip (``clip_ratio_c``), the log-ratio clamped to ±20 before ``exp``;
``agg_loss`` modes; KL estimators where ``low_var_kl``/``k3`` clamp the log-ratio to ±20 and the
estimate to ±10.  Estimators and aggregation modes are registries, as in verl.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from moeproxy.reproduction.errors import InvalidEngineConfig

#: verl clamps the log-ratio inside low_var_kl and the policy loss to this range.
LOG_RATIO_CLAMP = 20.0
#: ... and the low_var_kl estimate itself to ±10.
LOW_VAR_KL_CLAMP = 10.0
#: verl's SAFETY_BOUND for exp() in the rollout-correction metrics.
SAFETY_BOUND = 20.0


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    # where() instead of x * mask: a NaN on a padded position must not leak (verl multiplies, but
    # its padded positions hold finite values; ours may hold an injected NaN on purpose).
    masked = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return masked_sum(x, mask) / mask.sum().clamp_min(1e-8)
    return masked_sum(x, mask, dim) / mask.sum(dim=dim).clamp_min(1e-8)


# --- advantages ----------------------------------------------------------------------------------------

def grpo_advantages(
    scores: torch.Tensor, group_size: int, *, epsilon: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Per-sample GRPO advantage for ``scores`` laid out group after group (``[g0 s0, g0 s1, …]``).

    Same numbers as verl's ``compute_grpo_outcome_advantage``: unbiased std (torch.std), and a
    group of one gets advantage = score (mean 0, std 1)."""
    if scores.numel() % group_size:
        raise InvalidEngineConfig(f"{scores.numel()} scores do not split into groups of {group_size}")
    g = scores.reshape(-1, group_size)
    if group_size == 1:
        mean, std = torch.zeros_like(g), torch.ones_like(g)
    else:
        mean = g.mean(dim=1, keepdim=True)
        std = g.std(dim=1, keepdim=True)
    adv = (g - mean) / (std + epsilon) if norm_by_std else g - mean
    return adv.reshape(-1)


# --- loss aggregation ----------------------------------------------------------------------------------

def _token_mean(loss_mat, mask):
    return masked_sum(loss_mat, mask) / mask.sum().clamp_min(1)


def _seq_mean_token_sum(loss_mat, mask):
    seq = masked_sum(loss_mat, mask, dim=-1)
    seq_mask = (mask.sum(dim=-1) > 0).to(loss_mat.dtype)
    return masked_sum(seq, seq_mask) / seq_mask.sum().clamp_min(1)


def _seq_mean_token_mean(loss_mat, mask):
    n = mask.sum(dim=-1)
    seq = masked_sum(loss_mat, mask, dim=-1) / (n + 1e-8)
    seq_mask = (n > 0).to(loss_mat.dtype)
    return masked_sum(seq, seq_mask) / seq_mask.sum().clamp_min(1)


def _seq_mean_token_sum_norm(loss_mat, mask):
    return masked_sum(loss_mat, mask) / mask.shape[-1]


LOSS_AGG_MODES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    try:
        return LOSS_AGG_MODES[mode](loss_mat, mask)
    except KeyError:
        raise InvalidEngineConfig(f"unknown loss_agg_mode {mode!r}; known: {sorted(LOSS_AGG_MODES)}") from None


# --- KL estimators -------------------------------------------------------------------------------------

def _k1(logp, ref):
    return logp - ref


def _abs(logp, ref):
    return (logp - ref).abs()


def _k2(logp, ref):
    return 0.5 * (logp - ref).square()


def _low_var_kl(logp, ref):
    kl = torch.clamp(ref - logp, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-LOW_VAR_KL_CLAMP, max=LOW_VAR_KL_CLAMP)


def low_var_kl_unclamped(logp, ref):
    """Schulman's k3 with neither of verl's clamps: exp() may overflow (the kl_misconfiguration fault)."""
    kl = ref - logp
    return torch.exp(kl) - kl - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": _k1,
    "k1": _k1,
    "abs": _abs,
    "mse": _k2,
    "k2": _k2,
    # verl treats k3 and low_var_kl as one estimator, clamped.
    "k3": _low_var_kl,
    "low_var_kl": _low_var_kl,
}


def kl_estimator(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        raise InvalidEngineConfig(f"unknown KL estimator {name!r}; known: {sorted(KL_ESTIMATORS)}") from None


# --- policy loss ---------------------------------------------------------------------------------------

def vanilla_policy_loss(
    old_logp: torch.Tensor,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """verl's ``compute_policy_loss_vanilla``: clipped surrogate with dual-clip for A < 0.

    Returns the aggregated loss and the detached metrics ``pg_clipfrac``, ``ppo_kl``,
    ``pg_clipfrac_lower`` (verl's) and ``clip_ratio/low``, ``clip_ratio/high`` (TRL's)."""
    neg_kl = torch.clamp(logp - old_logp, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(neg_kl)
    ppo_kl = masked_mean(-neg_kl, mask)
    adv = advantages if advantages.dim() == logp.dim() else advantages.unsqueeze(-1)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip1 = torch.maximum(losses1, losses2)
    clipfrac = masked_mean(torch.gt(losses2, losses1).float(), mask)
    losses3 = -adv * clip_ratio_c
    clip2 = torch.minimum(losses3, clip1)
    clipfrac_lower = masked_mean((torch.gt(clip1, losses3) & (adv < 0)).float(), mask)
    pg_losses = torch.where(adv < 0, clip2, clip1)
    loss = agg_loss(pg_losses, mask, agg_mode)
    # TRL's GRPOTrainer counts clipping per side: a token is low-clipped when its ratio fell below
    # 1 - eps with a negative advantage, high-clipped when it rose above 1 + eps with a positive one.
    low = masked_mean(((ratio < 1 - clip_low) & (adv < 0)).float(), mask)
    high = masked_mean(((ratio > 1 + clip_high) & (adv > 0)).float(), mask)
    metrics = {
        "pg_clipfrac": clipfrac.detach(),
        "ppo_kl": ppo_kl.detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
        "clip_ratio/low": low.detach(),
        "clip_ratio/high": high.detach(),
    }
    return loss, metrics

