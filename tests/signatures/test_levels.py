"""Whole-run evidence (signatures/levels.py): a healthy run with a schedule shows nothing; each
rule fires on the run that breaks its documented range, from step 0, with no clean baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from moeproxy.signatures.canonical import RunMetrics, canonicalise
from moeproxy.signatures.levels import RULES, SOURCES, whole_run_evidence

N = 200


def _healthy_trl(seed: int = 0, **override) -> dict[str, np.ndarray]:
    """A TRL GRPO run as practitioners report a good one: reward rising to a plateau, entropy
    slowly falling, KL growing slowly, LR warm-up then linear decay (TRL's default schedule)."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    lr = np.where(t < 10, 1e-6 * (t + 1) / 10, 1e-6 * (N - t) / (N - 10))
    cols = {
        "reward": 0.3 + 0.4 * (1 - np.exp(-t / 60)) + rng.normal(0, 0.03, N),
        "entropy": 0.9 - 0.3 * t / N + rng.normal(0, 0.01, N),
        "kl": 0.001 + 0.02 * t / N + np.abs(rng.normal(0, 0.001, N)),
        "learning_rate": lr,
        "grad_norm": 0.5 + rng.normal(0, 0.05, N),
        "completions/mean_length": 200 + 40 * t / N + rng.normal(0, 5, N),
        "completions/clipped_ratio": np.clip(0.02 + rng.normal(0, 0.01, N), 0, 1),
        "sampling/importance_sampling_ratio/mean": 1.0 + rng.normal(0, 0.005, N),
    }
    cols.update(override)
    return cols


def _run(cols: dict[str, np.ndarray], framework: str = "trl"):
    steps = [{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}} for k in range(N)]
    return canonicalise(RunMetrics.from_steps(steps, framework=framework))


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_run_with_warm_up_and_linear_decay_shows_nothing(seed):
    assert whole_run_evidence(_run(_healthy_trl(seed))) == []


def _rules(cols, framework="trl") -> set[str]:
    return {f.rule for f in whole_run_evidence(_run(cols, framework))}


def test_an_lr_a_hundred_times_the_recipes_from_step_0_is_evidence_a_schedule_is_not():
    base = _healthy_trl()
    assert "lr_level" in _rules({**base, "learning_rate": base["learning_rate"] * 300})
    assert "lr_level" not in _rules({**base, "learning_rate": base["learning_rate"] * 30})


def test_verls_rollout_mismatch_range_applies_to_verls_metric_only():
    t = np.arange(N)
    verl = {"critic/score/mean": 0.3 + 0.3 * t / N, "training/rollout_probs_diff_mean": np.full(N, 0.02)}
    found = whole_run_evidence(_run(verl, "verl"))
    mismatch = [f for f in found if f.rule == "rollout_mismatch_level"]
    assert mismatch and "rollout_logp_precision" in mismatch[0].supports
    assert not [f for f in whole_run_evidence(_run({**verl, "training/rollout_probs_diff_mean": np.full(N, 0.003)},
                                                   "verl")) if f.rule == "rollout_mismatch_level"]
    # TRL's log-space difference has no published range: not judged against verl's.
    trl = {**_healthy_trl(), "sampling/sampling_logp_difference/mean": np.full(N, 0.02)}
    assert "rollout_mismatch_level" not in _rules(trl)


def test_each_fault_from_step_0_leaves_its_finding():
    base = _healthy_trl()
    t = np.arange(N)
    cases = {
        "grad_norm_zero": {"grad_norm": np.zeros(N), "reward": np.full(N, 0.3)},
        # An overflow reaches the weights: the KL is NaN from the next step on.
        "nonfinite": {"grad_norm": np.where(t >= 150, math.nan, 0.5), "kl": np.where(t >= 151, math.nan, 0.01)},
        "nonfinite_update_skipped": {"grad_norm": np.where(t >= 150, math.nan, 0.5)},
        "reward_never_rises": {"reward": 0.3 + np.random.default_rng(1).normal(0, 0.03, N)},
        "kl_runaway": {"kl": 0.001 * np.exp(t / 25)},
        "no_reward_signal": {"frac_reward_zero_std": np.ones(N)},
        "length_pinned": {"completions/clipped_ratio": np.full(N, 0.8)},
        "entropy_extreme": {"entropy": 0.9 * np.exp(-t / 30)},
        "importance_ratio_level": {"sampling/importance_sampling_ratio/mean": np.full(N, 1.3)},
    }
    for name, override in cases.items():
        assert name in _rules({**base, **override}), name


def test_groups_that_tie_only_after_the_first_update_broke_the_policy_are_not_the_reward():
    """A reward that never scores ties every group from step 1; a first update large enough to
    break the policy (a real TRL run at LR x1000: entropy x15 after step 1) ties them too, from step
    2 on, and then the tie is the broken policy's."""
    base = _healthy_trl()
    t = np.arange(N)
    tied = np.where(t >= 1, 1.0, 0.5)
    assert "no_reward_signal" in _rules({**base, "frac_reward_zero_std": tied})
    broken = np.where(t >= 1, 2.0 - 0.004 * t, 0.14)
    assert "no_reward_signal" not in _rules({**base, "frac_reward_zero_std": tied, "entropy": broken})
    # An entropy that moves x2 in the first steps is not a break: still the reward.
    assert "no_reward_signal" in _rules({**base, "frac_reward_zero_std": tied, "entropy": np.where(t >= 3, 1.8, 0.9)})


def test_a_policy_that_ties_many_groups_but_not_all_is_not_a_silent_reward():
    """Two prompts a step give a tie share of 0, 0.5 or 1: a near-deterministic healthy policy (a
    real TRL run at top_p 0.9) ties every group on most of its first steps and two thirds of them
    over the run. The reward scores; only a reward that ties throughout is silent."""
    base = _healthy_trl()
    rng = np.random.default_rng(5)
    share = rng.choice([0.0, 0.5, 1.0], size=N, p=[0.15, 0.35, 0.5])
    share[:10] = [1, 0, 1, 0.5, 1, 1, 1, 1, 0.5, 0.5]  # the real run's first ten: median 1
    assert 0.6 < share.mean() < 0.8
    assert "no_reward_signal" not in _rules({**base, "frac_reward_zero_std": share})
    # The same first steps, then ties on 19 steps of every 20: the reward is silent.
    silent = np.where(np.arange(N) % 20 == 7, 0.5, 1.0)
    silent[:10] = share[:10]
    assert "no_reward_signal" in _rules({**base, "frac_reward_zero_std": silent})


def test_a_zero_gradient_on_steps_whose_groups_all_tied_or_on_a_few_steps_of_a_training_run_is_no_omission():
    """GRPO's gradient is 0 when every group ties (no advantage), and a logging point that samples one
    step of an interval can catch such a step: neither is an update the framework dropped."""
    base = _healthy_trl()
    t = np.arange(N)
    late = t >= 120
    tied = np.where(late, 1.0, 0.3)
    # A stretch where every completion scores the same: gradient 0 exactly there (a real TRL run's).
    assert "grad_norm_zero" not in _rules({**base, "grad_norm": np.where(late, 0.0, 0.5), "frac_reward_zero_std": tied})
    # The same zeros with groups that did not all tie: the update is gone.
    assert "grad_norm_zero" in _rules({**base, "grad_norm": np.where(late, 0.0, 0.5),
                                       "frac_reward_zero_std": np.full(N, 0.3)})
    # Zeros on a few stretches of a run that keeps training (a logged point per interval).
    sporadic = np.full(N, 0.5)
    sporadic[[20, 21, 22, 60, 61, 100, 140, 141, 142, 180]] = 0.0
    assert "grad_norm_zero" not in _rules({**base, "grad_norm": sporadic, "frac_reward_zero_std": np.full(N, 0.5)})
    # Zeros from step 120 to the end but for one logged blip still mean no update.
    blip = np.where(late, 0.0, 0.5)
    blip[160] = 0.2
    assert "grad_norm_zero" in _rules({**base, "grad_norm": blip})


def test_every_rule_cites_a_source_that_the_docs_list():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "signatures.md").read_text()
    run = _run({**_healthy_trl(), "grad_norm": np.zeros(N), "learning_rate": np.full(N, 1e-3),
                "kl": 0.001 * np.exp(np.arange(N) / 25)})
    found = whole_run_evidence(run)
    assert found and all(f.source in SOURCES for f in found)
    for name in RULES:
        assert f"`{name}`" in docs, name
    assert "verl/blob/main/docs/faq/faq.rst" in docs


def test_a_reward_that_drops_to_a_constant_while_the_policy_holds_is_the_reward():
    base = _healthy_trl()
    t = np.arange(N)
    broken = {**base, "reward": np.where(t >= 120, 0.0, base["reward"])}
    found = [f for f in whole_run_evidence(_run(broken)) if f.rule == "reward_stuck"]
    assert found and found[0].supports == ("reward_fault",) and found[0].value == N - 120
    assert "from step 121" in found[0].text  # TRL counts steps from 1
    # A task the policy saturates: the reward holds the best value it reached. Not a fault.
    saturated = np.minimum(0.3 + 0.7 * t / 100, 1.0)
    assert "reward_stuck" not in _rules({**base, "reward": saturated})
    # A policy that collapses also scores a constant 0, but its KL runs away first: not the reward.
    assert "reward_stuck" not in _rules({**broken, "kl": 0.001 * np.exp(t / 25)})
    # One huge update breaks the policy: its entropy jumps x15 in the step the reward falls to 0
    # (a real TRL run at LR x1000, no KL logged), then settles, so the whole-run entropy ratio
    # stays in range. The policy, not the reward, stopped scoring.
    broken_early = {**base, "reward": np.where(t >= 1, 0.0, 1.4), "entropy": np.where(t >= 1, 2.0 - 0.004 * t, 0.14)}
    assert "reward_stuck" not in _rules({k: v for k, v in broken_early.items() if k != "kl"})
    # The same early fall with the entropy untouched is the reward.
    assert "reward_stuck" in _rules({**base, "reward": np.where(t >= 1, 0.0, 1.4)})
    assert "reward_stuck" in _rules({**broken, "entropy": np.where(t >= 120, 1.5, base["entropy"])})  # x2: in range
    # Too short a stretch to say every completion scores the same; a reward constant from step 0
    # (never varied) is left to no_reward_signal, which reads the tied groups themselves.
    assert "reward_stuck" not in _rules({**base, "reward": np.where(t >= N - 5, 0.0, base["reward"])})
    assert "reward_stuck" not in _rules({**base, "reward": np.zeros(N)})


def test_a_non_finite_gradient_the_framework_skipped_is_an_omitted_update_not_an_overflow():
    """verl drops an update whose gradient norm is not finite: the grad norm stays NaN while the
    loss, KL and entropy (computed by the forward pass on weights the NaN never touched) stay
    finite. That is actor_update_omission; NaN spreading to them is gradient_overflow."""
    base = _healthy_trl()
    t = np.arange(N)
    skipped = whole_run_evidence(_run({**base, "grad_norm": np.where(t >= 150, math.nan, 0.5)}))
    found = [f for f in skipped if f.rule.startswith("nonfinite")]
    assert [f.rule for f in found] == ["nonfinite_update_skipped"]
    assert found[0].supports == ("actor_update_omission",) and found[0].source == "skip-nonfinite"
    # Too few steps after it to tell (a run that ends at its first NaN): an overflow, as before.
    late = _rules({**base, "grad_norm": np.where(t >= N - 3, math.nan, 0.5)})
    assert "nonfinite" in late and "nonfinite_update_skipped" not in late
    # A run that logs no loss, KL or entropy cannot tell a skip from an overflow either.
    bare = {"reward": base["reward"], "grad_norm": np.where(t >= 150, math.nan, 0.5)}
    assert "nonfinite" in _rules(bare) and "nonfinite_update_skipped" not in _rules(bare)


def test_a_reward_function_that_never_scores_is_a_reward_fault_one_that_saturates_is_not():
    """TRL logs each reward function's mean (rewards/<function>/mean): a format regex that never
    matches scores 0 for every completion, while the run learns from its other reward."""
    base = _healthy_trl()
    silent = {**base, "rewards/accuracy_reward/mean": base["reward"], "rewards/format_reward/mean": np.zeros(N)}
    found = [f for f in whole_run_evidence(_run(silent)) if f.rule == "reward_component_silent"]
    assert len(found) == 1 and found[0].source_name == "rewards/format_reward/mean"
    assert found[0].supports == ("reward_fault",)
    # A format reward at 1 from the start is a model that already formats: nothing to say.
    assert "reward_component_silent" not in _rules({**silent, "rewards/format_reward/mean": np.ones(N)})
    # One completion in one step scoring: it does score.
    once = np.zeros(N)
    once[77] = 0.125
    assert "reward_component_silent" not in _rules({**silent, "rewards/format_reward/mean": once})


def test_a_kl_that_overflows_before_the_policy_loss_is_the_kl_term_not_an_overflow():
    """verl's unclamped low_var_kl: the KL is NaN at a step whose entropy is still finite, the NaN
    gradient and the collapse follow. An overflow that reaches the weights leaves that step's KL
    finite (NaN from the next step), and NaN weights make every forward metric NaN at once."""
    base = _healthy_trl()
    t = np.arange(N)
    kl_first = {**base, "kl": np.where(t >= 150, math.nan, 0.01), "grad_norm": np.where(t >= 150, math.nan, 0.5),
                "entropy": np.where(t >= 151, math.nan, 0.8)}
    found = [f for f in whole_run_evidence(_run(kl_first)) if f.rule in ("kl_term_nonfinite", "nonfinite")]
    assert [f.rule for f in found] == ["kl_term_nonfinite"]
    assert found[0].supports == ("kl_misconfiguration",) and found[0].source == "kl-clamp"
    together = {**kl_first, "entropy": np.where(t >= 150, math.nan, 0.8)}
    assert {"nonfinite"} == _rules(together) & {"nonfinite", "kl_term_nonfinite"}
    overflow = {**base, "grad_norm": np.where(t >= 150, math.nan, 0.5), "kl": np.where(t >= 151, math.nan, 0.01)}
    assert {"nonfinite"} == _rules(overflow) & {"nonfinite", "kl_term_nonfinite"}
    # Nothing logged beside the KL at that step: nothing to tell the KL term from the rest.
    bare = {"reward": base["reward"], "kl": kl_first["kl"], "grad_norm": kl_first["grad_norm"]}
    assert {"nonfinite"} == _rules(bare) & {"nonfinite", "kl_term_nonfinite"}


def _sawtooth(period: int, onset: int, *, floor: float = 0.001, amplitude: float = 0.02, seed: int = 0) -> np.ndarray:
    """A rollout/trainer discrepancy of a rollout synced every ``period`` steps from ``onset``:
    at its floor right after each sync, climbing until the next (OpenRLHF's train/vllm_kl)."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    since_sync = np.where(t >= onset, (t - onset) % period, 0)
    return floor * (1 + rng.normal(0, 0.05, N)) + amplitude * since_sync / period


@pytest.mark.parametrize(("period", "onset"), [(4, 0), (8, 100), (12, 40)])
def test_a_discrepancy_back_at_its_floor_every_n_steps_is_a_periodic_sync(period, onset):
    from moeproxy.signatures.levels import sync_period

    v = _sawtooth(period, onset)
    found = sync_period(v)
    assert found is not None and found.period == period
    assert found.first >= onset and found.returns >= (N - onset) // period - 1
    run = _run({"train/reward": 0.3 + 0.3 * np.arange(N) / N, "train/vllm_kl": v}, "openrlhf")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "sync_sawtooth"]
    assert finding.supports == ("stale_weight_sync",) and finding.value == period
    assert f"every {period} steps" in finding.text and finding.source_name == "train/vllm_kl"


def test_a_discrepancy_with_spikes_at_random_steps_or_at_rounding_level_is_no_sync():
    from moeproxy.signatures.levels import floor_returns, sync_period

    rng = np.random.default_rng(3)
    spiky = 0.001 * (1 + rng.normal(0, 0.05, N))
    spiky[rng.choice(N, 20, replace=False)] *= 10  # heavy-tailed kernel noise: returns at random steps
    assert len(floor_returns(spiky)) >= 10 and sync_period(spiky) is None
    # The same saw-tooth at float32 rounding's size (1e-7) is batching, not a stale copy.
    assert sync_period(_sawtooth(4, 0, floor=1e-8, amplitude=1e-7)) is None
    assert sync_period(np.zeros(N)) is None  # an engine whose rollout equals its trainer
    assert sync_period(np.full(N, 0.003)) is None
    # A jump to a new level (a precision fault) returns to no floor.
    assert sync_period(np.where(np.arange(N) >= 100, 0.02, 0.003) * (1 + rng.normal(0, 0.05, N))) is None


def test_the_sync_period_is_given_in_steps_when_the_run_logs_every_other_step():
    v = _sawtooth(8, 0)[::2]  # logged every 2nd step: the saw-tooth is 4 points long
    steps = [{"step": 2 * k, "values": {"train/vllm_kl": float(x), "train/reward": 0.3}} for k, x in enumerate(v)]
    run = canonicalise(RunMetrics.from_steps(steps, framework="openrlhf"))
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "sync_sawtooth"]
    assert finding.value == 8 and "every 8 steps" in finding.text


def _on_policy_kl(seed: int = 0, *, spikes: int = 0, factor: float = 1000.0) -> np.ndarray:
    """OpenRLHF's train/ppo_kl of a small-batch on-policy run: ~0.0025 with heavy noise from step 0,
    and ``spikes`` isolated steps where the new and old log-probs disagree by orders of magnitude."""
    rng = np.random.default_rng(seed)
    v = 0.0025 * rng.lognormal(0.0, 0.6, N)
    v[rng.choice(np.arange(10, N - 10), spikes, replace=False)] *= factor
    return v


def _openrlhf(ppo_kl: np.ndarray) -> set[str]:
    t = np.arange(N)
    return _rules({"train/reward": 0.3 + 0.3 * t / N, "train/ppo_kl": ppo_kl}, "openrlhf")


def test_the_per_update_kl_spiking_by_orders_of_magnitude_on_isolated_steps_is_kernel_noise():
    run = _run({"train/reward": 0.3 + 0.3 * np.arange(N) / N, "train/ppo_kl": _on_policy_kl(spikes=8)}, "openrlhf")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "ratio_spikes"]
    assert finding.supports == ("operator_numeric_noise",) and finding.value == 8
    assert finding.source_name == "train/ppo_kl" and "on 8 steps" in finding.text
    assert finding.source == "ratio-spikes" and "operator_numeric_noise" not in finding.against


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_per_update_kl_a_few_spikes_or_a_policy_that_moves_is_no_kernel_noise(seed):
    from moeproxy.signatures.levels import SPIKE_MIN

    t = np.arange(N)
    assert "ratio_spikes" not in _openrlhf(_on_policy_kl(seed))  # noisy, heavy-ish tailed, no spike
    assert "ratio_spikes" not in _openrlhf(_on_policy_kl(seed, spikes=SPIKE_MIN - 1))  # a bad batch or two
    assert "ratio_spikes" not in _openrlhf(_on_policy_kl(seed, spikes=8, factor=20.0))  # within the noise
    # An LR change at step 100 (a level shift) and a policy running away (growth) move the neighbours too.
    assert "ratio_spikes" not in _openrlhf(_on_policy_kl(seed) * np.where(t >= 100, 300.0, 1.0))
    assert "ratio_spikes" not in _openrlhf(_on_policy_kl(seed) * np.exp(np.maximum(0, t - 100) * 0.08))
    # A run that stopped updating logs 0 around its last blips: nothing to compare them with.
    stopped = np.where(t >= 50, 0.0, _on_policy_kl(seed))
    stopped[[80, 100, 120, 140, 160, 180]] = 0.01
    assert "ratio_spikes" not in _openrlhf(stopped)


def test_the_neighbour_median_matches_the_naive_one():
    from moeproxy.signatures.levels import neighbour_median

    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 11, 40):
        v = rng.lognormal(0, 1, n)
        naive = [np.median(np.r_[v[max(0, i - 5):i], v[i + 1:i + 6]]) if n > 1 else np.nan for i in range(n)]
        np.testing.assert_allclose(neighbour_median(v), naive, rtol=0, atol=0)
    assert neighbour_median(np.zeros(0)).size == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_the_shipped_library_names_kernel_noise_on_a_learning_run_whose_per_update_kl_spikes(seed):
    """OpenRLHF issue 931's run: training improves, the per-update KL spikes at random steps."""
    from moeproxy.signatures.fingerprint import load_library
    from moeproxy.signatures.matching import triage

    rng = np.random.default_rng(seed)
    t = np.arange(N)
    cols = {"train/reward": 0.3 + 0.3 * (1 - np.exp(-t / 60)) + rng.normal(0, 0.02, N),
            "train/entropy_loss": 0.6 - 0.1 * t / N + rng.normal(0, 0.01, N),
            "train/kl": 0.001 + 0.02 * t / N + np.abs(rng.normal(0, 0.001, N)),
            "train/actor_grad_norm": 0.5 + rng.normal(0, 0.05, N),
            "train/response_length": 600 + 100 * t / N + rng.normal(0, 10, N), "train/actor_lr": np.full(N, 5e-7)}
    lib = load_library()
    tops = {}
    for spikes in (0, 8):
        v = _on_policy_kl(seed, spikes=spikes)
        steps = [{"step": k, "values": {**{m: float(x[k]) for m, x in cols.items()}, "train/ppo_kl": float(v[k])}}
                 for k in range(N)]
        tops[spikes] = triage(RunMetrics.from_steps(steps, framework="openrlhf"), lib, framework="openrlhf").candidates
    assert tops[0][0].fault_class == "healthy"
    assert tops[8][0].fault_class == "operator_numeric_noise"
    assert any("on 8 steps" in line for line in tops[8][0].evidence)


def test_a_signed_k1_discrepancy_is_read_by_its_size():
    """OpenRLHF's vllm_kl is mean(rollout - old log-prob): its sign changes from step to step, so
    the saw-tooth's floor is 0 (a fresh sync), not its most negative values."""
    rng = np.random.default_rng(5)
    signed = _sawtooth(6, 0, floor=1e-4, amplitude=0.004) * rng.choice([-1.0, 1.0], N)
    run = _run({"train/reward": 0.3 + 0.3 * np.arange(N) / N, "train/vllm_kl": signed}, "openrlhf")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "sync_sawtooth"]
    assert finding.value == 6 and finding.supports == ("stale_weight_sync",)


def _exact_sync_k1(period: int, seed: int, *, syncs: bool = True, at_sync: float = 1e-9) -> np.ndarray:
    """A signed k1 discrepancy of a rollout engine that is an exact copy at each sync: rounding
    (1e-9) at a sync, then an estimate whose size grows with the steps since it and whose noise
    crosses 0 now and then (OpenRLHF's vllm_kl of an engine without a precision gap)."""
    rng = np.random.default_rng(seed)
    since = np.arange(N) % period if syncs else np.ones(N, dtype=np.int64)
    v = 0.0005 * since / period + since / period * rng.normal(0.0, 0.001, N)
    v[since == 0] = at_sync * rng.choice([-1.0, 1.0], int((since == 0).sum()))
    if not syncs:
        v[rng.choice(N, 40, replace=False)] = 1e-9  # rounding at random steps: no period
    return v


@pytest.mark.parametrize("seed", range(6))
def test_an_exact_sync_is_found_though_the_estimate_passes_near_0_between_syncs(seed):
    """Between syncs a signed estimate read by its size comes within 1e-5 of 0 far more often than
    a linear band over a 1e-9 to 3e-3 range can tell from a sync; on a log scale a sync's 1e-9 and
    those passes are decades apart."""
    from moeproxy.signatures.levels import SYNC_FLOOR_BAND, sync_period

    v = _exact_sync_k1(6, seed)
    size = np.abs(v)
    top = np.quantile(size, 0.9)
    between = size[np.arange(N) % 6 != 0]
    assert (between <= SYNC_FLOOR_BAND * top).sum() >= 10  # what a linear band would count as syncs
    found = sync_period(size)
    assert found is not None and found.period == 6 and found.first <= 6
    run = _run({"train/reward": 0.3 + 0.3 * np.arange(N) / N, "train/vllm_kl": v}, "openrlhf")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "sync_sawtooth"]
    assert finding.value == 6 and finding.supports == ("stale_weight_sync",)
    # Rounding at random steps of the same run is no sync.
    assert sync_period(np.abs(_exact_sync_k1(6, seed, syncs=False))) is None
    # A sync that resets the estimate to exactly 0.0: the smallest value above 0 stands for the floor.
    zero = sync_period(np.abs(_exact_sync_k1(6, seed, at_sync=0.0)))
    assert zero is not None and zero.period == 6


def _agreement(level: np.ndarray, seed: int = 0) -> set[str]:
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    return _rules({"critic/score/mean": 0.3 + 0.3 * t / N, "moe/routing_agreement": level + rng.normal(0, 0.004, N)},
                  "verl")


def test_a_routing_agreement_held_below_r3s_level_is_a_routing_mismatch():
    from moeproxy.signatures.levels import ROUTING_AGREEMENT_PROBLEM

    t = np.arange(N)
    assert "routing_agreement_level" in _agreement(np.full(N, 0.7))  # from step 0
    assert "routing_agreement_level" in _agreement(np.where(t >= 80, 0.8, 1.0))  # a late drop that holds
    run = _run({"critic/score/mean": 0.3 + 0.3 * t / N, "moe/routing_agreement": np.where(t >= 80, 0.8, 1.0)}, "verl")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "routing_agreement_level"]
    assert finding.supports == ("routing_mismatch",) and finding.source == "r3-routing"
    assert finding.threshold == ROUTING_AGREEMENT_PROBLEM and "from step 81" in finding.text


@pytest.mark.parametrize("name", ["same-engine", "kernel-error", "stale-copy"])
def test_an_agreement_near_1_or_one_that_falls_step_after_step_is_no_routing_mismatch(name):
    t = np.arange(N)
    level = {"same-engine": np.ones(N),
             "kernel-error": np.full(N, 0.95),  # campaign v2's attention-kernel fault: 0.93-0.98
             # a rollout copy that stops being synced drifts away as the trainer moves (0.99 -> 0.76)
             "stale-copy": 0.99 - 0.23 * t / (N - 1)}[name]
    assert "routing_agreement_level" not in _agreement(level)


def test_a_negative_kl_coefficient_in_the_config_or_the_log_is_a_kl_misconfiguration():
    from moeproxy.signatures.settings import RunSettings

    t = np.arange(N)
    cols = _healthy_trl()
    run = RunMetrics.from_steps([{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}}
                                 for k in range(N)], framework="trl")
    [finding] = [f for f in whole_run_evidence(canonicalise(run, settings=RunSettings(kl_coef=-0.04)))
                 if f.rule == "kl_coef_negative"]
    assert finding.supports == ("kl_misconfiguration",) and finding.value == -0.04 and finding.source == "kl-penalty"
    assert "config" in finding.text
    for coef in (None, 0.0, 0.04):
        assert "kl_coef_negative" not in {f.rule for f in whole_run_evidence(canonicalise(run, settings=RunSettings(
            kl_coef=coef)))}
    # verl logs the coefficient as actor/kl_coef: a sign flip at step 120 is no schedule either.
    logged = _rules({"critic/score/mean": 0.3 + 0.3 * t / N, "actor/kl_coef": np.where(t >= 120, -0.001, 0.001)},
                    "verl")
    assert "kl_coef_negative" in logged
    assert "kl_coef_negative" not in _rules({"critic/score/mean": 0.3 + 0.3 * t / N, "actor/kl_coef": np.full(N, 0.001)},
                                            "verl")


def test_a_kl_coefficient_far_above_every_recipe_is_a_kl_misconfiguration():
    """beta 10 (trl_runs_14): 100x the largest recipe's 0.1 holds the policy at its reference. The
    recipes' own values (0.001 to 0.1), and half the bar, are no finding."""
    from moeproxy.signatures.settings import settings_from_config

    t = np.arange(N)
    cols = _healthy_trl()
    run = RunMetrics.from_steps([{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}}
                                 for k in range(N)], framework="trl")

    def found(config, of=run):
        return [f for f in whole_run_evidence(canonicalise(of, settings=settings_from_config(config)))
                if f.rule == "kl_coef_level"]

    [finding] = found({"training_args": {"beta": 10.0}})
    assert finding.supports == ("kl_misconfiguration",) and finding.value == 10.0 and "config" in finding.text
    assert found({"training_args": {"beta": 1.0}})
    assert not any(found(c) for c in (None, *({"training_args": {"beta": b}} for b in (0.0, 0.001, 0.04, 0.1, 0.5,
                                                                                        -10.0))))
    # verl's loss term far too heavy beside a recipe's reward penalty: the heavier one is read.
    assert found({"actor": {"kl_loss_coef": 5.0}, "algorithm": {"kl_ctrl": {"kl_coef": 0.001}}})
    # beta is also a preference loss's temperature (SimPO: 2 to 10): a run that logs no KL has no KL term.
    no_kl = RunMetrics.from_steps([{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items() if m != "kl"}}
                                   for k in range(N)], framework="trl")
    assert not found({"training_args": {"beta": 10.0}}, no_kl)
    # verl logs its kl_loss_coef as actor/kl_coef: read by the largest value it logs.
    logged = {"critic/score/mean": 0.3 + 0.3 * t / N, "actor/kl_loss": 0.001 + 0.01 * t / N,
              "actor/kl_coef": np.where(t < 120, 0.05, 2.0)}
    assert "kl_coef_level" in _rules(logged, "verl")
    assert "kl_coef_level" not in _rules({**logged, "actor/kl_coef": np.full(N, 0.05)}, "verl")


def test_a_kl_of_exactly_0_is_a_policy_that_never_moved_only_where_the_config_computes_one():
    """TRL logs kl only when beta != 0; an LR of 0 (SPEC: 'LR 0 at first step') leaves it at exactly 0.
    Without a stated coefficient an all-0 KL may be a term that is not computed, and says nothing."""
    from moeproxy.signatures.settings import RunSettings

    cols = {**_healthy_trl(), "kl": np.zeros(N), "learning_rate": np.zeros(N)}
    run = RunMetrics.from_steps([{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}}
                                 for k in range(N)], framework="trl")

    def rules(settings):
        return {f.rule for f in whole_run_evidence(canonicalise(run, settings=settings))}

    assert "kl_never_moves" in rules(RunSettings(kl_coef=0.04))
    assert "kl_never_moves" not in rules(RunSettings()) | rules(RunSettings(kl_coef=0.0))


def _still_kl_run(update_ratio: np.ndarray | None, kl: np.ndarray | None = None):
    """A TRL run whose config states beta 0.04 and whose KL is exactly 0 at every step (or ``kl``),
    with the weight probe's mean update per step where given."""
    from moeproxy.signatures.settings import RunSettings

    cols = {**_healthy_trl(), "kl": np.zeros(N) if kl is None else kl}
    if update_ratio is not None:
        cols["moeproxy/update_ratio"] = update_ratio
    run = RunMetrics.from_steps([{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}}
                                 for k in range(N)], framework="trl")
    return canonicalise(run, settings=RunSettings(kl_coef=0.04))


def test_a_kl_that_stays_still_while_the_probe_sees_the_weights_move_is_a_kl_fault():
    """A reference synced to the policy every step (trl_runs_13): the updates land, the KL to the
    reference stays at 0. The probe's figures turn 'no update reached the policy' into 'the KL term
    does not measure the policy against a fixed reference', and count against an omitted update."""
    from moeproxy.signatures.matching import WEIGHTS

    moving = np.full(N, 1e-5)
    moving[0] = 0.0  # a warm-up's first step at LR 0 moves nothing: one step is not the run
    [finding] = [f for f in whole_run_evidence(_still_kl_run(moving)) if f.rule.startswith("kl_")]
    assert finding.rule == "kl_still_while_weights_move" and finding.supports == ("kl_misconfiguration",)
    assert set(finding.against) == {"healthy", "actor_update_omission"}
    assert WEIGHTS.finding_weights[finding.rule] < WEIGHTS.definitional_weight  # not strong by itself
    # Without the probe, or where it saw the updates not land, the same KL is a policy that never moved.
    for probe in (None, np.zeros(N), np.where(np.arange(N) % 2 == 0, 1e-5, 0.0)):
        rules = {f.rule for f in whole_run_evidence(_still_kl_run(probe))}
        assert "kl_never_moves" in rules and "kl_still_while_weights_move" not in rules


def test_a_kl_that_moves_is_neither_kl_finding_whatever_the_probe_says():
    probe = np.full(N, 1e-5)
    assert "kl_still_while_weights_move" in {f.rule for f in whole_run_evidence(_still_kl_run(probe))}
    moving = _still_kl_run(probe, kl=1e-4 * np.arange(1, N + 1))
    assert not {f.rule for f in whole_run_evidence(moving)} & {"kl_never_moves", "kl_still_while_weights_move"}


def test_a_discrepancy_that_keeps_growing_past_verls_level_is_no_precision_fault():
    """A lower-precision rollout shifts the discrepancy once and holds it; one that keeps growing
    past 0.01 is a copy falling behind, or a routing or kernel error the training makes worse."""
    t = np.arange(N)
    reward = 0.3 + 0.3 * t / N
    grows = np.where(t < 100, 0.003, 0.012 + 0.0008 * (t - 100))  # 0.012 -> 0.09
    shifted = np.where(t < 100, 0.003, 0.03)  # a precision fault's shift
    run = _run({"critic/score/mean": reward, "training/rollout_probs_diff_mean": grows}, "verl")
    [finding] = [f for f in whole_run_evidence(run) if f.rule == "mismatch_grows"]
    assert finding.supports == () and finding.against == ("healthy", "rollout_logp_precision")
    assert finding.value >= 2.0 and "from step 101" in finding.text and finding.source == "mismatch-growth"
    for flat in (shifted, np.full(N, 0.003), 0.003 * np.exp(t / 40.0) / np.exp(N / 40.0)):  # below 0.01 until the end
        assert "mismatch_grows" not in _rules({"critic/score/mean": reward, "training/rollout_probs_diff_mean": flat},
                                              "verl")


def _kl_stepping_at(at: int, factor: float, seed: int = 0) -> dict[str, np.ndarray]:
    """The healthy TRL run with its KL stepped up ``factor``x from index ``at`` on (and holding)."""
    base = _healthy_trl(seed)
    kl = base["kl"].copy()
    kl[at:] *= factor
    return {**base, "kl": kl}


def _jumps(cols) -> list:
    return [f for f in whole_run_evidence(_run(cols)) if f.rule == "kl_step_jump"]


@pytest.mark.parametrize("seed", range(3))
def test_a_kl_that_steps_up_mid_run_with_nothing_moving_it_is_a_router_damaged(seed):
    (found,) = _jumps(_kl_stepping_at(100, 60.0, seed))
    assert found.supports == ("router_corruption",) and found.against == ("healthy",)
    # Index 100 is logged step 101; ten-step medians place the step within half a window of it.
    step = int(found.text.split(" at step ")[1].split()[0])
    assert found.value >= 30.0 and 96 <= step <= 101
    assert _jumps(_kl_stepping_at(100, 10.0, seed)) == []  # a step a learning run's KL can take


def test_a_kl_step_the_optimizer_explains_is_not_a_damaged_router():
    stepped = _kl_stepping_at(100, 60.0)
    lr = stepped["learning_rate"].copy()
    lr[100:] *= 100  # a schedule raised mid-run (a resumed run's LR override)
    assert _jumps({**stepped, "learning_rate": lr}) == []
    grad = stepped["grad_norm"].copy()
    grad[99] = 50.0  # one huge update just before
    assert _jumps({**stepped, "grad_norm": grad}) == []
    nan = stepped["grad_norm"].copy()
    nan[150] = math.nan
    assert _jumps({**stepped, "grad_norm": nan}) == []


def test_a_kl_growing_from_zero_at_the_start_or_stepping_between_round_off_values_is_no_jump():
    early = _healthy_trl()
    kl = early["kl"].copy()
    kl[:15] = 1e-6  # every healthy run's KL starts at 0 and grows by orders of magnitude first
    assert _jumps({**early, "kl": kl}) == []
    quiet = np.full(N, 1e-9)
    quiet[100:] = 1e-7  # no update: x100 between round-off values
    assert _jumps({**_healthy_trl(), "kl": quiet}) == []


def test_a_logged_lr_that_never_reaches_a_tenth_of_the_configured_one_is_an_update_omission():
    from dataclasses import replace

    from moeproxy.signatures.settings import RunSettings

    base = _healthy_trl()  # warm-up to 1e-6, then decay
    endless = {**base, "learning_rate": 1e-6 * np.arange(1, N + 1) / (100 * N)}  # a warm-up 100x the run

    def found(cols, lr):
        run = replace(_run(cols), settings=RunSettings(learning_rate=lr))
        return [f for f in whole_run_evidence(run) if f.rule == "lr_never_reached"]

    (f,) = found(endless, 1e-6)
    assert f.supports == ("actor_update_omission",) and f.source == "config-lr" and "1.0%" in f.text
    assert found(base, 1e-6) == []  # a warm-up that ends reaches the configured LR
    assert found(endless, None) == []  # without the config a rising LR is a warm-up
    assert found({**base, "learning_rate": np.zeros(N)}, 0.0) == []  # an LR of 0 configured: nothing to miss


@pytest.mark.parametrize("seed", range(4))
def test_the_kl_steps_vectorised_search_finds_what_a_plain_loop_finds(seed):
    """levels._kl_step_jump takes ten-step medians in one pass; a loop over every step, median by
    median, must find the same largest step and ratio."""
    from moeproxy.signatures.levels import KL_JUMP, KL_JUMP_FLOOR, KL_JUMP_SKIP, KL_JUMP_STEPS

    rng = np.random.default_rng(seed)
    cols = _kl_stepping_at(int(rng.integers(40, 160)), float(rng.uniform(35, 300)), seed)
    cols["kl"] = cols["kl"] * rng.lognormal(0, 0.5, N)  # a noisier KL than the healthy one
    (found,) = _jumps(cols)
    v, best = cols["kl"], None
    for i in range(max(KL_JUMP_STEPS, KL_JUMP_SKIP), N - KL_JUMP_STEPS + 1):
        before, after = np.median(v[i - KL_JUMP_STEPS:i]), np.median(v[i:i + KL_JUMP_STEPS])
        if after / before >= KL_JUMP and after >= KL_JUMP_FLOOR and (best is None or after / before > best[0]):
            best = (after / before, i)
    assert best is not None and found.value == pytest.approx(best[0], rel=1e-12)
    assert f" at step {best[1] + 1} " in found.text  # index i is logged step i + 1


def _balance(seed: int = 0, rise: float = 0.0, at: int = 100, fall: float = 0.008) -> np.ndarray:
    """TRL's aux_loss as a real healthy run logs it: ~4.05 (top-k 4), step noise 0.02, drifting
    ``fall`` down over the run as the balance term evens the routers; plus a step of ``rise`` at ``at``."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    return 4.05 - fall * t / N + rng.normal(0, 0.02, N) + np.where(t >= at, rise, 0.0)


def _balance_findings(cols) -> list:
    return [f for f in whole_run_evidence(_run(cols)) if f.rule == "balance_loss_rises"]


@pytest.mark.parametrize("seed", range(5))
def test_a_load_balancing_loss_that_ends_higher_is_the_router(seed):
    base = _healthy_trl(seed)
    assert not _balance_findings({**base, "aux_loss": _balance(seed)})  # level or slowly falling: healthy
    (found,) = _balance_findings({**base, "aux_loss": _balance(seed, rise=0.04)})
    assert found.supports == ("router_corruption",) and found.source_name == "aux_loss"
    assert found.value == pytest.approx(0.04 / 4.05, rel=0.35) and "above where it started" in found.text
    assert found.source in SOURCES


@pytest.mark.parametrize("seed", range(5))
def test_a_balance_rise_inside_the_noise_or_under_half_a_percent_is_nothing(seed):
    base = _healthy_trl(seed)
    # 0.4% of the level: more noise widths than the 4 needed on a quiet trace, but under 0.5%.
    quiet = 4.05 + np.random.default_rng(seed).normal(0, 0.002, N) + np.where(np.arange(N) >= 100, 0.016, 0.0)
    assert not _balance_findings({**base, "aux_loss": quiet})
    # A noiseless trace (a value repeated at every update): the level alone decides, and says so.
    steps_only = 4.05 + np.where(np.arange(N) >= 100, 0.04, 0.0)
    (found,) = _balance_findings({**base, "aux_loss": steps_only})
    assert "no step-to-step noise" in found.text
    # 1% of the level on a trace whose step noise is 0.2: well inside four widths.
    noisy = 4.05 + np.random.default_rng(seed).normal(0, 0.2, N) + np.where(np.arange(N) >= 100, 0.04, 0.0)
    assert not _balance_findings({**base, "aux_loss": noisy})


def test_a_balance_rise_the_lr_explains_is_not_the_router():
    base = _healthy_trl()
    raised = {**base, "aux_loss": _balance(rise=0.04),
              "learning_rate": np.where(np.arange(N) >= 100, 100.0, 1.0) * base["learning_rate"]}
    assert not _balance_findings(raised)  # a schedule raised x100 from halfway
    far = {**base, "aux_loss": _balance(rise=0.04), "learning_rate": base["learning_rate"] * 300}
    assert "lr_level" in _rules(far) and not _balance_findings(far)
    broken = {**base, "aux_loss": _balance(rise=0.04), "grad_norm": np.where(np.arange(N) == 150, np.nan, 0.5)}
    assert not _balance_findings(broken)
    # A decay or a warm-up does not raise it: the healthy schedule keeps the finding.
    assert _balance_findings({**base, "aux_loss": _balance(rise=0.04)})


def _probed(update_min: np.ndarray, **cols) -> dict[str, np.ndarray]:
    """A healthy TRL run sent through MoeproxyCallback: its weight probe's metrics beside TRL's."""
    base = _healthy_trl()
    return {**base, "moeproxy/update_ratio": np.maximum(update_min, 1e-5), "moeproxy/update_ratio_min": update_min,
            "moeproxy/outside_change": np.zeros(N), **cols}


def test_optimizer_steps_that_change_nothing_are_an_omitted_update():
    moving = np.full(N, 2e-4)
    assert not {"update_not_applied", "router_changed_outside_optimizer"} & _rules(_probed(moving))
    dropped = np.where(np.arange(N) >= N // 2, 0.0, 2e-4)  # every update from halfway, norm normal
    (found,) = [f for f in whole_run_evidence(_run(_probed(dropped))) if f.rule == "update_not_applied"]
    lr = _healthy_trl()["learning_rate"]  # TRL's linear decay: its last tenth of the way does not count
    assert found.supports == ("actor_update_omission",) and found.value == ((dropped == 0) & (lr >= 0.1 * lr.max())).sum()
    assert f"first at step {N // 2 + 1}" in found.text
    every_other = np.where(np.arange(N) % 2 == 1, 0.0, 2e-4)
    assert "update_not_applied" in _rules(_probed(every_other))
    two = moving.copy()
    two[[40, 90]] = 0.0  # two steps are not enough: a warm-up's first step runs at LR 0
    assert "update_not_applied" not in _rules(_probed(two))
    # No gradient, or an LR of 0: nothing was asked of the optimizer (grad_norm_zero, lr_never_reached).
    assert "update_not_applied" not in _rules(_probed(dropped, grad_norm=np.where(dropped == 0, 0.0, 0.5)))
    base_lr = _healthy_trl()["learning_rate"]
    assert "update_not_applied" not in _rules(_probed(dropped, learning_rate=np.where(dropped == 0, 0.0, base_lr)))
    nan = np.where(dropped == 0, np.nan, 0.5)  # a non-finite norm: an overflow's skip, not this
    assert "update_not_applied" not in _rules(_probed(dropped, grad_norm=nan))
    # A schedule decayed to under a tenth of its peak: bf16 weights round such updates away by design.
    tail = np.where(base_lr < 0.1 * base_lr.max(), 0.0, 2e-4)
    assert tail.sum() < 2e-4 * N and "update_not_applied" not in _rules(_probed(tail))


def test_routers_written_between_optimizer_steps_are_router_corruption():
    quiet = _probed(np.full(N, 2e-4), **{"moeproxy/router_outside_change": np.full(N, 0.0)})
    assert "router_changed_outside_optimizer" not in _rules(quiet)
    rounding = np.full(N, 0.0)
    rounding[50] = 1e-7  # float32 round-off
    assert "router_changed_outside_optimizer" not in _rules({**quiet, "moeproxy/router_outside_change": rounding})
    downcast = np.where(np.arange(N) >= 100, 1.5e-3, 0.0)  # a bf16 round trip before every step from 100
    diluted = downcast / 27  # all the sampled weights moved less, as in trl_runs_12's down-cast
    (found,) = [f for f in whole_run_evidence(_run({**quiet, "moeproxy/router_outside_change": downcast,
                                                    "moeproxy/outside_change": diluted}))
                if f.rule == "router_changed_outside_optimizer"]
    assert found.supports == ("router_corruption",) and "from step 101" in found.text
    assert f"on {N - 100} logged steps" in found.text
    # The whole model written at once (a cast of the policy in place, a reload): not router damage.
    whole = {**quiet, "moeproxy/router_outside_change": downcast, "moeproxy/outside_change": downcast * 0.8}
    assert "router_changed_outside_optimizer" not in _rules(whole)
