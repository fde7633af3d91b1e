import numpy as np
import pytest
from moeproxy.signatures.calibrate import LabelledRun, calibrate
from moeproxy.signatures.matching import triage
from moeproxy.signatures.synthetic import synthetic_run

from .conftest import CLASSES

# Held out: seeds, onsets, magnitudes, lengths and scale not used to build the library.
HELDOUT = {"steps": 64, "onset": 23, "magnitude": 1.4, "scale": 3.0}


@pytest.mark.parametrize("fault_class", CLASSES)
def test_injected_class_ranks_first_on_heldout_traces(synthetic_library, fault_class):
    for seed in (200, 201):
        result = triage(synthetic_run(fault_class, seed=seed, **HELDOUT), synthetic_library)
        assert result.candidates[0].fault_class == fault_class, result.to_dict()


def test_triage_object_has_the_spec_shape(synthetic_library):
    result = triage(synthetic_run("rollout_logp_precision", seed=5, **HELDOUT), synthetic_library, run_id=7)
    d = result.to_dict()
    assert set(d) == {"run_id", "evaluated_at", "candidates", "verdict", "siblings"}
    assert d["run_id"] == 7
    assert {c["fault_class"] for c in d["candidates"]} == set(CLASSES)  # healthy included
    scores = [c["score"] for c in d["candidates"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    for c in d["candidates"]:
        assert set(c) == {"fault_class", "family", "score", "strength", "evidence"}
        assert c["strength"] in ("strong", "weak") and c["evidence"]
    top = d["candidates"][0]
    assert any("training/rollout_probs_diff_mean jumped" in e and "at step 23" in e for e in top["evidence"])
    assert any("matches rollout_logp_precision in direction" in e for e in top["evidence"])
    assert "rollout_logp_precision" in d["verdict"]
    detailed = result.to_dict(details=True)
    assert detailed["change_points"]["training/rollout_probs_diff_mean"] == 23
    assert detailed["candidates"][0]["fingerprint_id"].startswith("rollout_logp_precision/")


def test_nonfinite_grad_norm_is_evidence(synthetic_library):
    result = triage(synthetic_run("gradient_overflow", seed=9, **HELDOUT), synthetic_library)
    top = result.candidates[0]
    assert top.fault_class == "gradient_overflow"
    assert any(e.startswith("actor/grad_norm non-finite from step 23") for e in top.evidence)
    healthy = next(c for c in result.candidates if c.fault_class == "healthy")
    assert healthy.score < top.score


def test_partial_run_is_diagnosed_online(synthetic_library):
    run = synthetic_run("stale_weight_sync", seed=11, **HELDOUT)
    ranks = []
    for last in (30, 40, 63):
        result = triage(run.truncated(last), synthetic_library)
        ranks.append([c.fault_class for c in result.candidates].index("stale_weight_sync"))
    assert ranks[-1] == 0 and all(r < 3 for r in ranks)
    early = triage(run.truncated(18), synthetic_library)  # before the onset: nothing to see yet
    assert early.candidates[0].fault_class == "healthy"


def test_run_logging_only_some_metrics_still_matches(synthetic_library):
    keep = ("critic/score/mean", "training/rollout_probs_diff_mean", "rollout_corr/kl", "actor/pg_clipfrac")
    result = triage(synthetic_run("rollout_logp_precision", seed=12, metrics=keep, **HELDOUT), synthetic_library)
    assert result.candidates[0].fault_class == "rollout_logp_precision"


def test_trl_names_are_matched_through_aliases(synthetic_library):
    from moeproxy.signatures.canonical import RunMetrics

    verl = synthetic_run("lr_misconfiguration", seed=13, **HELDOUT)
    rename = {"actor/grad_norm": "grad_norm", "actor/kl_loss": "kl", "actor/entropy": "entropy",
              "critic/score/mean": "reward", "actor/lr": "learning_rate"}
    trl = RunMetrics({rename[k]: v for k, v in verl.series.items() if k in rename}, framework="trl")
    assert triage(trl, synthetic_library).candidates[0].fault_class == "lr_misconfiguration"


def test_calibrated_threshold_reports_a_left_out_class_as_weak(synthetic_library):
    cal_runs = [LabelledRun(c, synthetic_run(c, seed=s, steps=56, onset=19, magnitude=1.2))
                for c in CLASSES for s in (300, 301)]
    lib, report = calibrate(synthetic_library, cal_runs)
    assert 0 < lib.calibration.strong_threshold < 1 and report["balanced_accuracy"] > 0.8
    weak = []
    for c in CLASSES[1:]:
        result = triage(synthetic_run(c, seed=400, **HELDOUT), lib.without_class(c))
        weak.append(result.candidates[0].strength == "weak")
        own = triage(synthetic_run(c, seed=400, **HELDOUT), lib)
        assert own.candidates[0].fault_class == c
    assert np.mean(weak) >= 0.8


def test_expected_traces_are_placed_at_the_matched_onset_in_run_units(synthetic_library):
    from moeproxy.signatures.canonical import canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import expected_traces

    run = synthetic_run("rollout_logp_precision", seed=14, **HELDOUT)
    sig = run_signature(canonicalise(run))
    result = triage(sig, synthetic_library)
    top = result.candidates[0]
    shapes = expected_traces(sig, synthetic_library.get(top.fingerprint_id))
    shape = shapes["training/rollout_probs_diff_mean"]
    pre = synthetic_library.get(top.fingerprint_id).trace_pre
    assert shape["steps"][pre] == top.onset_step == 23
    observed = run.series["training/rollout_probs_diff_mean"].values
    # before the onset the expected shape sits at the run's own baseline, after it well above
    assert abs(np.median(shape["values"][:pre]) - np.median(observed[15:23])) < 3 * observed[:23].std()
    assert np.median(shape["values"][pre + 2:]) > 5 * np.median(observed[:23])


def test_cross_validated_calibration_needs_no_extra_runs():
    from moeproxy.signatures.build import TraceSet
    from moeproxy.signatures.calibrate import cross_validated_calibration

    sets = []
    for c in ("healthy", "stale_weight_sync", "lr_misconfiguration", "reward_fault"):
        runs = {s: synthetic_run(c, steps=40, onset=12, seed=s) for s in (0, 1)}
        twins = {} if c == "healthy" else {s: synthetic_run("healthy", steps=40, seed=s) for s in (0, 1)}
        sets.append(TraceSet(c, "v", {"onset": 12}, runs, twins, {}))
    cal, report = cross_validated_calibration(sets)
    assert 0 < cal.strong_threshold < 1 and cal.n_heldout == 8
    assert min(report["positives"]) > max(report["negatives"]) - 0.2
    assert "leave-one-seed-out" in cal.method


def test_a_metric_that_stops_moving_is_evidence_against_healthy(synthetic_library):
    """ppo_kl / pg_clipfrac stuck at exactly 0 once the optimizer stops stepping move no median
    when the healthy values are tiny; the freeze itself must count."""
    from moeproxy.signatures.canonical import MetricSeries, RunMetrics

    run = synthetic_run("healthy", seed=21, **HELDOUT)
    clip = run.series["actor/pg_clipfrac"]
    values = clip.values.copy()
    values[clip.steps >= HELDOUT["onset"]] = 0.0
    stuck = RunMetrics({**run.series, "actor/pg_clipfrac": MetricSeries(clip.steps, values)},
                       framework=run.framework)

    def scores(r):
        res = triage(r, synthetic_library)
        return {c.fault_class: c for c in res.candidates}

    plain, froze = scores(run), scores(stuck)
    assert froze["healthy"].score < plain["healthy"].score
    assert froze["actor_update_omission"].score > plain["actor_update_omission"].score
    assert any("healthy runs do not show the changes in actor/pg_clipfrac" in e for e in froze["healthy"].evidence)
    omission = froze["actor_update_omission"]
    assert any(e.startswith("actor/pg_clipfrac") and f"constant 0 from step {HELDOUT['onset']}" in e
               for e in omission.evidence), omission.evidence


def test_freeze_rate_is_learnt_from_the_fault_runs(synthetic_library):
    fp = next(f for f in synthetic_library.fingerprints if f.fault_class == "actor_update_omission")
    healthy = next(f for f in synthetic_library.fingerprints if f.fault_class == "healthy")
    assert fp.metrics["clip_frac"].freeze_rate == 1.0
    assert healthy.metrics["clip_frac"].freeze_rate == 0.0


def test_a_tiny_metric_that_freezes_without_a_shift_is_described_as_stopped():
    from moeproxy.signatures.canonical import RunMetrics, canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import describe_metric

    rng = np.random.default_rng(3)
    kl = np.abs(rng.normal(1e-6, 1e-6, size=40))
    kl[24:] = 0.0
    steps = [{"step": i, "values": {"actor/ppo_kl": float(kl[i])}} for i in range(40)]
    sig = run_signature(canonicalise(RunMetrics.from_steps(steps, framework="verl")))
    ms = sig.metrics["ppo_kl"]
    assert ms.frozen and ms.freeze_step == 24 and ms.freeze_value == 0.0
    text = describe_metric(ms)
    assert text is not None and "actor/ppo_kl" in text and "from step 24" in text


def test_a_shift_from_a_constant_baseline_is_described_by_its_levels_not_in_noise_units():
    from moeproxy.signatures.canonical import RunMetrics, canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import describe_metric

    rng = np.random.default_rng(4)
    clipped = np.where(np.arange(200) >= 120, 0.1 + np.abs(rng.normal(0, 0.01, 200)), 0.0)
    steps = [{"step": i + 1, "values": {"completions/clipped_ratio": float(clipped[i])}} for i in range(200)]
    ms = run_signature(canonicalise(RunMetrics.from_steps(steps, framework="trl"))).metrics["length_clip_ratio"]
    assert ms.direction == 1 and ms.flat_baseline
    text = describe_metric(ms)
    assert "from a constant 0 to 0.1" in text and "σ" not in text
    noisy = np.abs(rng.normal(0.02, 0.002, 200)) + np.where(np.arange(200) >= 120, 0.01, 0.0)
    steps = [{"step": i + 1, "values": {"completions/clipped_ratio": float(noisy[i])}} for i in range(200)]
    ms = run_signature(canonicalise(RunMetrics.from_steps(steps, framework="trl"))).metrics["length_clip_ratio"]
    assert ms.direction == 1 and not ms.flat_baseline and "baseline σ" in describe_metric(ms)


def test_a_change_only_some_proxy_runs_showed_costs_less_when_missed(synthetic_library):
    """A fingerprint metric whose direction 2 of 3 proxy seeds agreed on is a softer expectation
    than one all seeds agreed on: a run without that change loses less of its score."""
    from dataclasses import replace

    from moeproxy.signatures.canonical import canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import score_fingerprint

    fp = next(f for f in synthetic_library.fingerprints if f.fault_class == "rollout_logp_precision")
    name = next(m for m in fp.affected_metrics if fp.metrics[m].direction != 0)
    sure = replace(fp, metrics={**fp.metrics, name: replace(fp.metrics[name], agreement=1.0)})
    soft = replace(fp, metrics={**fp.metrics, name: replace(fp.metrics[name], agreement=2 / 3)})
    sig = run_signature(canonicalise(synthetic_run("healthy", seed=31, **HELDOUT)), synthetic_library.params)
    assert sig.metrics[name].direction == 0
    by = {m.metric: m for m in score_fingerprint(sig, soft, synthetic_library).matches}
    assert by[name].direction_score == pytest.approx(0.5)
    assert score_fingerprint(sig, soft, synthetic_library).score > score_fingerprint(sig, sure, synthetic_library).score


def test_a_setting_that_moves_is_not_compared_with_any_fingerprint(synthetic_library):
    """The learning rate is set, not learnt, and moves along schedules: no fingerprint score
    depends on it (a level from step 0 is the only setting evidence, levels.py ``lr_level``)."""
    from moeproxy.signatures.canonical import RunMetrics, canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import score_fingerprint
    from moeproxy.signatures.vocabulary import CONTROL_METRICS

    assert "lr" in CONTROL_METRICS
    run = synthetic_run("reward_fault", seed=41, **HELDOUT)
    lr_names = [n for n in run.series if canonicalise(RunMetrics({n: run.series[n]})).metrics.keys() == {"lr"}]
    assert lr_names
    without = RunMetrics({n: s for n, s in run.series.items() if n not in lr_names}, run.framework, run.name)
    sig = run_signature(canonicalise(run), synthetic_library.params)
    sig_without = run_signature(canonicalise(without), synthetic_library.params)
    for fp in synthetic_library.fingerprints:
        a = score_fingerprint(sig, fp, synthetic_library)
        b = score_fingerprint(sig_without, fp, synthetic_library)
        assert a.score == pytest.approx(b.score, abs=1e-9), fp.id
        assert "lr" not in {m.metric for m in a.matches}


def test_a_warm_up_and_linear_decay_are_not_evidence_at_triage(synthetic_library):
    """A healthy run whose logged LR warms up for a tenth of the run and then decays linearly to 0
    (TRL's and verl's usual schedules) is triaged exactly as the same run without an LR column."""
    from moeproxy.signatures.canonical import MetricSeries, RunMetrics, canonicalise

    run = synthetic_run("healthy", seed=43, **HELDOUT)
    lr_names = {n for n in run.series if canonicalise(RunMetrics({n: run.series[n]})).metrics.keys() == {"lr"}}
    without = RunMetrics({n: s for n, s in run.series.items() if n not in lr_names}, run.framework, run.name)
    steps = next(iter(without.series.values())).steps
    n = len(steps)
    t = np.arange(n)
    warm = max(1, n // 10)
    schedule = np.where(t < warm, 1e-6 * (t + 1) / warm, 1e-6 * (n - t) / (n - warm))
    with_lr = RunMetrics({**without.series, "actor/lr": MetricSeries(steps, schedule)}, run.framework, run.name)
    a, b = triage(with_lr, synthetic_library), triage(without, synthetic_library)
    assert "lr" in canonicalise(with_lr).metrics and not a.findings
    assert [c.fault_class for c in a.candidates] == [c.fault_class for c in b.candidates]
    assert [c.score for c in a.candidates] == pytest.approx([c.score for c in b.candidates], abs=1e-9)
