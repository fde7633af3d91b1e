"""Flat-only fingerprints (a fault that only takes its twins' drift away) and the finding that lets
them count: an update skipped from step 0 leaves a KL that never moves.

A lone run shows "no drift" as much when no update reaches the policy as when a healthy run
learns slowly, so such a fingerprint matches any quiet run at 1.00; it counts only beside a
whole-run finding for its class of at least ``Weights.flat_only_finding_weight``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from moeproxy.signatures.build import build_fingerprint
from moeproxy.signatures.canonical import RunMetrics, canonicalise
from moeproxy.signatures.features import run_signature
from moeproxy.signatures.fingerprint import MIN_SEPARATION, FingerprintLibrary
from moeproxy.signatures.levels import KL_STILL_ABS, whole_run_evidence
from moeproxy.signatures.matching import WEIGHTS, score_fingerprint, triage
from moeproxy.signatures.synthetic import synthetic_run

STEPS = 60
CLASS = "actor_update_omission"


def _arrays(run: RunMetrics) -> dict[str, np.ndarray]:
    return {name: np.asarray(s.values, dtype=np.float64).copy() for name, s in run.series.items()}


def _slow_healthy(seed: int) -> RunMetrics:
    """A healthy run that barely learns: reward and entropy only noise, the KL moving around its level."""
    arrays = _arrays(synthetic_run("healthy", steps=STEPS, seed=seed))
    rng = np.random.default_rng(500 + seed)
    arrays["critic/score/mean"] = 0.5 + 0.05 * rng.normal(size=STEPS)
    arrays["actor/entropy"] = 1.2 + 0.01 * rng.normal(size=STEPS)
    arrays["actor/kl_loss"] = 1e-3 + 1e-4 * rng.normal(size=STEPS)
    return RunMetrics.from_arrays(arrays, framework="verl", name=f"slow-{seed}")


def _no_update(seed: int) -> RunMetrics:
    """Every update skipped from step 0: reward noise, and a KL at fp32 round-off of zero."""
    arrays = _arrays(synthetic_run(CLASS, steps=STEPS, onset=0, seed=seed))
    rng = np.random.default_rng(900 + seed)
    arrays["actor/kl_loss"] = 1e-9 * rng.normal(size=STEPS)
    return RunMetrics.from_arrays(arrays, framework="verl", name=f"no-update-{seed}")


@pytest.fixture(scope="module")
def library() -> FingerprintLibrary:
    twins = [synthetic_run("healthy", steps=STEPS, seed=s) for s in range(3)]
    omission = build_fingerprint(CLASS, [_no_update(s) for s in range(3)], twins, params={"onset": 0},
                                 fingerprint_id=f"{CLASS}/onset=0")
    healthy = build_fingerprint("healthy", twins)
    return FingerprintLibrary((omission, healthy))


def test_the_no_update_fingerprint_is_flat_only_and_separates_from_its_twins(library):
    fp = library.get(f"{CLASS}/onset=0")
    assert fp.affected_metrics and all(fp.metrics[m].flat for m in fp.affected_metrics)
    assert fp.flat_only and fp.separable
    assert fp.separation is not None and fp.separation >= MIN_SEPARATION
    assert not any(f.flat_only for f in library.fingerprints if f.fault_class == "healthy")


def test_the_kl_of_a_run_without_updates_never_moves():
    rules = {f.rule for f in whole_run_evidence(canonicalise(_no_update(7)))}
    assert "kl_never_moves" in rules
    for run in (synthetic_run("healthy", steps=STEPS, seed=7), _slow_healthy(7)):
        assert "kl_never_moves" not in {f.rule for f in whole_run_evidence(canonicalise(run))}


def test_a_kl_logged_as_zero_throughout_is_not_a_policy_that_never_moved():
    arrays = _arrays(synthetic_run("healthy", steps=STEPS, seed=3))
    arrays["actor/kl_loss"] = np.zeros(STEPS)  # no KL term: the framework logs 0
    run = RunMetrics.from_arrays(arrays, framework="verl")
    assert "kl_never_moves" not in {f.rule for f in whole_run_evidence(canonicalise(run))}
    arrays["actor/kl_loss"] = np.full(STEPS, 10 * KL_STILL_ABS) + np.linspace(0, 2 * KL_STILL_ABS, STEPS)
    run = RunMetrics.from_arrays(arrays, framework="verl")
    assert "kl_never_moves" not in {f.rule for f in whole_run_evidence(canonicalise(run))}  # it moved


def test_a_slow_healthy_run_is_not_called_a_skipped_update(library):
    fp = library.get(f"{CLASS}/onset=0")
    for seed in (11, 12, 13):
        run = _slow_healthy(seed)
        # What it would add: the absence of drift is all the fingerprint expects, and all the run shows.
        assert score_fingerprint(run_signature(canonicalise(run)), fp).score > 0.9
        result = triage(run, library)
        omission = next(c for c in result.candidates if c.fault_class == CLASS)
        # No finding of weight for it (a reward that does not rise is a trend a slow run misses
        # too): the fingerprint adds nothing, only such weak findings move the class.
        assert omission.fingerprint_score in (None, pytest.approx(0.0))
        assert result.top.fault_class == "healthy"


def test_a_run_without_updates_is_named_beside_its_finding(library):
    for seed in (11, 12, 13):
        result = triage(_no_update(seed), library)
        assert result.top.fault_class == CLASS
        assert result.top.score > next(c.score for c in result.candidates if c.fault_class == "healthy")
        # Raise the weight a finding needs above the KL rule's: the fingerprint no longer counts.
        stricter = replace(WEIGHTS, flat_only_finding_weight=WEIGHTS.finding_weights["kl_never_moves"] + 1)
        alone = next(c for c in triage(_no_update(seed), library, weights=stricter).candidates
                     if c.fault_class == CLASS)
        assert alone.score < result.top.score
