"""The fault catalogue (SPEC section 3) as data: classes, families, variants, expected signature.

Torch-free on purpose: the signature engine and the service read it (family names, the metrics a
class is known to move, catalogue text for the triage page) without the ``[ml]`` extra. The
injectors that act on a run live next to the RL engine and are registered under these same names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Direction = Literal[1, -1, 0]  # +1 rises, -1 falls, 0 stays flat (or collapses to ~0)


@dataclass(frozen=True, slots=True)
class ExpectedEffect:
    metric: str  # verl name (the engine logs under verl's names, SPEC section 4)
    direction: Direction
    note: str = ""


@dataclass(frozen=True, slots=True)
class FaultClass:
    name: str
    family: str
    what: str
    signature: str  # as seen in public issues and write-ups
    variants: tuple[str, ...]
    effects: tuple[ExpectedEffect, ...] = field(default=())


#: Variants that are a wrong *setting* rather than a bug in code: a job reads its configuration once,
#: so these are there from step 0 and logged at their faulty value from step 0 (issue 14). Every
#: other variant is a code bug: it can appear at any step and leaves the logged configuration alone.
CONFIGURATION_VARIANTS: frozenset[tuple[str, str]] = frozenset({
    ("lr_misconfiguration", "lr_multiplier"),
    ("lr_misconfiguration", "no_warmup"),
    ("kl_misconfiguration", "zero_coef"),
})


def variant_kind(fault_class: str, variant: str) -> str:
    """``configuration`` or ``code`` (see :data:`CONFIGURATION_VARIANTS`)."""
    return "configuration" if (fault_class, variant) in CONFIGURATION_VARIANTS else "code"


def at_onset(fault_class: str, variant: str, params: dict, onset: int) -> dict:
    """``params`` with ``onset`` for a code bug; a configuration fault takes none (it is there from 0)."""
    if variant_kind(fault_class, variant) == "configuration":
        return {k: v for k, v in params.items() if k not in ("onset", "duration")}
    return {**params, "onset": onset}


FAMILIES: dict[str, str] = {
    "framework": "framework / model-state consistency",
    "numerical": "operator / numerical consistency",
    "routing": "expert-routing consistency",
    "optimisation": "optimisation / training stability",
    "reference": "reference (nothing injected)",
}

_E = ExpectedEffect

FAULT_CLASSES: dict[str, FaultClass] = {
    c.name: c
    for c in (
        FaultClass(
            "actor_update_omission",
            "framework",
            "optimizer step silently skipped (grad accumulation of 0, update_successful False, LR 0 at first step)",
            "reward improvement suppressed; ppo_kl ~ 0; grad_norm normal or 0; loss not decreasing",
            ("skip_step", "zero_grad", "nonfinite_grad_norm"),
            (
                _E("critic/score/mean", 0, "no improvement"),
                _E("actor/ppo_kl", 0, "exactly 0 when the step is skipped (skip_step, nonfinite_grad_norm)"),
                _E("actor/kl_loss", -1, "the policy stays at the reference"),
                _E("actor/grad_norm", 0, "normal (skip_step), 0 (zero_grad) or NaN (nonfinite_grad_norm)"),
            ),
        ),
        FaultClass(
            "stale_weight_sync",
            "framework",
            "rollout engine keeps old weights after updates",
            "rollout-training logp difference jumps and grows, importance ratios collapse, loss -> 0, "
            "grad_norm tiny, reward flat",
            ("skip_from_onset", "every_n", "partial"),
            (
                _E("training/rollout_probs_diff_mean", 1),
                _E("rollout_corr/kl", 1),
                _E("critic/score/mean", 0, "flat"),
            ),
        ),
        FaultClass(
            "rollout_logp_precision",
            "numerical",
            "rollout computes log-probs at lower precision (bf16/fp16) than the trainer",
            "shift in rollout-training logp discrepancy and rise in KL; clip fraction non-zero from step 0",
            ("bf16", "fp16"),
            (
                _E("training/rollout_probs_diff_mean", 1, "from the onset, flat (no drift)"),
                _E("rollout_corr/k3_kl", 1),
                _E(
                    "actor/pg_clipfrac", 0,
                    "unchanged with trainer-recomputed old log-probs (verl default); rises in bypass mode",
                ),
            ),
        ),
        FaultClass(
            "operator_numeric_noise",
            "numerical",
            "a kernel (attention, norm, softmax) is numerically wrong on one side",
            "logp discrepancy with heavy tail on low-probability tokens; slow drift, later grad-norm spikes",
            ("attention_seq_len", "softmax_low_prob_tail"),
            (_E("training/rollout_probs_diff_max", 1), _E("training/rollout_probs_diff_mean", 1)),
        ),
        FaultClass(
            "routing_mismatch",
            "routing",
            "rollout and training choose different top-k experts for the same token",
            "logp discrepancy and KL grow; extreme importance ratios; worse on MoE than dense",
            ("router_logit_noise", "tie_breaking"),
            (
                _E("training/rollout_probs_diff_mean", 1),
                _E("rollout_corr/kl", 1),
                _E("moe/routing_agreement", -1),
            ),
        ),
        FaultClass(
            "router_corruption",
            "routing",
            "router weights damaged or re-initialised",
            "expert-utilisation collapse/shift, entropy change, reward drop",
            ("downcast_bf16", "noise", "reinit_rows"),
            (
                _E("moe/expert_entropy", 1, "shifts at the onset: up for noise, down for reinit_rows (measured)"),
                _E("actor/kl_loss", 1, "the damaged policy is far from the (undamaged) reference"),
                _E("critic/score/mean", -1),
            ),
        ),
        FaultClass(
            "gradient_overflow",
            "optimisation",
            "fp16 overflow / inf in backward",
            "grad_norm inf/NaN, skipped steps, loss NaN, then reward collapse",
            ("loss_scale_no_handling", "inject_nonfinite"),
            (_E("actor/grad_norm", 1, "non-finite"), _E("critic/score/mean", -1)),
        ),
        FaultClass(
            "lr_misconfiguration",
            "optimisation",
            "learning rate orders of magnitude too high",
            "grad_norm spikes, KL explosion, entropy collapse, reward collapse",
            ("lr_multiplier", "no_warmup"),
            (
                _E("actor/lr", 1),
                _E("actor/ppo_kl", 1),
                _E("actor/kl_loss", 1),
                _E("actor/entropy", -1),
                _E("critic/score/mean", -1),
            ),
        ),
        FaultClass(
            "kl_misconfiguration",
            "optimisation",
            "KL coefficient/estimator wrong (e.g. 0, or unclamped exp in low_var_kl)",
            "KL grows without bound, response length drift",
            ("zero_coef", "sign_flip", "low_var_kl_unclamped"),
            (_E("actor/kl_loss", 1),),
        ),
        FaultClass(
            "reward_fault",
            "optimisation",
            "reward function broken or noisy",
            "reward variance changes, zero-variance groups, advantage collapse",
            ("component_zero", "truncated", "label_noise", "constant"),
            (
                _E("critic/score/mean", -1, "label_noise moves it toward 0.5 instead"),
                _E("critic/advantages/max", -1, "zero-variance groups: advantages collapse to 0 (constant)"),
            ),
        ),
        FaultClass(
            "healthy",
            "reference",
            "nothing injected",
            "reward rises, KL grows slowly, logp discrepancy flat and small",
            ("none",),
            (_E("critic/score/mean", 1), _E("training/rollout_probs_diff_mean", 0)),
        ),
    )
}

