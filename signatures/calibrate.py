"""Calibrating the ``strong`` / ``weak`` threshold on held-out traces.

Two kinds of held-out runs are scored against the library:

- *positives*: runs of a class the library knows (seeds, magnitudes and onsets not used to build
  it) — their own class's score should be ``strong``;
- *negatives*: the same runs triaged against the library **with their class left out**
  (leave-one-class-out), plus healthy runs' best fault-class score — the best remaining score must
  be ``weak``, because a fault outside the library must not be reported as a confident wrong class.

The threshold is the midpoint of the interval that maximises balanced accuracy
(TPR on positives + TNR on negatives); the library records the method, the threshold and the
counts (``calibration`` in docs/fingerprints.md).

**Per view.** A run that logs only some metrics scores lower (fewer parts agree, the coverage
factor falls), so one threshold for all would call nothing a TRL run shows ``strong``. The same
held-out runs are therefore projected onto each framework's standard metric set
(``vocabulary.VIEWS``) and scored again, against fingerprints that keep every metric; each view
gets the threshold its projected runs give (``Calibration.views``), and triage applies the view
nearest to what a run logs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from moeproxy.signatures.canonical import RunMetrics, canonicalise
from moeproxy.signatures.features import run_signature
from moeproxy.signatures.fingerprint import Calibration, FingerprintLibrary, ViewCalibration
from moeproxy.signatures.matching import library_metrics, triage
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, VIEWS, alias_index, canonical_name

Projection = Callable[[RunMetrics], RunMetrics]


@dataclass(frozen=True)
class LabelledRun:
    fault_class: str
    run: RunMetrics


@dataclass(frozen=True)
class CalibrationScores:
    positives: tuple[float, ...]  # the true class's score
    negatives: tuple[float, ...]  # best score with the true class left out / best fault on healthy


def project_run(run: RunMetrics, metrics: Collection[str] | None) -> RunMetrics:
    """``run`` with only the series whose canonical name is in ``metrics`` (None: all of them)."""
    if metrics is None:
        return run
    index = alias_index(DEFAULT_ALIASES, run.framework)
    keep = {name: s for name, s in run.series.items() if canonical_name(name, index) in metrics}
    return RunMetrics(keep, run.framework, run.name)


def calibration_scores(library: FingerprintLibrary, runs: Sequence[LabelledRun], *,
                       project: Projection | None = None) -> CalibrationScores:
    """Own-class scores and best wrong-class scores of ``runs`` (each projected first, if given)."""
    pos: list[float] = []
    neg: list[float] = []
    loco = {c: library.without_class(c) for c in library.fault_classes}
    for item in runs:
        run = item.run if project is None else project(item.run)
        sig = run_signature(canonicalise(run), library.params)
        full = triage(sig, library)
        own = next((c.score for c in full.candidates if c.fault_class == item.fault_class), None)
        if own is not None:
            pos.append(own)
        if item.fault_class == "healthy":
            faults = [c.score for c in full.candidates if c.fault_class != "healthy"]
            if faults:
                neg.append(max(faults))
        elif item.fault_class in loco and loco[item.fault_class].fingerprints:
            rest = triage(sig, loco[item.fault_class])
            neg.append(rest.candidates[0].score)
    return CalibrationScores(tuple(pos), tuple(neg))


def choose_threshold(scores: CalibrationScores) -> tuple[float, float]:
    """(threshold, balanced accuracy) maximising TPR + TNR; midpoint of the best interval."""
    pos = np.asarray(scores.positives)
    neg = np.asarray(scores.negatives)
    if pos.size == 0 or neg.size == 0:
        raise ValueError("calibration needs positive and negative held-out scores")
    cuts = np.unique(np.concatenate([pos, neg, [0.0, 1.0]]))
    mids = (cuts[:-1] + cuts[1:]) / 2
    best_t, best_acc = 0.5, -1.0
    for t in mids:
        acc = 0.5 * ((pos >= t).mean() + (neg < t).mean())
        if acc > best_acc + 1e-12:
            best_t, best_acc = float(t), float(acc)
    return best_t, best_acc


HELDOUT_METHOD = ("balanced accuracy over held-out runs: own-class score (positives) vs best score "
                  "with the class left out and best fault score on healthy runs (negatives)")


def calibrate(library: FingerprintLibrary, runs: Sequence[LabelledRun], *,
              views: Mapping[str, Collection[str] | None] = VIEWS) -> tuple[FingerprintLibrary, dict]:
    """The library-wide threshold from ``runs`` as they are, and one per view from the same runs
    projected onto each view's metrics."""
    cal, report = _calibration_from_scores(calibration_scores(library, runs), HELDOUT_METHOD, n_heldout=len(runs))
    per_view = {}
    for name, metrics in views.items():
        def project(r, metrics=metrics):
            return project_run(r, metrics)

        per_view[name] = (calibration_scores(library, runs, project=project),
                          _view_metrics(library, [project(item.run) for item in runs]))
    return library.with_calibration(_with_views(cal, report, per_view)), report


def _view_metrics(library: FingerprintLibrary, runs: Sequence[RunMetrics]) -> tuple[str, ...]:
    """The library's metrics that the (projected) runs log."""
    seen: set[str] = set()
    for r in runs:
        seen |= set(canonicalise(r).metrics)
    return tuple(sorted(seen & library_metrics(library)))


def _with_views(cal: Calibration, report: dict,
                per_view: Mapping[str, tuple[CalibrationScores, tuple[str, ...]]]) -> Calibration:
    """``cal`` with a threshold per view (views whose runs keep no metric of the library, or give
    no positive or no negative score, are left out); the figures go into ``report["views"]``."""
    views = {}
    report["views"] = {}
    for name, (scores, metrics) in per_view.items():
        if not metrics or not scores.positives or not scores.negatives:
            continue
        thr, acc = choose_threshold(scores)
        views[name] = ViewCalibration(round(thr, 4), metrics, round(acc, 4), len(scores.positives))
        report["views"][name] = {"threshold": views[name].strong_threshold, "balanced_accuracy": acc,
                                 "metrics": list(metrics), "n": len(scores.positives)}
    return replace(cal, views=views)


def _calibration_from_scores(scores: CalibrationScores, method: str, *, n_heldout: int) -> tuple[Calibration, dict]:
    """The threshold with the best balanced accuracy on ``scores``, as a Calibration and a report."""
    thr, acc = choose_threshold(scores)
    cal = Calibration(
        strong_threshold=round(thr, 4),
        method=f"{method}; balanced accuracy {acc:.3f}",
        n_heldout=n_heldout,
    )
    report = {"threshold": cal.strong_threshold, "balanced_accuracy": acc,
              "positives": list(scores.positives), "negatives": list(scores.negatives)}
    return cal, report


def cross_validated_calibration(trace_sets, *, signature_params=None,
                                views: Mapping[str, Collection[str] | None] = VIEWS,
                                base: FingerprintLibrary | None = None) -> tuple[Calibration, dict]:
    """Calibrate without extra runs: leave one library seed out at a time, build the fingerprints
    from the other seeds, and score the left-out seed's runs (positives: own class; negatives: best
    score with the class left out, best fault score on the left-out healthy twin). Fingerprints
    from fewer seeds match a little worse, so the threshold comes out conservative.

    ``base``: the library the trace sets' fingerprints will be layered over
    (``FingerprintLibrary.layered``); each fold then scores against the base plus the fold's
    fingerprints, so the threshold is the combination's."""
    from moeproxy.signatures.build import fingerprint_from_trace_set
    from moeproxy.signatures.features import DEFAULT_PARAMS

    params = signature_params or DEFAULT_PARAMS
    seeds = sorted({s for ts in trace_sets for s in ts.fault_runs})
    if len(seeds) < 2:
        raise ValueError("cross-validated calibration needs at least two library seeds")
    pos: list[float] = []
    neg: list[float] = []
    per_view: dict[str, tuple[list[float], list[float], set[str]]] = {v: ([], [], set()) for v in views}
    for held in seeds:
        fps, runs = [], []
        for ts in trace_sets:
            keep = {s: r for s, r in ts.fault_runs.items() if s != held}
            if not keep:
                continue
            twins = {s: r for s, r in ts.healthy_runs.items() if s != held}
            fps.append(fingerprint_from_trace_set(replace(ts, fault_runs=keep, healthy_runs=twins),
                                                  signature_params=params))
            if held in ts.fault_runs:
                runs.append(LabelledRun(ts.fault_class, ts.fault_runs[held]))
        healthy_twin = next((ts.healthy_runs[held] for ts in trace_sets if held in ts.healthy_runs), None)
        if healthy_twin is not None and not any(r.fault_class == "healthy" for r in runs):
            runs.append(LabelledRun("healthy", healthy_twin))
        ids = {f.id for f in fps}
        under = tuple(f for f in base.fingerprints if f.id not in ids) if base is not None else ()
        fold_library = FingerprintLibrary(under + tuple(fps), params)
        fold = calibration_scores(fold_library, runs)
        pos += fold.positives
        neg += fold.negatives
        for name, metrics in views.items():
            def project(r, metrics=metrics):
                return project_run(r, metrics)

            vp, vn, seen = per_view[name]
            fold = calibration_scores(fold_library, runs, project=project)
            vp += fold.positives
            vn += fold.negatives
            seen.update(_view_metrics(fold_library, [project(item.run) for item in runs]))
    cal, report = _calibration_from_scores(
        CalibrationScores(tuple(pos), tuple(neg)),
        "leave-one-seed-out over the library runs: fingerprints rebuilt without the seed, its runs "
        "scored: own-class score (positives) vs best score with the class left out and best fault "
        "score on the healthy twin (negatives); per view, the same runs projected onto the view's metrics",
        n_heldout=len(pos),
    )
    scored = {n: (CalibrationScores(tuple(p), tuple(q)), tuple(sorted(m))) for n, (p, q, m) in per_view.items()}
    return _with_views(cal, report, scored), report
