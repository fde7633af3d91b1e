"""A fault fingerprint keeps the best score its own healthy twins got (``Fingerprint.twin_score``, and
per framework view ``Fingerprint.twin_scores``), and triage lets it score a run only above the bar of
the run's view: a run that matches the fault no better than a run without it, seen through the same
metrics, is no evidence for the fault (``Weights.above_twins``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from moeproxy.signatures.build import build_fingerprint, signatures_of
from moeproxy.signatures.canonical import project_run
from moeproxy.signatures.features import SignatureParams
from moeproxy.signatures.fingerprint import (
    Calibration,
    FingerprintLibrary,
    InvalidLibrary,
    ViewCalibration,
    library_from_dict,
)
from moeproxy.signatures.matching import WEIGHTS, library_metrics, score_fingerprint, triage
from moeproxy.signatures.synthetic import synthetic_run
from moeproxy.signatures.vocabulary import VIEWS

STEPS = 60
CLASS = "stale_weight_sync"


def _fingerprint_part(result, fault_class: str) -> float:
    """A class's score before the whole-run findings (the candidate's score when there are none)."""
    c = {c.fault_class: c for c in result.candidates}[fault_class]
    return c.score if c.fingerprint_score is None else c.fingerprint_score


@pytest.fixture(scope="module")
def parts():
    twins = [synthetic_run("healthy", steps=STEPS, seed=s) for s in range(3)]
    faults = [synthetic_run(CLASS, steps=STEPS, onset=25, seed=s) for s in range(3)]
    fp = build_fingerprint(CLASS, faults, twins, params={"onset": 25}, fingerprint_id=f"{CLASS}/onset=25")
    healthy = build_fingerprint("healthy", twins)
    return fp, healthy, faults, twins


def test_the_build_keeps_the_best_twin_score_beside_the_separation(parts):
    fp, healthy, faults, twins = parts
    twin_scores = [score_fingerprint(s, fp).score for s in signatures_of(twins, SignatureParams())]
    fault_scores = [score_fingerprint(s, fp).score for s in signatures_of(faults, SignatureParams())]
    assert fp.twin_score == pytest.approx(max(twin_scores), abs=1e-6)
    assert fp.separation == pytest.approx(float(np.median(fault_scores)) - max(twin_scores), abs=2e-6)
    assert healthy.twin_score is None  # the healthy class has no twins


def test_twin_score_survives_the_library_file_and_is_validated(parts):
    fp, healthy, _, _ = parts
    doc = FingerprintLibrary((fp, healthy)).to_dict()
    back = library_from_dict(doc)
    assert back.get(fp.id).twin_score == fp.twin_score
    assert back.get(fp.id).twin_scores == fp.twin_scores
    doc["fingerprints"][0]["twin_score"] = 1.5
    with pytest.raises(InvalidLibrary, match="twin_score"):
        library_from_dict(doc)
    doc["fingerprints"][0]["twin_score"] = fp.twin_score
    doc["fingerprints"][0]["twin_scores"] = {"minimal": -0.1}
    with pytest.raises(InvalidLibrary, match=r"twin_scores\.minimal"):
        library_from_dict(doc)
    doc["fingerprints"][0]["twin_scores"] = [0.5]
    with pytest.raises(InvalidLibrary, match="twin_scores"):
        library_from_dict(doc)
    # A library written before the per-view bars loads with none (the full-view bar holds).
    del doc["fingerprints"][0]["twin_scores"]
    assert library_from_dict(doc).get(fp.id).twin_scores == {}


def test_the_build_keeps_a_twin_score_per_view(parts):
    fp, _, _, twins = parts
    narrow = {name for name, metrics in VIEWS.items() if metrics is not None}
    assert set(fp.twin_scores) == narrow  # the synthetic twins log something of every view
    for view in narrow:
        projected = signatures_of([project_run(t, VIEWS[view]) for t in twins], SignatureParams())
        assert fp.twin_scores[view] == pytest.approx(max(score_fingerprint(s, fp).score for s in projected), abs=1e-6)
        assert fp.twin_bar(view) == fp.twin_scores[view]
    assert fp.twin_bar(None) == fp.twin_bar("verl") == fp.twin_score  # the full view


def test_a_run_seen_through_a_view_is_held_to_that_views_twins(parts):
    """A run that logs only the minimal set is gated by the twins' minimal-view score, and a run that
    logs everything by the full-view one: each run is held to twins that showed what it shows."""
    fp, healthy, _, _ = parts
    fresh = synthetic_run("healthy", steps=STEPS, seed=12)
    narrow = project_run(fresh, VIEWS["minimal"])
    raw_narrow = score_fingerprint(signatures_of([narrow], SignatureParams())[0], fp).score
    raw_full = score_fingerprint(signatures_of([fresh], SignatureParams())[0], fp).score
    assert raw_narrow > 0 and raw_full > 0
    plain = FingerprintLibrary((fp, healthy))
    calibration = Calibration(0.8, views={
        "verl": ViewCalibration(0.8, tuple(sorted(library_metrics(plain)))),
        "minimal": ViewCalibration(0.7, tuple(sorted(VIEWS["minimal"] & library_metrics(plain)))),
    })
    # Bars: the full view's below both raw scores, the minimal view's above the narrow run's.
    bars = replace(fp, twin_score=max(0.0, min(raw_narrow, raw_full) - 0.05),
                   twin_scores={"minimal": min(1.0, raw_narrow + 0.05)})
    library = FingerprintLibrary((bars, healthy), calibration=calibration)
    seen_narrow, seen_full = triage(narrow, library), triage(fresh, library)
    assert (seen_narrow.view, seen_full.view) == ("minimal", "verl")
    assert _fingerprint_part(seen_narrow, CLASS) == 0.0
    assert _fingerprint_part(seen_full, CLASS) == pytest.approx(raw_full, abs=1e-4)
    # Without a bar for its view the narrow run falls back to the full-view one, and keeps its score.
    fallback = FingerprintLibrary((replace(bars, twin_scores={}), healthy), calibration=calibration)
    assert _fingerprint_part(triage(narrow, fallback), CLASS) == pytest.approx(raw_narrow, abs=1e-4)


def test_a_run_that_matches_no_better_than_a_twin_adds_no_score(parts):
    fp, healthy, _, _ = parts
    fresh_twin = synthetic_run("healthy", steps=STEPS, seed=11)
    raw = score_fingerprint(signatures_of([fresh_twin], SignatureParams())[0], fp).score
    assert raw > 0
    # A twin that scored above this run: the fingerprint gives the run nothing.
    gated = replace(fp, twin_score=min(1.0, raw + 0.05))
    library = FingerprintLibrary((gated, healthy))
    assert _fingerprint_part(triage(fresh_twin, library), CLASS) == 0.0
    # The same fingerprint without the rule, or with twins that scored lower, keeps the raw score.
    off = triage(fresh_twin, library, weights=replace(WEIGHTS, above_twins=False))
    assert _fingerprint_part(off, CLASS) == pytest.approx(raw, abs=1e-4)
    below = FingerprintLibrary((replace(fp, twin_score=max(0.0, raw - 0.05)), healthy))
    assert _fingerprint_part(triage(fresh_twin, below), CLASS) == pytest.approx(raw, abs=1e-4)


def test_the_fault_runs_themselves_still_score_above_their_twins(parts):
    fp, healthy, faults, _ = parts
    assert fp.separation > 0.1
    library = FingerprintLibrary((fp, healthy))
    parts_ = [_fingerprint_part(triage(run, library), CLASS) for run in faults]
    assert float(np.median(parts_)) >= fp.twin_score + 0.5 * fp.separation
