"""Whole-run evidence: what a run shows on its own, without a clean stretch before a fault.

A configuration fault (an LR ×100, a KL coefficient of 0) is there from step 0, so a run has no
"before" to compare with and the change-point view of :mod:`.features` sees nothing. These rules
read the whole run instead: levels of scale-free metrics against documented healthy ranges, and
the run's trends against what a healthy RL run does (reward rises, entropy falls slowly, KL grows
slowly). Each rule cites where its range comes from (:data:`SOURCES`, listed in
docs/signatures.md); each finding says which fault classes it supports.

A setting (the learning rate) is evidence only as a *level from step 0* against the ranges the
cited recipes use, never by moving: warm-up and decay are schedules, and a schedule is normal.

Pure: numpy over a :class:`~moeproxy.signatures.canonical.CanonicalRun`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from moeproxy.signatures.canonical import CanonicalRun, CanonicalSeries
from moeproxy.signatures.features import noise_scale

#: Where each range comes from (docs/signatures.md, "Whole-run evidence").
SOURCES: dict[str, str] = {
    "verl-faq": "verl FAQ, 'Missmatch between inference and training sequence': training/rollout_probs_diff_mean "
                "is normally below 0.005; above 0.01 indicates a precision issue of the inference engine "
                "(https://github.com/volcengine/verl/blob/main/docs/faq/faq.rst)",
    "ratio-definition": "the importance ratio pi_train/pi_rollout is exactly 1 when rollout and trainer hold the same "
                        "policy (the definition; verl's rollout correction and TRL's importance sampling both log it)",
    "no-gradient": "a gradient norm of exactly 0 means the optimizer step changed nothing (the definition)",
    "nonfinite": "SPEC section 3, gradient_overflow: NaN/inf in the loss or the gradient norm",
    "skip-nonfinite": "verl's actor skips the optimizer step when the gradient norm is not finite "
                      "(verl/workers/actor/dp_actor.py, DataParallelPPOActor._optimizer_step: 'if grad_norm is not "
                      "finite, skip the update'); the weights keep their last finite values",
    "kl-clamp": "verl clamps its low_var_kl estimate (exp of the log-ratio) to [-10, 10] because unclamped it "
                "overflows to NaN (verl PR 1779, 'Stabilize loss calculations by clamping KL divergence values'; "
                "issue 891, 'KL compute in low_var_kl (Cause KL NaN ...)')",
    "rl-lr": "RL learning rates of the public recipes: TRL GRPOConfig learning_rate default 1e-6; verl's GRPO and "
             "PPO examples use actor_rollout_ref.actor.optim.lr=1e-6 (LLM scale; an LR 100x above is the "
             "reported misconfiguration of SPEC section 3)",
    "lora-lr": "LoRA trains at learning rates 10x to 128x those of full fine-tuning, more for larger models "
               "(Thinking Machines, 'LoRA Without Regret', 2025, and tinker_cookbook.hyperparam_utils."
               "get_lora_lr_over_full_finetune_lr: 32 for Llama-3.2-1B, 128 for Llama-3.1-70B); the rl-lr "
               "range scaled by 128",
    "kl-penalty": "the KL term penalises the policy's distance from its reference: TRL's GRPO loss adds beta * KL "
                  "(GRPOConfig.beta, 'KL coefficient'), verl adds kl_loss_coef * KL to the actor loss "
                  "(or subtracts kl_coef * KL from the reward), OpenRLHF init_kl_coef; a coefficient below 0 "
                  "rewards moving away from the reference (SPEC section 3, kl_misconfiguration: a sign flip)",
    "kl-recipes": "KL coefficients of the public recipes: 0.04 in DeepSeekMath's GRPO (beta) and TRL's GRPOConfig "
                  "before its default became 0; verl's GRPO examples actor_rollout_ref.actor.kl_loss_coef=0.001; "
                  "OpenRLHF's example scripts --init_kl_coef 1e-3; ReaLHF's PPO quickstart ppo.kl_ctl=0.1",
    "healthy-dynamics": "SPEC section 3, healthy: reward rising, entropy falling, KL to the reference growing slowly",
    "config-lr": "a trainer's schedule takes the LR from 0 to the learning rate its config states over the warm-up, "
                 "then decays it (transformers.get_scheduler: get_linear_schedule_with_warmup, "
                 "get_cosine_schedule_with_warmup; verl's and OpenRLHF's warm-up likewise): a logged LR that "
                 "never reaches a tenth of that value trained the policy at a fraction of what was set; SPEC "
                 "section 3 names an LR of 0 at the first step an actor update omission",
    "weights-outside-optimizer": "SPEC section 3, router_corruption: 'router weights damaged or re-initialised'; "
                                 "the KL to the reference sums every update since the start (healthy: 'KL grows "
                                 "slowly'), so a ×30 step in it that no LR change, no gradient spike and no "
                                 "non-finite value explains is the weights changing outside the optimizer",
    "switch-balance": "the MoE load-balancing loss N * sum_i f_i * P_i (Switch Transformer, Fedus et al., "
                      "arXiv:2101.03961, eq. 4-6; transformers' load_balancing_loss_func, which TRL's GRPOTrainer "
                      "logs as aux_loss) is least when the router spreads tokens evenly over the experts and grows "
                      "as it concentrates them: a rise is the expert-utilisation shift of SPEC section 3's "
                      "router_corruption; the margin (4 noise widths and 0.5% of its level) is chosen",
    "grpo-advantage": "GRPO's advantage is the reward minus its group's mean (DeepSeekMath, arXiv:2402.03300, "
                      "section 4.1): a group whose rewards all tie has advantage 0 and no gradient; TRL logs the "
                      "share of such groups as frac_reward_zero_std",
    "kl-definition": "KL(pi || pi_ref) is 0 exactly when the policy is the reference (the definition): every RL run "
                     "starts at its reference, so a KL that never moves from its first value means no update "
                     "reached the policy, or, where the updates are seen to land, that the KL is not measured "
                     "against a fixed reference",
    "kl-range": "chosen: a per-token KL to the reference above 1 nat; the healthy GRPO/PPO runs of the public "
                "reports log values between 1e-3 and 1e-1",
    "sync-period": "a rollout engine that receives the trainer's weights only every N steps samples from weights "
                   "up to N-1 updates old (SPEC section 3, stale_weight_sync): its discrepancy to the trainer is "
                   "at its floor right after each sync and grows until the next; the growth between weight "
                   "updates is reported in vllm-project/vime issue 64 (train_rollout_logprob_abs_diff)",
    "r3-routing": "Ma et al., 'Stabilizing MoE Reinforcement Learning by Aligning Training and Inference Routers' "
                  "(arXiv:2510.11370, section 3): without routing replay about 10% of the router decisions of "
                  "Qwen3-30B-A3B choose different experts in the inference engine than in training, the "
                  "discrepancy the paper ties to MoE RL collapse; with the rollout's routing replayed they agree",
    "mismatch-growth": "SPEC section 3's reported signatures: a stale sync's rollout-training discrepancy 'jumps and "
                       "grows (0.015 -> 0.2 within 3 steps)', a routing mismatch's 'discrepancy and KL grow', a "
                       "kernel error's 'slow drift', where a precision fault is a 'shift': a rounding error is "
                       "the same on every step, so it lifts the discrepancy once and holds it (siblings.SEPARATORS)",
    "weight-probe": "MoeproxyCallback reads a fixed sample of every trainable weight before and after each optimizer "
                    "step (moeproxy/integrations/weight_probe.py): a step with a finite, non-zero gradient and an LR "
                    "above 0 moves them (AdamW moves every element it holds a gradient for, by about the LR), so "
                    "one that leaves them exactly as they were never reached the policy (SPEC section 3, "
                    "actor_update_omission: 'optimizer step silently skipped'); and nothing but the optimizer writes "
                    "them between two steps, so the MoE routers' weights changing there were changed outside "
                    "training (SPEC section 3, router_corruption: router weights down-cast, noised or "
                    "re-initialised)",
    "ratio-spikes": "on the first update of a batch the new/old log-prob ratio is 1 by definition (the same weights "
                    "score the same tokens; huggingface/trl issue 454): OpenRLHF issue 931 reports it at 1.002 or "
                    "0.997 on-policy but now and then at 5e8, with the KL loss spiking at random steps, from "
                    "numerically inconsistent forward passes (also OpenRLHF issue 525)",
}


@dataclass(frozen=True)
class Finding:
    """One whole-run observation: which rule, on which metric, the value, and what it supports."""

    rule: str
    metric: str
    source_name: str  # the name the run logged the metric under
    value: float
    threshold: float
    # Fault classes this is evidence for, the cause its source names leading (verl's FAQ reads a
    # high rollout/training difference as a rollout precision problem): classes that the finding
    # alone scores alike are ranked in this order (matching.tie_rank), not alphabetically.
    supports: tuple[str, ...]
    text: str
    source: str  # key of SOURCES
    against: tuple[str, ...] = ("healthy",)  # classes it is evidence against: every finding is
    # something a healthy run does not show

    def to_dict(self) -> dict:
        return {"rule": self.rule, "metric": self.metric, "source_name": self.source_name,
                "value": round(self.value, 6), "threshold": self.threshold, "supports": list(self.supports),
                "against": list(self.against), "text": self.text, "source": self.source}


Rule = Callable[[CanonicalRun], list[Finding]]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


def whole_run_evidence(run: CanonicalRun, *, rules: Sequence[str] | None = None) -> list[Finding]:
    """Every registered rule (or the named ones) over the run, in registry order."""
    out: list[Finding] = []
    for name, fn in RULES.items():
        if rules is None or name in rules:
            out += fn(run)
    return out


def _finite(series: CanonicalSeries) -> np.ndarray:
    return series.values[series.finite]


def _finite_step(run: CanonicalRun, series: CanonicalSeries, i: int) -> int:
    """The step of ``series``'s ``i``-th finite logged value (an index into :func:`_finite`'s array)."""
    return int(run.steps[np.flatnonzero(series.finite)[i]])


def _values(run: CanonicalRun, metric: str, min_points: int) -> tuple[CanonicalSeries, np.ndarray] | None:
    """The run's series of ``metric`` and its finite observed values, or None when the run does
    not log it or logs fewer than ``min_points`` finite values."""
    s = run.metrics.get(metric)
    if s is None:
        return None
    v = _finite(s)
    return None if v.size < min_points else (s, v)


def _second_half_median(v: np.ndarray) -> float:
    """The level of the run's second half: a fault that starts late still counts."""
    return float(np.median(v[v.size // 2:]))


# --- levels against documented ranges --------------------------------------------------------------

#: verl FAQ: normal below 0.005, a problem above 0.01 (probability space, verl's own metric only:
#: TRL's sampling_logp_difference is in log space and has no published range).
PROBS_DIFF_PROBLEM = 0.01
MISMATCH_CLASSES = ("rollout_logp_precision", "operator_numeric_noise", "stale_weight_sync", "routing_mismatch")


@rule("rollout_mismatch_level")
def _rollout_mismatch(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "rollout_train_logp_diff", 3)
    if got is None or got[0].source != "training/rollout_probs_diff_mean":
        return []
    s, v = got
    level = _second_half_median(v)
    if level <= PROBS_DIFF_PROBLEM:
        return []
    return [Finding("rollout_mismatch_level", "rollout_train_logp_diff", s.source, level, PROBS_DIFF_PROBLEM,
                    MISMATCH_CLASSES, f"{s.source} median {level:.3g} over the second half of the run, above "
                    f"{PROBS_DIFF_PROBLEM} (verl's FAQ: normal < 0.005, > 0.01 a rollout precision problem)",
                    "verl-faq")]


#: How far the mean importance ratio may sit from 1 before it says the two policies differ.
RATIO_TOLERANCE = 0.05


@rule("importance_ratio_level")
def _importance_ratio(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "importance_ratio", 3)
    if got is None:
        return []
    s, v = got
    level = _second_half_median(v)
    if abs(level - 1.0) <= RATIO_TOLERANCE:
        return []
    return [Finding("importance_ratio_level", "importance_ratio", s.source, level, RATIO_TOLERANCE,
                    MISMATCH_CLASSES, f"{s.source} median {level:.3g} over the second half, more than "
                    f"{RATIO_TOLERANCE} from 1: rollout and trainer policies differ", "ratio-definition")]


#: R3's measurement: ~10% of router decisions differ between inference and training without
#: routing replay, so an agreement at or below 0.9 is at least the mismatch it reports.
ROUTING_AGREEMENT_PROBLEM = 0.9
#: Chosen: how far the agreement may still fall between the first and the last fifth of the stretch
#: below :data:`ROUTING_AGREEMENT_PROBLEM` for it to be a level. A rollout copy that falls behind
#: the trainer (a stale sync) lowers the agreement step after step (campaign v2's skipped syncs:
#: 0.99 to 0.76); a rollout that routes differently drops it at once and holds it.
ROUTING_HELD = 0.05
ROUTING_MIN_POINTS = 10  # logged points the rule needs
ROUTING_MIN_LOW = 5  # of them at or below the level: one or two low batches are no level


@rule("routing_agreement_level")
def _routing_agreement(run: CanonicalRun) -> list[Finding]:
    """The rollout and the trainer choose different experts for more tokens than R3 measured
    without routing replay, at a level that holds rather than drifting down with training."""
    got = _values(run, "routing_agreement", ROUTING_MIN_POINTS)
    if got is None:
        return []
    s, v = got
    low = np.flatnonzero(v <= ROUTING_AGREEMENT_PROBLEM)
    if low.size < ROUTING_MIN_LOW:
        return []
    after = v[low[0]:]
    level = float(np.median(after))
    k = max(2, after.size // 5)
    fall = float(np.median(after[:k]) - np.median(after[-k:]))
    if level > ROUTING_AGREEMENT_PROBLEM or fall > ROUTING_HELD:
        return []
    return [Finding("routing_agreement_level", "routing_agreement", s.source, level, ROUTING_AGREEMENT_PROBLEM,
                    ("routing_mismatch",),
                    f"{s.source} median {level:.3g} from step {_finite_step(run, s, int(low[0]))} on, and it holds "
                    f"there: rollout and trainer choose different experts for more tokens than the ~10% that R3 "
                    f"measured without routing replay", "r3-routing")]


#: Rollout/trainer discrepancy metrics a stale rollout lifts: each falls back to its floor right
#: after a weight sync (read by their size: a k1 estimate of rollout_kl is signed step to step).
SYNC_METRICS = ("rollout_train_logp_diff", "rollout_train_logp_diff_max", "rollout_kl")
SYNC_PERIODS = range(3, 33)  # steps between syncs that the rule looks for
SYNC_MIN_RESETS = 5  # returns to the floor on one phase of the period: fewer could be chance
SYNC_ALIGNED = 0.8  # share of the syncs the period predicts that are returns to the floor
#: Chosen: share of all the returns that fall on that phase. Lower than :data:`SYNC_ALIGNED`: a
#: signed estimate read by its size (OpenRLHF's k1 ``vllm_kl``) passes near 0 by chance between
#: syncs too, and each such pass is a return off the phase.
SYNC_ON_PHASE = 0.7
SYNC_FLOOR_QUANTILE = 0.05  # the floor: the run's 5th percentile
SYNC_TOP_QUANTILE = 0.9  # the top of the saw-tooth: the run's 90th percentile
SYNC_FLOOR_BAND = 0.1  # "at the floor": within this share of the floor-to-top range above it
#: Chosen: a discrepancy whose top is less than this above its floor is float32
#: rounding of log-probabilities (~1e-7), not a stale copy (a periodic pattern there is the
#: batching's, seen in an in-engine run at 4e-8 to 2e-7).
SYNC_MIN_AMPLITUDE = 1e-5
#: Chosen: a run whose top is this many times its floor resets to rounding at each sync (an exact
#: copy of the weights, as an engine without a rollout precision gap makes); its floor band is then
#: read on a log scale, ``SYNC_EXACT_BAND`` of the decades from floor to top.
SYNC_EXACT_RATIO = 1e3
SYNC_EXACT_BAND = 0.25


def floor_returns(v: np.ndarray) -> np.ndarray:
    """Indices where ``v`` comes back down to its floor from above it (empty when it never
    leaves its floor by more than :data:`SYNC_MIN_AMPLITUDE`)."""
    if v.size < 2:
        return np.zeros(0, dtype=np.int64)
    floor = float(np.quantile(v, SYNC_FLOOR_QUANTILE))
    # The top of the range, not the median: a sync that goes stale late leaves the run at its
    # floor for most of its steps.
    top = float(np.quantile(v, SYNC_TOP_QUANTILE))
    if top - floor < SYNC_MIN_AMPLITUDE:
        return np.zeros(0, dtype=np.int64)
    if floor == 0:
        # A sync that resets it to exactly 0.0: an estimate between syncs lands on 0.0 by no chance,
        # however near 0 it passes, so the zeros are the syncs.
        low = v <= 0
    elif top >= SYNC_EXACT_RATIO * floor:
        # An exact copy: a fresh sync puts the discrepancy at float rounding, orders of magnitude
        # under anything between syncs, where a signed estimate read by its size passes far closer
        # to 0 than the top yet stays far above the floor; a band in linear units would count
        # those passes as syncs.
        low = np.log(np.maximum(v, floor)) <= math.log(floor) + SYNC_EXACT_BAND * math.log(top / floor)
    else:
        low = v <= floor + SYNC_FLOOR_BAND * (top - floor)
    return np.flatnonzero(low[1:] & ~low[:-1]) + 1


@dataclass(frozen=True)
class SyncPeriod:
    period: int  # points between returns to the floor
    returns: int  # returns on the period's phase
    first: int  # index of the first of them


def sync_period(v: np.ndarray) -> SyncPeriod | None:
    """The period of a saw-tooth in ``v``: its returns to the floor fall on one phase of a period
    (at least :data:`SYNC_ON_PHASE` of them) and on most of the syncs that period predicts between
    the first and the last; the period with the most such returns, or None."""
    returns = floor_returns(v)
    if returns.size < SYNC_MIN_RESETS:
        return None
    best: SyncPeriod | None = None
    for period in SYNC_PERIODS:
        phase = returns % period
        counts = np.bincount(phase, minlength=period)
        on = returns[phase == int(np.argmax(counts))]
        predicted = (int(on[-1]) - int(on[0])) // period + 1
        if (on.size >= SYNC_MIN_RESETS and on.size >= SYNC_ON_PHASE * returns.size
                and on.size >= SYNC_ALIGNED * predicted and (best is None or on.size > best.returns)):
            best = SyncPeriod(period, int(on.size), int(on[0]))
    return best


@rule("sync_sawtooth")
def _sync_sawtooth(run: CanonicalRun) -> list[Finding]:
    """A discrepancy that falls back to its floor every N steps and climbs in between: the rollout
    engine gets the trainer's weights only every N steps (SEPARATORS["stale_weight_sync"])."""
    for metric in SYNC_METRICS:
        s = run.metrics.get(metric)
        if s is None:
            continue
        kept = np.flatnonzero(s.finite)
        # By its size: OpenRLHF's vllm_kl is a k1 estimate, mean(rollout - old log-prob), whose sign
        # changes from step to step; its floor is 0, where a fresh sync puts it.
        found = sync_period(np.abs(s.values[kept]))
        if found is None:
            continue
        first = int(run.steps[kept[found.first]])
        # The period in steps: a long run's canonical grid holds one point per several steps.
        every = found.period * max(1, int(np.median(np.diff(run.steps[kept]))))
        return [Finding("sync_sawtooth", metric, s.source, float(every), SYNC_MIN_RESETS,
                        ("stale_weight_sync",),
                        f"{s.source} falls back to its floor every {every} steps ({found.returns} times "
                        f"from step {first}) and climbs in between: the rollout engine gets the trainer's "
                        f"weights only every {every} steps and samples from stale ones in between",
                        "sync-period")]
    return []


#: Chosen: the discrepancy must first pass verl's problem level (SOURCES["verl-faq"]) for its growth
#: to be judged; a discrepancy at float rounding's size grows by large factors from next to nothing.
GROWTH_FROM = PROBS_DIFF_PROBLEM
#: Chosen: growth between the first and the last quarter of the stretch from there. Campaign v2's
#: precision faults hold theirs at 0.9-1.04x; the public reports' and its own skipped syncs grow 2-6x.
GROWTH_FACTOR = 2.0
GROWTH_MIN_POINTS = 12
GROWTH_METRICS = ("rollout_train_logp_diff",)


@rule("mismatch_grows")
def _mismatch_grows(run: CanonicalRun) -> list[Finding]:
    """The rollout/trainer discrepancy keeps growing once it is past verl's problem level: a copy
    falling further behind, a routing or kernel error the training makes worse, not the fixed
    rounding error of a lower-precision rollout (which shifts it once and holds it). Evidence
    against that one sibling only: which of the others grows it, the growth does not say (the
    public reports give all three, campaign v2 only its skipped and partial syncs)."""
    for metric in GROWTH_METRICS:
        got = _values(run, metric, GROWTH_MIN_POINTS)
        if got is None:
            continue
        s, v = got
        above = np.flatnonzero(v > GROWTH_FROM)
        if above.size == 0 or v.size - above[0] < GROWTH_MIN_POINTS:
            continue
        stretch = v[above[0]:]
        q = stretch.size // 4
        start, end = float(np.median(stretch[:q])), float(np.median(stretch[-q:]))
        if end < GROWTH_FACTOR * start:
            continue
        return [Finding("mismatch_grows", metric, s.source, end / start, GROWTH_FACTOR, (),
                        f"{s.source} keeps growing past {GROWTH_FROM} (from step {_finite_step(run, s, int(above[0]))}: "
                        f"{start:.3g} in the first quarter of that stretch, {end:.3g} in the last): a discrepancy "
                        "that training makes worse, where a lower-precision rollout shifts it once and holds it",
                        "mismatch-growth", against=("healthy", "rollout_logp_precision"))]
    return []


#: Chosen: a step whose per-update KL is at least this many times the median of its neighbours is
#: a spike: two orders of magnitude (the ratio of SOURCES["ratio-spikes"] went from ~1 to 5e8). A
#: small batch's per-update KL is noisy: campaign v2's healthy runs reach 50-100x their neighbours on
#: a step or two.
SPIKE_FACTOR = 100.0
SPIKE_NEIGHBOURS = 5  # steps each side whose median is a step's baseline
#: Chosen: spikes a run needs; one or two can be one bad batch, and a learning rate far too high
#: gives a couple too (campaign v2's LR x300 runs: up to 7 in 120 steps, beside `lr_level`).
SPIKE_MIN = 5
SPIKE_METRICS = ("ppo_kl",)  # the KL between the updated and the rollout-time policy (verl, OpenRLHF)


def neighbour_median(v: np.ndarray, k: int = SPIKE_NEIGHBOURS) -> np.ndarray:
    """For each point, the median of up to ``k`` points on each side of it (itself left out)."""
    if v.size < 2:
        return np.full(v.size, np.nan)
    padded = np.concatenate([np.full(k, np.nan), v.astype(float), np.full(k, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * k + 1).copy()
    windows[:, k] = np.nan
    return np.nanmedian(windows, axis=1)


def spike_ratios(v: np.ndarray) -> np.ndarray:
    """``|v|`` over its neighbours' median, NaN where that median is 0 (a run that stopped updating
    logs 0 around its last blips: nothing to compare with)."""
    a = np.abs(v)
    base = neighbour_median(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(base > 0, a / np.where(base > 0, base, 1.0), np.nan)


@rule("ratio_spikes")
def _ratio_spikes(run: CanonicalRun) -> list[Finding]:
    """The per-update KL jumps by two orders of magnitude on isolated steps and falls straight back:
    the trainer's forward passes disagree with themselves on some batches (a numerically wrong
    kernel), not a policy that moved (a level shift or a growth moves the neighbours too)."""
    for metric in SPIKE_METRICS:
        got = _values(run, metric, 2 * SPIKE_NEIGHBOURS + 1)
        if got is None:
            continue
        s, v = got
        ratios = spike_ratios(v)
        spikes = np.flatnonzero(ratios >= SPIKE_FACTOR)
        if spikes.size < SPIKE_MIN:
            continue
        first = _finite_step(run, s, int(spikes[0]))
        return [Finding("ratio_spikes", metric, s.source, float(spikes.size), SPIKE_MIN, ("operator_numeric_noise",),
                        f"{s.source} spikes to {SPIKE_FACTOR:.0f}x or more its neighbouring steps on {spikes.size} "
                        f"steps (first at step {first}, up to {float(np.max(ratios[spikes])):.3g}x) and falls "
                        "straight back: the new and old log-probs of one batch disagree by orders of magnitude "
                        "now and then, a numerically inconsistent forward pass", "ratio-spikes")]
    return []


#: Consecutive steps of an exactly-zero gradient norm that count as "no update".
ZERO_GRAD_RUN = 3
#: Chosen: share of the logged steps from the first zero gradient to the end that must be zero. An
#: update that is dropped stays dropped (frozen parameters, a detached loss, a skipped optimizer step:
#: every step from where it starts); a gradient that is 0 on stretches of a run that otherwise
#: trains is a batch without signal, or a logging point that samples one step of an interval.
ZERO_GRAD_PERSISTS = 0.8
#: A step whose every prompt group tied (``zero_std_frac`` at 1) has advantage 0 everywhere, so
#: GRPO's gradient is 0 by definition (SOURCES["grpo-advantage"]): the zero explains itself.
ALL_GROUPS_TIED = 0.999


@rule("grad_norm_zero")
def _grad_norm_zero(run: CanonicalRun) -> list[Finding]:
    s = run.metrics.get("grad_norm")
    if s is None:
        return []
    zero = (s.values == 0.0) & s.finite
    longest = _longest_true(zero)
    if longest < ZERO_GRAD_RUN:
        return []
    tied = run.metrics.get("zero_std_frac")
    if tied is not None and not np.any(zero & ~(tied.observed & (tied.values >= ALL_GROUPS_TIED))):
        return []  # every zero gradient fell on a step whose groups all tied: no signal, not no update
    start = int(np.argmax(zero))
    zeros, logged = int(zero[start:].sum()), int(s.observed[start:].sum())
    if zeros < ZERO_GRAD_PERSISTS * logged:
        return []
    return [Finding("grad_norm_zero", "grad_norm", s.source, float(longest), ZERO_GRAD_RUN,
                    ("actor_update_omission",), f"{s.source} exactly 0 for {longest} steps in a row (first at "
                    f"step {int(run.steps[start])}) and on {zeros} of the {logged} logged steps since: no "
                    "update reached the policy", "no-gradient")]


#: Metrics whose non-finite values are the overflow signature (SPEC section 3).
NONFINITE_METRICS = ("grad_norm", "pg_loss", "kl", "entropy")
#: Logged steps after the first non-finite gradient norm over which the loss, KL and entropy must
#: stay finite to say the framework dropped those updates rather than let the NaN into the weights.
SKIPPED_UPDATE_STEPS = 5


def _nonfinite_hits(run: CanonicalRun) -> list[tuple[str, CanonicalSeries]]:
    return [(m, run.metrics[m]) for m in NONFINITE_METRICS if m in run.metrics and run.metrics[m].has_nonfinite]


def _skipped_updates(run: CanonicalRun, hits: list[tuple[str, CanonicalSeries]]) -> int | None:
    """Where the gradient norm is the only non-finite metric (``hits``, from :func:`_nonfinite_hits`),
    the logged steps after its first NaN that log a forward metric (loss, KL, entropy: all finite,
    since nothing else is non-finite), if there are at least :data:`SKIPPED_UPDATE_STEPS` (a
    framework that skipped those updates); else None."""
    if [m for m, _ in hits] != ["grad_norm"]:
        return None
    after = _forward_steps_after(run, hits[0][1].first_nonfinite_index())
    return after if after >= SKIPPED_UPDATE_STEPS else None


@rule("nonfinite")
def _nonfinite(run: CanonicalRun) -> list[Finding]:
    """NaN/inf in the gradient norm, loss, KL or entropy: an overflow (SPEC section 3), unless the
    updates were skipped (``nonfinite_update_skipped``) or the KL term went first (``kl_term_nonfinite``).
    Evidence against ``actor_update_omission`` too: a non-finite gradient norm reads as a skipped
    update only where finite forward metrics after it show the skip, and where this rule fires
    none do (the run stops at the NaN, as TRL's does when NaN weights break the next sampling, or
    the forward metrics turn NaN with it)."""
    hits = _nonfinite_hits(run)
    if not hits or _skipped_updates(run, hits) is not None or _kl_term_first(run, hits) is not None:
        return []
    m, s = min(hits, key=lambda h: h[1].first_nonfinite_index())
    step = run.first_nonfinite_step(m)
    count = int(s.nonfinite.sum())
    return [Finding("nonfinite", m, s.source, float(count), 0.0, ("gradient_overflow",),
                    f"{s.source} non-finite from step {step} ({count} steps), and no finite step after it shows "
                    "the update skipped", "nonfinite", against=("healthy", "actor_update_omission"))]


@rule("nonfinite_update_skipped")
def _nonfinite_update_skipped(run: CanonicalRun) -> list[Finding]:
    """Only the gradient norm is non-finite, and the loss, KL and entropy stay finite for the steps
    after it: a framework that skips an update whose gradient norm is not finite (verl's actor
    does), so the NaN never reached the weights. What is wrong is that those updates were dropped
    (``actor_update_omission``); an overflow that reached the weights makes the forward metrics NaN
    from the next step, and a gradient would not stay non-finite for steps on end in a model whose
    weights it never touched unless something keeps producing it."""
    after = _skipped_updates(run, _nonfinite_hits(run))
    if after is None:
        return []
    s = run.metrics["grad_norm"]
    step = run.first_nonfinite_step("grad_norm")
    count = int(s.nonfinite.sum())
    return [Finding("nonfinite_update_skipped", "grad_norm", s.source, float(count), SKIPPED_UPDATE_STEPS,
                    ("actor_update_omission",),
                    f"{s.source} non-finite from step {step} ({count} steps) while the loss, KL and entropy stay "
                    f"finite for the {after} steps after it: those updates were skipped, the NaN never reached "
                    "the weights", "skip-nonfinite")]


def _kl_term_first(run: CanonicalRun, hits: list[tuple[str, CanonicalSeries]]) -> int | None:
    """The grid index at which the KL became non-finite, when it is the first non-finite metric (the
    gradient norm at the same step at the earliest) while the policy loss and the entropy logged at
    that step are finite; else None. The loss is computed before the backward pass, so a gradient
    that overflows on its own leaves that step's KL finite, and NaN weights make every forward
    metric NaN: only a KL estimate that overflowed by itself is NaN beside a finite policy loss."""
    first = {m: s.first_nonfinite_index() for m, s in hits}
    at = first.get("kl")
    if at is None or any(i < at for i in first.values()):
        return None
    beside = [run.metrics[m] for m in ("pg_loss", "entropy") if m in run.metrics and run.metrics[m].observed[at]]
    if not beside or any(b.nonfinite[at] for b in beside):
        return None
    return at


@rule("kl_term_nonfinite")
def _kl_term_nonfinite(run: CanonicalRun) -> list[Finding]:
    """The KL goes non-finite first, at a step whose policy loss and entropy are finite: the KL
    estimate overflowed (verl's unclamped ``low_var_kl``: exp of a large log-ratio), a KL
    configuration fault; the NaN gradient and the collapse after it follow from it."""
    at = _kl_term_first(run, _nonfinite_hits(run))
    if at is None:
        return []
    s = run.metrics["kl"]
    step = int(run.steps[at])
    count = int(s.nonfinite.sum())
    return [Finding("kl_term_nonfinite", "kl", s.source, float(count), 0.0, ("kl_misconfiguration",),
                    f"{s.source} non-finite from step {step} while the policy loss and entropy of that step are "
                    "finite: the KL estimate overflowed before anything else", "kl-clamp")]


def _forward_steps_after(run: CanonicalRun, index: int) -> int:
    """Steps after grid index ``index`` at which the run logs a forward metric (loss, KL,
    entropy); 0 when it logs none of them (nothing to tell a skip from an overflow)."""
    forward = [run.metrics[m] for m in ("pg_loss", "kl", "entropy") if m in run.metrics]
    if not forward:
        return 0
    logged = np.zeros(run.steps.size, dtype=bool)
    for f in forward:
        logged |= f.observed
    logged[: index + 1] = False
    return int(logged.sum())


#: 100x the recipes' 1e-6 (SOURCES["rl-lr"]): the LR multiplier of SPEC section 3.
LR_FAR_ABOVE_RECIPES = 1e-4
#: LoRA's LR over full fine-tuning's (SOURCES["lora-lr"]: 10x to 128x with model size): a LoRA run
#: is judged 100x above the recipes scaled by the top of that range.
LORA_LR_MULTIPLIER = 128.0


@rule("lr_level")
def _lr_level(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "lr", 1)
    if got is None:
        return []
    s, v = got
    peak = float(v.max())  # the schedule's peak: warm-up and decay do not count
    lora = run.settings.lora
    bar = LR_FAR_ABOVE_RECIPES * (LORA_LR_MULTIPLIER if lora else 1.0)
    if peak <= bar:
        return []
    recipes = (f"the 1e-6 of the public RL recipes times {LORA_LR_MULTIPLIER:.0f}, the most LoRA needs"
               if lora else "the 1e-6 of the public RL recipes")
    return [Finding("lr_level", "lr", s.source, peak, bar, ("lr_misconfiguration",),
                    f"{s.source} peaks at {peak:.3g}, over 100x {recipes}", "lora-lr" if lora else "rl-lr")]


#: The logged LR's peak under this share of the configured one: the schedule never left its warm-up
#: (chosen: a warm-up of the usual 3-10% of a run ends at the full LR; one 100x the run ends at 1%).
LR_NEVER_REACHED = 0.1
LR_NEVER_REACHED_STEPS = 20


@rule("lr_never_reached")
def _lr_never_reached(run: CanonicalRun) -> list[Finding]:
    """The LR the run logged never reaches a tenth of the learning rate its config states: a
    warm-up longer than the run (``warmup_steps`` given in samples, or for another run length) or a
    scheduler stuck at its start. Every update is a fraction of what was set and the policy barely
    moves (SPEC section 3, actor_update_omission: LR 0 at the first step). A rising LR alone is a
    warm-up; only the config says where it was meant to go."""
    configured = run.settings.learning_rate
    got = _values(run, "lr", LR_NEVER_REACHED_STEPS)
    if got is None or configured is None or configured <= 0:
        return []
    s, v = got
    peak = float(v.max())
    if peak >= LR_NEVER_REACHED * configured:
        return []
    return [Finding("lr_never_reached", "lr", s.source, peak, LR_NEVER_REACHED * configured,
                    ("actor_update_omission",),
                    f"{s.source} never passes {peak:.3g}, {peak / configured:.1%} of the learning rate the run's config "
                    f"states ({configured:.3g}): the schedule never left its warm-up, so every update is a fraction "
                    "of what was set", "config-lr")]


@rule("kl_coef_negative")
def _kl_coef_negative(run: CanonicalRun) -> list[Finding]:
    """A negative KL-to-reference coefficient, logged (at any step: no schedule takes it below 0)
    or stated by the run's config: the KL term pushes the policy away from its reference instead
    of holding it near."""
    got = _values(run, "actor/kl_coef", 1)
    if got is not None and (neg := np.flatnonzero(got[1] < 0)).size:
        s, v = got
        coef = float(v[neg[0]])
        where = f"{s.source} logs from step {_finite_step(run, s, int(neg[0]))}"
        name = s.source
    elif run.settings.kl_coef is not None and run.settings.kl_coef < 0:
        coef, where, name = run.settings.kl_coef, "the run's config states", "config"
    else:
        return []
    return [Finding("kl_coef_negative", "actor/kl_coef", name, coef, 0.0, ("kl_misconfiguration",),
                    f"{where} a KL coefficient of {coef:.3g}: below 0 the KL term rewards the policy for leaving "
                    "its reference instead of holding it near", "kl-penalty")]


#: 10x the largest coefficient of the recipes (SOURCES["kl-recipes"]: 0.001 to 0.1), chosen: a KL
#: term this heavy holds the policy at its reference, so the reward's advantage moves it nowhere.
KL_COEF_FAR_ABOVE_RECIPES = 1.0


@rule("kl_coef_level")
def _kl_coef_level(run: CanonicalRun) -> list[Finding]:
    """A KL-to-reference coefficient far above every public recipe's, the largest logged (verl's
    ``actor/kl_coef``, its ``kl_loss_coef``) or stated by the run's config from step 0: a level, not
    a schedule. Only for a run that logs the KL to its reference: ``beta`` is also the temperature
    of preference losses (DPO, SimPO: 2 to 10 there), where no KL term is computed or logged."""
    if "kl" not in run.metrics:
        return []
    candidates: list[tuple[float, str, str]] = []
    got = _values(run, "actor/kl_coef", 1)
    if got is not None:
        candidates.append((float(got[1].max()), got[0].source, f"{got[0].source} reaches"))
    if run.settings.kl_coef_max is not None:
        candidates.append((run.settings.kl_coef_max, "config", "the run's config states"))
    if not candidates:
        return []
    coef, name, where = max(candidates)
    if coef < KL_COEF_FAR_ABOVE_RECIPES:
        return []
    return [Finding("kl_coef_level", "actor/kl_coef", name, coef, KL_COEF_FAR_ABOVE_RECIPES, ("kl_misconfiguration",),
                    f"{where} a KL coefficient of {coef:.3g}, over 10x the largest of the public recipes (0.001 to "
                    "0.1): a KL term this heavy holds the policy at its reference, so the reward moves it nowhere",
                    "kl-recipes")]


# --- trends against a healthy run ----------------------------------------------------------------

#: A run shorter than this says too little about its trends.
MIN_TREND_STEPS = 40

#: The reward "rises" when the least-squares slope over the whole run is at least this many of its
#: standard errors above 0. One standard error, not two: a small GRPO batch's reward is noisy (8
#: completions a step: a healthy 200-step TRL run here rises 0.41 -> 0.53 at t = 1.7), and a run
#: whose reward does not clear even one standard error shows no sign of learning.
REWARD_RISE_T = 1.0
NO_LEARNING_CLASSES = ("actor_update_omission", "reward_fault", "lr_misconfiguration")


def slope_t(v: np.ndarray) -> float:
    """The least-squares slope of ``v`` against its index, in standard errors (0 for a constant)."""
    n = v.size
    t = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
    sxx = float(t @ t)
    slope = float(t @ (v - v.mean())) / sxx
    resid = v - v.mean() - slope * t
    se = math.sqrt(float(resid @ resid) / max(n - 2, 1) / sxx)
    if se == 0.0:
        return 0.0 if slope == 0.0 else math.copysign(math.inf, slope)
    return slope / se


@rule("reward_never_rises")
def _reward_never_rises(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "reward_mean", MIN_TREND_STEPS)
    if got is None:
        return []
    s, v = got
    t = slope_t(v)
    if t >= REWARD_RISE_T:
        return []
    return [Finding("reward_never_rises", "reward_mean", s.source, t, REWARD_RISE_T, NO_LEARNING_CLASSES,
                    f"{s.source} does not rise over the run (slope {t:+.2f} standard errors; first tenth "
                    f"{np.mean(v[:v.size // 10]):.3g}, last tenth {np.mean(v[-(v.size // 10):]):.3g}; "
                    "a healthy run's reward rises)", "healthy-dynamics")]


#: Share of prompt groups whose rewards all tie that leaves GRPO (almost) no signal, as a median
#: over the first steps: a reward broken by construction ties from step 1, while a policy that an
#: LR ×100 breaks takes a few steps to collapse onto tied (all-wrong) groups.
TIED_GROUPS = 0.9
FIRST_STEPS = 10
#: ... and the mean share over the whole run: a reward broken by construction ties throughout, while
#: a policy whose sampling is near-deterministic ties many groups but not all (chosen: a real healthy
#: TRL run at top_p 0.9, two prompts a step, tied every group on 7 of its first 10 steps and on 67%
#: over the run; the broken rewards of the sets tie on 93-100% of theirs).
TIED_GROUPS_RUN = 0.8


@rule("no_reward_signal")
def _no_reward_signal(run: CanonicalRun) -> list[Finding]:
    """Tied rewards in every group from the first steps and through the run: the advantage is 0
    everywhere, so the reward is not scoring (a reward that is constant by construction). Tied
    groups that appear only after the reward collapsed are the consequence of another fault, not
    this one; many tied groups, not all, are a policy sampling near-deterministically (top_p)."""
    got = _values(run, "zero_std_frac", 10)
    if got is None:
        return []
    s, v = got
    first, whole = float(np.median(v[:FIRST_STEPS])), float(np.mean(v))
    if first < TIED_GROUPS or whole < TIED_GROUPS_RUN or _policy_breaks_early(run):
        return []
    return [Finding("no_reward_signal", "zero_std_frac", s.source, first, TIED_GROUPS, ("reward_fault",),
                    f"{s.source} median {first:.0%} over the first {FIRST_STEPS} steps and {whole:.0%} over the run: "
                    "every group's rewards tie from the start and keep tying, so every advantage is 0",
                    "grpo-advantage")]


#: Steps (and share of the run) a reward mean must hold one exact value to be "stuck": a mean over
#: a batch of sampled completions moves with every batch unless every completion scores the same.
REWARD_STUCK_STEPS = 10
REWARD_STUCK_SHARE = 0.1


@rule("reward_stuck")
def _reward_stuck(run: CanonicalRun) -> list[Finding]:
    """The reward mean drops to one exact value and holds it to the end, while the policy shows no
    sign of breaking (no KL running away, no entropy collapse or explosion over the run or across the
    fall, no NaN): every completion now scores the same, so every GRPO advantage is 0, and the
    policy did not cause it. That is the reward function (a parser that stopped matching, a reward
    service returning a default). A collapsed policy also scores a constant 0, but its KL or
    entropy says so first (an LR x100); a reward held at the best value it ever reached is a
    saturated task, not a fault."""
    got = _values(run, "reward_mean", 2 * REWARD_STUCK_STEPS)
    if got is None:
        return []
    s, v = got
    last = float(v[-1])
    same = np.abs(v - last) <= 1e-9 * max(1.0, abs(last))
    stuck = _longest_true(same[::-1]) if same[-1] else 0
    start = v.size - stuck
    if stuck < max(REWARD_STUCK_STEPS, REWARD_STUCK_SHARE * v.size) or start == 0:
        return []
    if last >= float(v[:start].max()):  # held at its best: a saturated task
        return []
    step = _finite_step(run, s, start)
    if _kl_runaway(run) or _entropy_extreme(run) or _nonfinite(run) or _entropy_jumps_at(run, step):
        return []
    return [Finding("reward_stuck", "reward_mean", s.source, float(stuck), REWARD_STUCK_STEPS, ("reward_fault",),
                    f"{s.source} holds {last:.4g} exactly from step {step} to the end ({stuck} steps, below the "
                    f"{float(v[:start].max()):.4g} it reached before) while KL and entropy stay in range: every "
                    "completion scores the same, so the reward, not the policy, stopped scoring", "grpo-advantage")]


def _entropy_jumps_at(run: CanonicalRun, step: int) -> bool:
    """The entropy changes by an extreme factor across ``step``: its median over the
    ``REWARD_STUCK_STEPS`` logged steps from ``step`` against the ones before. A policy that one
    huge update breaks (a real TRL run at LR x1000: entropy x15 in the step its reward fell to 0)
    drops the reward at the moment it breaks, and a whole-run entropy ratio cannot see a break in
    the run's first tenth; a reward that stops scoring leaves the policy as it was."""
    e = run.metrics.get("entropy")
    if e is None:
        return False
    keep = e.finite & (e.values > 0)
    steps, vals = run.steps[keep], e.values[keep]
    before = vals[steps < step][-REWARD_STUCK_STEPS:]
    after = vals[steps >= step][:REWARD_STUCK_STEPS]
    if before.size == 0 or after.size == 0:
        return False
    ratio = float(np.median(after)) / float(np.median(before))
    return not ENTROPY_COLLAPSE <= ratio <= ENTROPY_EXPLOSION


def _policy_breaks_early(run: CanonicalRun) -> bool:
    """The entropy jumps by an extreme factor at one of the first ``FIRST_STEPS`` logged steps: a
    first update large enough to break the policy (a real TRL run at LR x1000: x15 after step 1,
    x64 on another seed), after which every completion of a group scores the same 0."""
    e = run.metrics.get("entropy")
    if e is None:
        return False
    steps = run.steps[e.finite]
    return any(_entropy_jumps_at(run, int(s)) for s in steps[1:FIRST_STEPS])


#: Steps a reward function must score exactly 0 for every completion to say it never scores.
COMPONENT_SILENT_STEPS = 20
REWARD_COMPONENT = "reward_component/"  # vocabulary.canonical_name's prefix for one function's mean


@rule("reward_component_silent")
def _reward_component_silent(run: CanonicalRun) -> list[Finding]:
    """One reward function's mean is exactly 0 at every logged step (TRL logs one per function,
    ``rewards/<function>/mean``): it gives every completion the same 0, so it adds nothing to any
    advantage and the behaviour it should reward is never learned (a format regex that never
    matches). A component held at another value is left alone: a format reward at 1 from the start
    is a model that already formats well."""
    out = []
    for name, s in run.metrics.items():
        if not name.startswith(REWARD_COMPONENT):
            continue
        v = _finite(s)
        if v.size < COMPONENT_SILENT_STEPS or np.any(v != 0.0):
            continue
        out.append(Finding("reward_component_silent", name, s.source, float(v.size), COMPONENT_SILENT_STEPS,
                           ("reward_fault",), f"{s.source} is exactly 0 at all {v.size} steps: that reward "
                           "function scores every completion the same, so it adds nothing to any advantage",
                           "grpo-advantage"))
    return out


#: Entropy below this share of its start is a collapse; above this multiple, an explosion.
ENTROPY_COLLAPSE = 0.1
ENTROPY_EXPLOSION = 3.0


@rule("entropy_extreme")
def _entropy_extreme(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "entropy", MIN_TREND_STEPS)
    if got is None:
        return []
    s, v = got
    q = max(3, v.size // 10)
    start, end = float(np.median(v[:q])), float(np.median(v[-q:]))
    if start <= 0:
        return []
    ratio = end / start
    if ENTROPY_COLLAPSE <= ratio <= ENTROPY_EXPLOSION:
        return []
    word = "collapsed" if ratio < ENTROPY_COLLAPSE else "exploded"
    supports = ("lr_misconfiguration", "kl_misconfiguration") if word == "collapsed" else (
        "lr_misconfiguration", "kl_misconfiguration", "rollout_logp_precision")
    return [Finding("entropy_extreme", "entropy", s.source, ratio,
                    ENTROPY_COLLAPSE if word == "collapsed" else ENTROPY_EXPLOSION, supports,
                    f"{s.source} {word}: ×{ratio:.3g} of its start by the end of the run", "healthy-dynamics")]


#: KL to the reference still growing this many times over the second half of the run. Not against
#: the first steps: the policy starts *at* the reference, so every healthy run's KL grows from ~0
#: (a healthy TRL run here: ×200 from its first tenth), then slows down.
KL_RUNAWAY = 10.0
#: A per-token KL to the reference above this has left the reference behind (chosen: the healthy
#: GRPO/PPO runs of the public reports log 1e-3 to 1e-1).
KL_EXTREME = 1.0
KL_CLASSES = ("kl_misconfiguration", "lr_misconfiguration")


@rule("kl_runaway")
def _kl_runaway(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "kl", MIN_TREND_STEPS)
    if got is None:
        return []
    s, raw = got
    v = np.abs(raw)
    q = max(3, v.size // 10)
    mid = float(np.median(v[v.size // 2 - q // 2: v.size // 2 - q // 2 + q])) + 1e-9
    late = float(np.median(v[-q:]))
    growth = late / mid
    if growth >= KL_RUNAWAY:
        return [Finding("kl_runaway", "kl", s.source, growth, KL_RUNAWAY, KL_CLASSES,
                        f"{s.source} still grows ×{growth:.3g} over the second half of the run (a healthy run's "
                        "KL grows early, then slows)", "healthy-dynamics")]
    level = _second_half_median(v)
    if level > KL_EXTREME:
        return [Finding("kl_runaway", "kl", s.source, level, KL_EXTREME, KL_CLASSES,
                        f"{s.source} median {level:.3g} over the second half, above {KL_EXTREME}: the policy has "
                        "left the reference", "kl-range")]
    return []


#: The KL to the reference steps up by this factor across one step (median of the ``KL_JUMP_STEPS``
#: logged steps from it against the ones before; chosen: a learning run's KL grows by x2-x3 over ten
#: steps once it is past its start).
KL_JUMP = 30.0
KL_JUMP_STEPS = 10
#: ... never within a run's first logged steps: a KL that starts at 0 grows by orders of magnitude in
#: every healthy run's first steps (x508 at step 11 in a real healthy TRL run behind a warm-up, x37
#: at step 21 in one with clip-higher).
KL_JUMP_SKIP = 25
#: An LR that changes by more than this across the two windows (a schedule raised mid-run), or a
#: gradient norm this many times the two windows' median (one huge update), moved the policy through
#: the optimizer.
KL_JUMP_LR = 2.0
KL_JUMP_GRAD = 10.0
#: The KL after the step must reach a level a policy that moved shows (chosen: the healthy GRPO/PPO
#: runs of the public reports log 1e-3 to 1e-1, kl-range); a run without updates steps between
#: round-off values (1e-9 to 1e-7 in the engine's) by any factor.
KL_JUMP_FLOOR = 1e-3


@rule("kl_step_jump")
def _kl_step_jump(run: CanonicalRun) -> list[Finding]:
    """The KL to the reference steps up x30 across one step past the run's start, with the LR
    unchanged, no gradient spike around it and nothing non-finite in the run: the policy moved
    further in one step than all its updates had moved it before, and the optimizer did not move
    it. Its weights changed outside the optimizer: a router noised or re-initialised (SPEC section
    3, router_corruption), as real TRL runs whose MoE routers were damaged mid-run show (trl_runs_6:
    x123 at the re-initialisation). An LR raised mid-run steps the KL too, and the LR says so."""
    got = _values(run, "kl", 2 * KL_JUMP_STEPS + KL_JUMP_SKIP)
    if got is None:
        return []
    s, v = got
    steps = run.steps[s.finite]
    # med[j] is the median of v[j : j + KL_JUMP_STEPS]: across index i, "before" is med[i - W] and
    # "after" med[i]. One vectorised pass (a 2,000-step run has ~2,000 candidate steps).
    med = np.median(np.lib.stride_tricks.sliding_window_view(v, KL_JUMP_STEPS), axis=1)
    idx = np.arange(max(KL_JUMP_STEPS, KL_JUMP_SKIP), v.size - KL_JUMP_STEPS + 1)
    before, after = med[idx - KL_JUMP_STEPS], med[idx]
    ratios = np.divide(after, before, out=np.zeros_like(after), where=before > 0)
    jumps = (ratios >= KL_JUMP) & (after >= KL_JUMP_FLOOR)
    # The run-wide checks only where there is a step to explain (most runs have none). A KL pushed
    # away from the reference by a negative coefficient grows in bursts: the config says why.
    if not jumps.any() or _nonfinite(run) or _nonfinite_update_skipped(run) or _kl_coef_negative(run):
        return []
    # The largest step the optimizer does not explain (the earliest of equal ones).
    order = np.argsort(-ratios[jumps], kind="stable")
    best = next((int(i) for i in idx[jumps][order] if not _optimizer_moved(run, steps, int(i))), None)
    if best is None:
        return []
    i, ratio = best, float(ratios[best - idx[0]])
    return [Finding("kl_step_jump", "kl", s.source, ratio, KL_JUMP, ("router_corruption",),
                    f"{s.source} stepped up ×{ratio:.3g} at step {int(steps[i])} (median of {KL_JUMP_STEPS} steps "
                    "against the ones before) with the LR unchanged and no gradient spike: the weights changed "
                    "outside the optimizer, as a damaged or re-initialised router changes them",
                    "weights-outside-optimizer")]


#: The load-balancing loss's last quarter must sit this many noise widths (of a quarter's median)
#: above its first quarter's, and by this share of its level (chosen: real healthy TRL runs end
#: 0-0.3% below where they start, the balance term pulling the routers even).
BALANCE_RISE_Z = 4.0
BALANCE_RISE_REL = 0.005
BALANCE_MIN_STEPS = 40
#: A schedule raised this much between the quarters (an LR x100 from a resumed step) moved the
#: routers through the optimizer: it is the LR's finding, not the router's.
BALANCE_LR_RISE = 2.0


#: Chosen: logged steps whose sampled weights the optimizer step left exactly as they were, with a
#: finite gradient norm above 0 and an LR above 0 (not one: the first step of a warm-up from 0 runs
#: at LR 0, and a log may say the LR after the scheduler moved it).
UPDATE_NOT_APPLIED_STEPS = 3
#: Chosen: ... at an LR of at least this share of the run's largest. A schedule that decays to 0 ends
#: on steps whose updates bf16 weights without an fp32 copy round away, by design of the schedule.
UPDATE_LR_SHARE = 0.1


@rule("update_not_applied")
def _update_not_applied(run: CanonicalRun) -> list[Finding]:
    """The optimizer stepped with a gradient and changed nothing (``update_ratio_min`` 0 exactly,
    MoeproxyCallback's weight probe): a wrapper that drops the step after the norm was measured, an
    optimizer built over other parameters than the ones that train, or updates below the weights'
    precision (bf16 weights without an fp32 copy) at an LR the run really trains at. Logs of several
    steps count when any of their steps changed nothing (the smallest of them is 0); a run long
    enough to be binned (canonical.py) averages isolated zeros away."""
    u, g = run.metrics.get("update_ratio_min"), run.metrics.get("grad_norm")
    if u is None or g is None:
        return []
    lr = run.metrics.get("lr")
    lr_working = np.ones_like(u.finite)
    if lr is not None and lr.finite.any():
        peak = float(lr.values[lr.finite].max())
        lr_working = ~lr.observed | ((lr.values > 0) & (lr.values >= UPDATE_LR_SHARE * peak))
    dead = u.finite & (u.values == 0.0) & g.finite & (g.values > 0.0) & lr_working
    count = int(dead.sum())
    if count < UPDATE_NOT_APPLIED_STEPS:
        return []
    first, measured = int(run.steps[np.argmax(dead)]), int((u.finite & g.finite).sum())
    return [Finding("update_not_applied", "update_ratio_min", u.source, float(count), UPDATE_NOT_APPLIED_STEPS,
                    ("actor_update_omission",),
                    f"{u.source} exactly 0 on {count} of the {measured} logged steps (first at step {first}) while "
                    f"{g.source} was finite and above 0: those optimizer steps changed none of the sampled "
                    "weights, so the update never reached the policy", "weight-probe")]


#: Chosen: a relative change of the routers' sampled weights between two optimizer steps above
#: float32 round-off (about 1e-7) by a margin. Exactly 0 where only the optimizer writes them; a
#: bf16 round trip of fp32 weights moves them by about 1e-3, damage by far more.
ROUTER_OUTSIDE_MIN = 1e-6
#: Chosen: ... and by this many times the change of all the sampled weights at the same step: a write
#: to the whole model (a cast of the policy in place, a reload) moves the routers with the rest and is
#: not router damage (the real routers rounded to bf16 of trl_runs_12: 27x).
ROUTER_OVER_ALL = 2.0


@rule("router_changed_outside_optimizer")
def _router_changed_outside_optimizer(run: CanonicalRun) -> list[Finding]:
    """The MoE routers' weights changed between two optimizer steps (``router_outside_change``,
    MoeproxyCallback's weight probe): something other than training wrote them."""
    s = run.metrics.get("router_outside_change")
    if s is None:
        return []
    everything = run.metrics.get("outside_change")
    rest = np.zeros_like(s.values) if everything is None else np.where(everything.finite, everything.values, np.inf)
    hit = s.finite & (s.values > ROUTER_OUTSIDE_MIN) & (s.values > ROUTER_OVER_ALL * rest)
    if not hit.any():
        return []
    first, largest = int(run.steps[np.argmax(hit)]), float(s.values[hit].max())
    return [Finding("router_changed_outside_optimizer", "router_outside_change", s.source, largest,
                    ROUTER_OUTSIDE_MIN, ("router_corruption",),
                    f"{s.source} {largest:.3g} at its largest, on {int(hit.sum())} logged steps from step {first}, "
                    f"over {ROUTER_OVER_ALL:g}x the change of all the sampled weights: the MoE routers' weights "
                    "changed between two optimizer steps, outside training, and the rest did not as much "
                    "(a down-cast, a merge, a reload)", "weight-probe")]


@rule("balance_loss_rises")
def _balance_loss_rises(run: CanonicalRun) -> list[Finding]:
    """The MoE load-balancing loss ends the run higher than it started: the routers send tokens to
    fewer experts than they did (SPEC section 3, router_corruption: expert utilisation shifts).
    A healthy run keeps it level or lowers it, since the loss trains the routers to balance; a
    router noised or partly re-initialised mid-run raises it (trl_runs_6: +0.8% at both, 5 noise
    widths). Not where the LR was raised between the quarters, is far above the recipes
    (``lr_level``: the routers move with every weight), or anything turned non-finite."""
    got = _values(run, "balance_loss", BALANCE_MIN_STEPS)
    if got is None:
        return []
    s, v = got
    q = v.size // 4
    first, last = float(np.median(v[:q])), float(np.median(v[-q:]))
    # The noise of one step from its neighbours (robust, so a spike does not widen it), and of a
    # quarter's median from it (white noise: 1.2533 sigma / sqrt(q)); the difference of two medians.
    width = math.sqrt(2.0) * 1.2533 * noise_scale(v) / math.sqrt(q)
    rise = last - first
    if rise <= max(BALANCE_RISE_Z * width, BALANCE_RISE_REL * abs(first)):
        return []
    if _lr_raised(run) or _lr_level(run) or _nonfinite(run) or _nonfinite_update_skipped(run):
        return []
    # A trace logged with no step-to-step noise (a value repeated each update) has width 0.
    widths = f"{rise / width:.1f} noise widths" if width > 0 else "no step-to-step noise"
    return [Finding("balance_loss_rises", "balance_loss", s.source, rise / abs(first), BALANCE_RISE_REL,
                    ("router_corruption",),
                    f"{s.source} ends the run {rise / abs(first):.2%} above where it started (median {first:.4g} over the "
                    f"first quarter, {last:.4g} over the last; {widths}): the routers spread "
                    "tokens over fewer experts than they did, as a damaged or re-initialised router does",
                    "switch-balance")]


def _lr_raised(run: CanonicalRun) -> bool:
    """The LR's median over the last quarter of its logged values is ``BALANCE_LR_RISE`` times its
    median over the first: a schedule raised mid-run (a decay never raises it, a warm-up of the usual
    3-10% of a run not so much)."""
    got = _values(run, "lr", 4)
    if got is None:
        return False
    v = got[1]
    q = v.size // 4
    first = float(np.median(v[:q]))
    return first > 0 and float(np.median(v[-q:])) > BALANCE_LR_RISE * first


def _optimizer_moved(run: CanonicalRun, steps: np.ndarray, i: int) -> bool:
    """Across the two windows around the KL's ``i``-th finite value (ten-step medians place the
    step only to within half a window): the LR changed by more than ``KL_JUMP_LR``, or one gradient
    norm was ``KL_JUMP_GRAD`` times the windows' median (one huge update)."""
    lo, hi = steps[i - KL_JUMP_STEPS], steps[min(i + KL_JUMP_STEPS, steps.size) - 1]
    for metric, too_far in (("lr", lambda w: w.min() > 0 and w.max() / w.min() > KL_JUMP_LR),
                            ("grad_norm", lambda w: np.median(w) > 0 and w.max() > KL_JUMP_GRAD * np.median(w))):
        s = run.metrics.get(metric)
        if s is None:
            continue
        w = s.values[s.finite & (run.steps >= lo) & (run.steps <= hi)]
        if w.size and too_far(w):
            return True
    return False


#: How still the KL to the reference must be over the whole run to say the policy never moved: its
#: spread within this (absolute, nats; a no-update run of the engine logs |KL| below 2e-8 from
#: fp32 round-off, a learning one reaches 1e-4 within a few steps) or within ``KL_STILL_REL`` of
#: its level (a logged value that never changes). Steps needed, so a short run's slow start is not it.
KL_STILL_ABS = 1e-6
KL_STILL_REL = 1e-5
KL_STILL_STEPS = 20


def _kl_still(run: CanonicalRun) -> tuple[CanonicalSeries, np.ndarray, float, float] | None:
    """The KL to the reference, its spread and its level, where it stays where it started for the
    whole run. A KL logged as exactly 0 throughout is a KL that is not computed (no KL term) and
    counts only where the run's config states a positive KL coefficient: then the term is computed."""
    got = _values(run, "kl", KL_STILL_STEPS)
    if got is None:
        return None
    s, v = got
    if not np.any(v) and not (run.settings.kl_coef is not None and run.settings.kl_coef > 0):
        return None
    spread = float(np.ptp(v))
    level = float(np.median(np.abs(v)))
    if spread > max(KL_STILL_ABS, KL_STILL_REL * level):
        return None
    return s, v, spread, level


#: Chosen: share of the weight probe's logged steps whose update moved the sampled weights for the
#: run to count as one whose updates reached the policy (a warm-up's first step at LR 0 moves none).
WEIGHTS_MOVED_SHARE = 0.9


def _weights_moved(run: CanonicalRun) -> float | None:
    """The median update the weight probe measured (``update_ratio``), where at least
    ``WEIGHTS_MOVED_SHARE`` of its logged steps moved the weights; None where the run does not log it
    or its updates did not reach the policy."""
    got = _values(run, "update_ratio", KL_STILL_STEPS)
    if got is None or (got[1] > 0).mean() < WEIGHTS_MOVED_SHARE:
        return None
    return float(np.median(got[1]))


@rule("kl_never_moves")
def _kl_never_moves(run: CanonicalRun) -> list[Finding]:
    """The KL to the reference stays where it started for the whole run: no update reached the policy
    (every step skipped or dropped from step 0), which a fault present from step 0 shows in no other
    way a lone run can read. Not where the weight probe saw the updates land (that is
    ``kl_still_while_weights_move``)."""
    still = _kl_still(run)
    if still is None or _weights_moved(run) is not None:
        return []
    s, v, spread, level = still
    return [Finding("kl_never_moves", "kl", s.source, spread, KL_STILL_ABS, ("actor_update_omission",),
                    f"{s.source} stays within {spread:.2g} of one value for all {v.size} steps (level "
                    f"{level:.2g}): the policy never left its starting point, so no update reached it",
                    "kl-definition")]


@rule("kl_still_while_weights_move")
def _kl_still_while_weights_move(run: CanonicalRun) -> list[Finding]:
    """The KL to the reference stays where it started while the weight probe sees every update land:
    the policy moves and its KL to the reference does not, so the KL term does not measure it against
    a fixed reference (a reference synced to the policy every step, a KL computed between the policy
    and itself). Evidence against an omitted update too: the probe saw the updates."""
    still, moved = _kl_still(run), _weights_moved(run)
    if still is None or moved is None:
        return []
    s, v, spread, level = still
    return [Finding("kl_still_while_weights_move", "kl", s.source, spread, KL_STILL_ABS, ("kl_misconfiguration",),
                    f"{s.source} stays within {spread:.2g} of one value for all {v.size} steps (level {level:.2g}) "
                    f"while the weight probe saw the optimizer move the weights (update ratio median {moved:.2g}): "
                    "the KL term does not measure the policy against a fixed reference (a reference synced to "
                    "the policy, a KL of the policy against itself)", "kl-definition",
                    against=("healthy", "actor_update_omission"))]


#: A share of responses cut at the maximum length that a healthy run does not hold for long.
LENGTH_PINNED = 0.5


@rule("length_pinned")
def _length_pinned(run: CanonicalRun) -> list[Finding]:
    got = _values(run, "length_clip_ratio", 10)
    if got is None:
        return []
    s, v = got
    level = _second_half_median(v)
    if level < LENGTH_PINNED:
        return []
    return [Finding("length_pinned", "length_clip_ratio", s.source, level, LENGTH_PINNED,
                    ("kl_misconfiguration", "lr_misconfiguration", "reward_fault"),
                    f"{s.source} median {level:.0%} over the second half: responses run to the maximum length",
                    "healthy-dynamics")]


def _longest_true(mask: np.ndarray) -> int:
    best = cur = 0
    for x in mask:
        cur = cur + 1 if x else 0
        best = max(best, cur)
    return best
