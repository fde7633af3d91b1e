"""Per-view calibration (calibrate.py, vocabulary.VIEWS): the library's runs projected onto each
framework's metric set give that set's threshold, triage applies the view nearest to what a run
logs, so a run that logs only TRL's names can be ``strong``; the thresholds survive a save/load."""

from __future__ import annotations

import pytest
from moeproxy.signatures.build import TraceSet
from moeproxy.signatures.calibrate import cross_validated_calibration, project_run
from moeproxy.signatures.canonical import MetricSeries, RunMetrics, canonicalise
from moeproxy.signatures.fingerprint import FingerprintLibrary, load_library, save_library
from moeproxy.signatures.matching import triage
from moeproxy.signatures.synthetic import synthetic_run
from moeproxy.signatures.vocabulary import (
    CONTROL_METRICS,
    DEFAULT_ALIASES,
    VIEWS,
    alias_index,
    canonical_name,
)

from .conftest import CLASSES, ONSET, STEPS

SEEDS = (0, 1, 2)
HELDOUT = {"seed": 77, "steps": STEPS, "onset": ONSET}


def _trace_sets() -> list[TraceSet]:
    sets = []
    for c in CLASSES:
        runs = {s: synthetic_run(c, steps=STEPS, onset=ONSET, seed=s) for s in SEEDS}
        twins = {} if c == "healthy" else {s: synthetic_run("healthy", steps=STEPS, seed=s) for s in SEEDS}
        sets.append(TraceSet(c, "synthetic", {"onset": ONSET}, runs, twins, {}))
    return sets


@pytest.fixture(scope="module")
def calibrated() -> FingerprintLibrary:
    from moeproxy.signatures.build import fingerprint_from_trace_set

    sets = _trace_sets()
    cal, report = cross_validated_calibration(sets)
    assert set(report["views"]) == set(cal.views)
    return FingerprintLibrary(tuple(fingerprint_from_trace_set(ts) for ts in sets)).with_calibration(cal)


def as_trl(run: RunMetrics) -> RunMetrics:
    """A verl-named run under TRL's names, dropping what TRL does not log."""
    verl = alias_index(DEFAULT_ALIASES, "verl")
    trl_name = {}
    for a in DEFAULT_ALIASES:
        if a.framework == "trl":
            trl_name.setdefault(a.canonical, a.name)
    out = {}
    for name, s in run.series.items():
        canon = canonical_name(name, verl)
        if canon in trl_name:
            out[trl_name[canon]] = MetricSeries(s.steps + 1, s.values)  # TRL counts from 1
    return RunMetrics(out, "trl", run.name)


def test_every_view_is_calibrated_on_its_own_metrics(calibrated):
    views = calibrated.calibration.views
    assert set(views) == set(VIEWS)
    for name, view in views.items():
        assert view.metrics and not set(view.metrics) & CONTROL_METRICS
        if VIEWS[name] is not None:
            assert set(view.metrics) <= VIEWS[name], name
        assert view.n_heldout > 0
    # fewer metrics, lower scores: the minimal set's threshold is not above the full library's
    assert views["minimal"].strong_threshold <= views["verl"].strong_threshold
    assert views["verl"].strong_threshold == pytest.approx(calibrated.calibration.strong_threshold, abs=1e-3)


def test_projection_keeps_only_the_views_canonical_metrics():
    run = synthetic_run("healthy", steps=STEPS, seed=5)
    kept = canonicalise(project_run(run, VIEWS["minimal"])).metrics
    assert set(kept) == VIEWS["minimal"] & set(canonicalise(run).metrics)
    assert project_run(run, None) is run


def test_a_run_with_only_trl_names_is_judged_by_the_trl_threshold_and_can_be_strong(calibrated):
    strong_right = 0
    for c in CLASSES:
        result = triage(as_trl(synthetic_run(c, **HELDOUT)), calibrated)
        assert result.view == "trl"
        assert result.strong_threshold == calibrated.calibration.views["trl"].strong_threshold
        top = result.candidates[0]
        strong_right += top.fault_class == c and top.strength == "strong"
        if c == "healthy":  # a healthy TRL run is not strong for a fault
            assert not any(x.strength == "strong" for x in result.candidates if x.fault_class != "healthy")
    assert strong_right >= len(CLASSES) // 2


def test_a_run_logging_everything_uses_the_full_librarys_threshold(calibrated):
    result = triage(synthetic_run("stale_weight_sync", **HELDOUT), calibrated)
    assert result.view == "verl"
    assert result.to_dict(details=True)["view"] == "verl"


def test_views_survive_a_save_and_load(calibrated, tmp_path):
    save_library(calibrated, tmp_path)
    again = load_library(tmp_path)
    assert again.calibration.views == calibrated.calibration.views


def test_a_library_without_views_keeps_its_one_threshold(synthetic_library):
    assert synthetic_library.calibration.views == {}
    result = triage(as_trl(synthetic_run("healthy", **HELDOUT)), synthetic_library)
    assert result.view is None and result.strong_threshold == synthetic_library.calibration.strong_threshold
