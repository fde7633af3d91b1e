"""A fault fingerprint keeps the best score its own healthy twins got (``Fingerprint.twin_score``), and
triage lets it score a run only above that: a run that matches the fault no better than a run
without it is no evidence for the fault (``Weights.above_twins``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from moeproxy.signatures.build import signatures_of
from moeproxy.signatures.features import SignatureParams
from moeproxy.signatures.fingerprint import FingerprintLibrary, InvalidLibrary, library_from_dict
from moeproxy.signatures.matching import WEIGHTS, score_fingerprint, triage
from moeproxy.signatures.synthetic import synthetic_run

from .conftest import GATED_CLASS as CLASS
from .conftest import GATED_STEPS as STEPS
from .conftest import class_part as _fingerprint_part


@pytest.fixture(scope="module")
def parts(gated_parts):
    return gated_parts


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
    doc["fingerprints"][0]["twin_score"] = 1.5
    with pytest.raises(InvalidLibrary, match="twin_score"):
        library_from_dict(doc)


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
