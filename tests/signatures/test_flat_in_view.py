"""A fault fingerprint that is flat-only as the run sees it (``matching.flat_in_view``): of its
affected metrics the run logs none, or only ones its runs left flat. What told its runs from their
twins is then not in the run, and what is left agrees with any quiet healthy run, so it is held like
a flat-only fingerprint: no score of its own without a finding for its class."""

from __future__ import annotations

from dataclasses import replace

import pytest
from moeproxy.signatures.build import signatures_of
from moeproxy.signatures.calibrate import project_run
from moeproxy.signatures.canonical import canonicalise
from moeproxy.signatures.features import SignatureParams
from moeproxy.signatures.fingerprint import FingerprintLibrary
from moeproxy.signatures.matching import WEIGHTS, flat_in_view, score_fingerprint, triage
from moeproxy.signatures.synthetic import synthetic_run

from .conftest import GATED_CLASS as CLASS
from .conftest import GATED_STEPS as STEPS
from .conftest import class_part as _part


@pytest.fixture(scope="module")
def parts(gated_parts):
    fp, healthy, _, _ = gated_parts
    # No twin bar and no separation gate here: what is tested is the view rule alone.
    fp = replace(fp, twin_score=None, separation=None)
    # One affected metric the fingerprint's runs left flat, beside the ones that moved.
    moved = [m for m in fp.affected_metrics if not fp.metrics[m].flat]
    quiet = next(m for m in fp.metrics if not fp.metrics[m].affected and fp.metrics[m].flat)
    metrics = {**fp.metrics, quiet: replace(fp.metrics[quiet], role="affected")}
    return replace(fp, metrics=metrics), healthy, moved, quiet


def _without(run, names):
    return project_run(run, set(canonicalise(run).metrics) - set(names))


def _sig(run):
    return signatures_of([run], SignatureParams())[0]


def test_a_run_that_logs_what_moved_is_not_flat_in_view(parts):
    fp, healthy, moved, quiet = parts
    assert moved and fp.metrics[quiet].flat and not fp.flat_only
    run = synthetic_run("healthy", steps=STEPS, seed=11)
    assert not flat_in_view(fp, _sig(run))
    assert not flat_in_view(healthy, _sig(run))  # the healthy class is never held this way


@pytest.mark.parametrize("drop", ["moved", "all affected"])
def test_a_run_that_cannot_show_the_fault_gets_no_score_from_it(parts, drop):
    fp, healthy, moved, quiet = parts
    names = moved if drop == "moved" else [*moved, quiet]
    run = _without(synthetic_run("healthy", steps=STEPS, seed=11), names)
    sig = _sig(run)
    assert flat_in_view(fp, sig)
    raw = score_fingerprint(sig, fp).score
    assert raw > 0.3  # agreement alone: the unaffected metrics and the flat one say "no change"
    library = FingerprintLibrary((fp, healthy))
    assert _part(triage(run, library), CLASS) == 0.0
    off = triage(run, library, weights=replace(WEIGHTS, flat_in_view=False))
    assert _part(off, CLASS) == pytest.approx(raw, abs=1e-4)


def test_the_fault_runs_themselves_still_match_when_they_log_what_moved(parts):
    fp, healthy, _, _ = parts
    run = synthetic_run(CLASS, steps=STEPS, onset=25, seed=7)
    assert not flat_in_view(fp, _sig(run))
    result = triage(run, FingerprintLibrary((fp, healthy)))
    assert result.top.fault_class == CLASS and _part(result, CLASS) > 0.5
