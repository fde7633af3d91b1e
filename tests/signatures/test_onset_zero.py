"""Faults present from step 0 (issue 17): no change point to find, no clean baseline before it.

The library holds every synthetic class twice, injected at step 0 and at step 15 (3 seeds each,
with healthy twins), and a healthy fingerprint; held-out runs use other seeds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from moeproxy.signatures.build import build_fingerprint, signatures_of
from moeproxy.signatures.features import DEFAULT_PARAMS
from moeproxy.signatures.fingerprint import MIN_SEPARATION, FingerprintLibrary, library_from_dict
from moeproxy.signatures.matching import class_onset, score_fingerprint, triage
from moeproxy.signatures.siblings import DEFAULT_MARGIN
from moeproxy.signatures.synthetic import INJECTORS, synthetic_run

STEPS = 60
ONSETS = (0, 15)
SEEDS = (0, 1, 2)
HELD_OUT = (10, 11, 12)

#: One class per family whose onset-0 runs move something a run shows by itself.
BY_FAMILY = {
    "framework": "actor_update_omission",
    "numerical": "operator_numeric_noise",
    "routing": "routing_mismatch",
    "optimisation": "kl_misconfiguration",
}


def _fingerprint(fault_class: str, onset: int):
    runs = [synthetic_run(fault_class, steps=STEPS, onset=onset, seed=s) for s in SEEDS]
    twins = [synthetic_run("healthy", steps=STEPS, seed=s) for s in SEEDS]
    return build_fingerprint(fault_class, runs, twins, params={"onset": onset},
                             fingerprint_id=f"{fault_class}/onset={onset}", provenance={"source": "synthetic"})


@pytest.fixture(scope="module")
def library() -> FingerprintLibrary:
    fps = [_fingerprint(c, o) for c in INJECTORS for o in ONSETS]
    fps.append(build_fingerprint("healthy", [synthetic_run("healthy", steps=STEPS, seed=s) for s in SEEDS]))
    return FingerprintLibrary(tuple(fps))


def _found(result, fault_class: str) -> bool:
    """Named strong, first by a clear margin or in the close-sibling note of the top candidates
    (tied scores: which of two siblings sorts first is for one CPU's rounding to decide)."""
    top = result.candidates[0]
    if top.strength != "strong":
        return False
    if top.fault_class == fault_class and top.score - result.candidates[1].score > DEFAULT_MARGIN:
        return True
    return any(fault_class in note.classes and top.fault_class in note.classes for note in result.siblings)


@pytest.mark.parametrize("family", sorted(BY_FAMILY))
def test_an_onset_zero_fault_of_each_family_is_found(library, family):
    fault_class = BY_FAMILY[family]
    found = [_found(triage(synthetic_run(fault_class, steps=STEPS, onset=0, seed=s), library), fault_class)
             for s in HELD_OUT]
    assert sum(found) >= 2, found


def test_healthy_runs_are_not_named_as_faults_present_from_step_0(library):
    tops = [triage(synthetic_run("healthy", steps=STEPS, seed=s), library).top.fault_class for s in range(11, 20)]
    assert tops == ["healthy"] * len(tops)


def test_late_onsets_are_still_named(library):
    for fault_class in INJECTORS:
        hits = sum(triage(synthetic_run(fault_class, steps=STEPS, onset=25, seed=s), library).top.fault_class
                   == fault_class for s in HELD_OUT)
        assert hits >= 2, fault_class


def test_a_fingerprint_its_own_twins_match_adds_no_score(library):
    # A constant 11x on the rollout mismatch from step 0 moves nothing a run shows by itself.
    fp = library.get("rollout_logp_precision/onset=0")
    assert fp.separation is not None and fp.separation < MIN_SEPARATION and not fp.separable
    healthy = synthetic_run("healthy", steps=STEPS, seed=13)
    sig = signatures_of([healthy], DEFAULT_PARAMS)[0]
    assert score_fingerprint(sig, fp).score > 0.9  # what ranking with it would say of a healthy run
    scored = {c.fault_class: c for c in triage(healthy, library).candidates}
    only = FingerprintLibrary((fp, library.of_class("healthy")[0]))
    assert {c.fault_class: c.score for c in triage(healthy, only).candidates}["rollout_logp_precision"] == 0.0
    assert scored["healthy"].score > scored["rollout_logp_precision"].score
    # It expects nothing to differ from a quiet run (no affected metric at all), so even a measured
    # separation cannot make it evidence: a library whose twins happened to score lower (a
    # campaign's twins learn, a held-out healthy run need not) would rank it 1.00 on every quiet run.
    assert not any(e.affected for e in fp.metrics.values())
    forced = FingerprintLibrary((replace(fp, separation=1.0), library.of_class("healthy")[0]))
    assert not forced.fingerprints[0].separable
    assert {c.fault_class: c.score for c in triage(healthy, forced).candidates}["rollout_logp_precision"] == 0.0


def test_an_unmeasured_fingerprint_that_expects_nothing_to_move_is_not_separable(library):
    # Libraries built before separation was measured: the same onset-0 fingerprint, its separation
    # unknown, shows only settings and metrics that do not move as evidence.
    fp = replace(library.get("rollout_logp_precision/onset=0"), separation=None)
    assert all(e.flat for e in fp.metrics.values() if e.affected)
    assert not fp.separable
    late = replace(library.get("rollout_logp_precision/onset=15"), separation=None)
    assert any(e.affected and not e.flat for e in late.metrics.values()) and late.separable
    assert replace(library.of_class("healthy")[0], separation=None).separable


def test_separation_is_measured_on_the_twins(library):
    for fp in library.fingerprints:
        if fp.fault_class == "healthy":
            assert fp.separation is None  # no twins to measure against
        else:
            assert fp.separation is not None and -1.0 <= fp.separation <= 1.0
    # A late, visible fault separates well.
    assert library.get("gradient_overflow/onset=15").separation > 0.3


def test_onset_zero_fingerprints_start_at_the_run_start(library):
    for c in INJECTORS:
        assert library.get(f"{c}/onset=0").from_start
        assert not library.get(f"{c}/onset=15").from_start
    fp = library.get("kl_misconfiguration/onset=0")
    sig = signatures_of([synthetic_run("kl_misconfiguration", steps=STEPS, onset=0, seed=11)], DEFAULT_PARAMS)[0]
    assert class_onset(sig, fp) == 0


def test_the_healthy_fingerprint_expects_learning(library):
    """Reward rising, KL growing, entropy falling: the healthy fingerprint holds those trends, and an
    omitted update that takes them away argues against healthy."""
    fp = library.of_class("healthy")[0]
    trends = {m: fp.metrics[m].trend for m in fp.affected_metrics}
    assert trends == {"reward_mean": 1, "kl": 1, "entropy": -1}
    omitted = signatures_of([synthetic_run("actor_update_omission", steps=STEPS, onset=0, seed=11)],
                            DEFAULT_PARAMS)[0]
    healthy = signatures_of([synthetic_run("healthy", steps=STEPS, seed=11)], DEFAULT_PARAMS)[0]
    assert score_fingerprint(omitted, fp).score < score_fingerprint(healthy, fp).score - 0.1


def test_separation_and_from_start_survive_the_library_file(library):
    again = library_from_dict(library.to_dict())
    for a, b in zip(library.fingerprints, again.fingerprints, strict=True):
        assert (b.separation, b.from_start) == (pytest.approx(a.separation) if a.separation is not None
                                                else None, a.from_start)
