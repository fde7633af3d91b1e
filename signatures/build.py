"""Building fingerprints from reproduction traces (pure: reads runs, never runs the engine).

A fingerprint is built from several fault runs of one (class, variant, parameters) on a proxy,
each with its healthy twin when the campaign recorded one. Every run goes through the same
run-alone signature extraction as a production run (:mod:`moeproxy.signatures.features`), so the
fingerprint stores exactly what triage can observe. The twins decide which metrics the fault
*affects*: a metric counts as affected when most fault runs show a change that their twins do not
(or a different one), or when it goes non-finite.

``load_trace_dir`` reads the reproduction engine's output directory (``manifest.json``,
``<fault>-seed<k>.jsonl``, ``healthy-seed<k>.jsonl``; issue 6 / docs of ``moeproxy reproduce``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.canonical import RunMetrics, canonicalise, load_run
from moeproxy.signatures.errors import InvalidRun, UnknownFaultClass
from moeproxy.signatures.features import DEFAULT_PARAMS, RunSignature, SignatureParams, run_signature
from moeproxy.signatures.fingerprint import FLAT_VOLATILITY, Fingerprint, MetricExpectation

#: Metrics that describe the machine, not the training: never part of a fingerprint (a proxy is
#: faster and smaller by design, so its timings say nothing about the fault).
EXCLUDED_METRICS = frozenset({"step_time_s", "peak_memory_mb"})
EXCLUDED_PREFIXES = ("timing_s/", "timing/", "perf/")


@dataclass(frozen=True)
class TraceSet:
    """One reproduction output directory: fault runs and healthy twins, keyed by seed."""

    fault_class: str
    variant: str
    params: Mapping[str, Any]
    fault_runs: Mapping[int, RunMetrics]
    healthy_runs: Mapping[int, RunMetrics]
    manifest: Mapping[str, Any]
    path: Path | None = None
    #: The injected onset of each fault run, by seed, when the runs of one entry start at different
    #: steps (a campaign's mid-run onset is drawn per seed); else ``params`` holds the one onset.
    onsets: Mapping[int, int] | None = None


_SEED_FILE = re.compile(r"^(?P<name>.+)-seed(?P<seed>\d+)\.jsonl$")


def load_trace_dir(path: str | Path, *, twins_from: str | Path | None = None, view: str = "verl") -> TraceSet:
    """Read ``DIR/manifest.json`` and the ``*-seed<k>.jsonl`` traces next to it; healthy twins
    missing there are read from ``twins_from`` (a campaign's shared healthy directory).

    Traces written raw (everything the engine recorded: a campaign's) are read as the framework
    ``view`` logs them (:mod:`moeproxy.reproduction.views`); traces already written in a view are
    read as they are.
    """
    d = Path(path)
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except FileNotFoundError:
        raise InvalidRun(f"{d}: no manifest.json") from None
    except json.JSONDecodeError as exc:
        raise InvalidRun(f"{d / 'manifest.json'}: not JSON ({exc.msg})") from None
    fault = _fault_of(manifest)
    read = _reader(manifest, view)
    fault_runs: dict[int, RunMetrics] = {}
    healthy: dict[int, RunMetrics] = {}
    for f in sorted(d.glob("*-seed*.jsonl")):
        m = _SEED_FILE.match(f.name)
        if not m:
            continue
        seed = int(m.group("seed"))
        run = read(f)
        if m.group("name") == "healthy":
            healthy[seed] = run
        elif m.group("name") == fault["class"]:
            fault_runs[seed] = run
    if twins_from is not None and fault["class"] != "healthy":
        for f in sorted(Path(twins_from).glob("healthy-seed*.jsonl")):
            m = _SEED_FILE.match(f.name)
            if m and int(m.group("seed")) in fault_runs and int(m.group("seed")) not in healthy:
                twin_manifest = Path(twins_from) / "manifest.json"
                twin_read = _reader(json.loads(twin_manifest.read_text()), view) if twin_manifest.exists() else read
                healthy[int(m.group("seed"))] = twin_read(f)
    if fault["class"] == "healthy":
        fault_runs = fault_runs or healthy
    if not fault_runs:
        raise InvalidRun(f"{d}: no {fault['class']}-seed<k>.jsonl trace")
    onsets = manifest.get("onsets")
    onsets = {int(k): int(v) for k, v in onsets.items() if v is not None} if isinstance(onsets, Mapping) else None
    return TraceSet(fault["class"], fault["variant"], fault["params"], fault_runs, healthy, manifest, d,
                    onsets or None)


def _reader(manifest: Mapping[str, Any], view: str):
    """How to read one trace file of a directory: projected onto ``view`` when it was written raw."""
    from moeproxy.reproduction.views import VIEWS, project

    if view not in VIEWS:
        raise InvalidRun(f"unknown framework view {view!r}; known: {', '.join(VIEWS)}")
    written = manifest.get("view", "verl")
    framework = None if view == "raw" else view
    if written != "raw" or view == "raw":
        return lambda f: load_run(f, framework=framework or "verl")

    def read(f: Path) -> RunMetrics:
        try:
            records = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError) as exc:
            raise InvalidRun(f"{f}: cannot read the trace ({exc})") from None
        return RunMetrics.from_steps(project(records, view), framework=framework, name=f.stem)

    return read


def _fault_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    # The engine's manifest names the fault either as a string with "params"/"variant" next to it
    # or as an object {"class"|"name", "variant", "params"}; read both.
    raw = manifest.get("fault")
    if isinstance(raw, Mapping):
        cls = raw.get("class") or raw.get("name") or raw.get("fault_class")
        params = dict(raw.get("params") or {})
        variant = raw.get("variant") or params.get("variant")
    else:
        cls = raw or manifest.get("fault_class")
        params = dict(manifest.get("params") or manifest.get("fault_params") or {})
        variant = manifest.get("variant") or params.get("variant")
    if cls not in FAULT_CLASSES:
        raise UnknownFaultClass(f"manifest names fault class {cls!r}, not in the catalogue")
    variant = str(variant or FAULT_CLASSES[cls].variants[0])
    return {"class": cls, "variant": variant, "params": params}


def signatures_of(runs: Sequence[RunMetrics], params: SignatureParams) -> list[RunSignature]:
    return [run_signature(canonicalise(r), params) for r in runs]


def build_fingerprint(fault_class: str, fault_runs: Sequence[RunMetrics],
                      healthy_runs: Sequence[RunMetrics] = (), *, variant: str | None = None,
                      params: Mapping[str, Any] | None = None, provenance: Mapping[str, Any] | None = None,
                      fingerprint_id: str | None = None,
                      signature_params: SignatureParams = DEFAULT_PARAMS,
                      onsets: Sequence[int | None] | None = None) -> Fingerprint:
    """One fingerprint from several runs of the same fault (and their healthy twins, same order).

    ``onsets``: the injected onset of each fault run (same order) when they differ; else the one
    onset in ``params`` (if any) holds for every run."""
    if fault_class not in FAULT_CLASSES:
        raise UnknownFaultClass(f"unknown fault class {fault_class!r}")
    if not fault_runs:
        raise InvalidRun("a fingerprint needs at least one fault run")
    fc = FAULT_CLASSES[fault_class]
    sigs = signatures_of(fault_runs, signature_params)
    twins = signatures_of(healthy_runs, signature_params) if fault_class != "healthy" else []
    names = _common_metrics(sigs)
    if onsets is not None and len(onsets) != len(sigs):
        raise InvalidRun(f"{len(onsets)} onsets for {len(sigs)} fault runs")
    single = _injected_onset(params or {})
    injected = list(onsets) if onsets is not None else [single] * len(sigs)
    # Per-run onsets need the twins in the order of the fault runs (or no twins).
    twin_injected = list(onsets) if onsets is not None and twins else [single] * len(twins)
    ref = [_reference_onset(s, names, o) for s, o in zip(sigs, injected, strict=True)]
    twin_ref = [_reference_onset(t, names, o) for t, o in zip(twins, twin_injected, strict=True)]
    affected = {m: _is_affected(m, sigs, twins, fault_class) or _volatility_changed(m, sigs, ref, twins, twin_ref)
                for m in names}
    if fault_class != "healthy" and not any(affected.values()):
        # Nothing separates the fault from its twins: keep every changed metric, so the fingerprint
        # still says what a run of this fault looks like on its own.
        affected = {m: _majority([s.metrics[m].direction for s in sigs])[0] != 0 for m in names}
    affected_names = [m for m in names if affected[m]]
    run_onsets = [_reference_onset(s, affected_names, o) for s, o in zip(sigs, injected, strict=True)]
    aligned = fault_class != "healthy" and sum(o is not None for o in run_onsets) * 2 >= len(sigs)
    pre = signature_params.trace_pre
    metrics = {m: _expectation(m, sigs, run_onsets if aligned else [None] * len(sigs), affected[m], pre)
               for m in names}
    prov = dict(provenance or {})
    prov.setdefault("n_runs", len(fault_runs))
    prov.setdefault("n_twins", len(healthy_runs))
    vid = variant or fc.variants[0]
    fid = fingerprint_id or f"{fault_class}/{vid}/{_params_key(params or {})}"
    from_start = aligned and all(o is not None and s.steps.size > 0 and o <= s.steps[0]
                                 for s, o in zip(sigs, injected, strict=True))
    fp = Fingerprint(fid, fault_class, fc.family, vid, dict(params or {}), aligned, pre, metrics, prov,
                     from_start=from_start)
    if not twins:
        return fp
    sep, twin = separation(fp, sigs, twins)
    return replace(fp, separation=sep, twin_score=twin)


def separation(fp: Fingerprint, fault_sigs: Sequence[RunSignature],
               twin_sigs: Sequence[RunSignature]) -> tuple[float, float]:
    """How much higher the matcher scores the fault runs a fingerprint was built from than the
    best-matching of their healthy twins: (the fault runs' median minus the twins' maximum, the
    twins' maximum) (``Fingerprint.separable``, ``Fingerprint.twin_score``). One twin that matches
    as well as the fault runs is enough to say healthy runs look like this; scored by the function
    triage uses, so what counts is what triage would see, not what the build step believed."""
    from moeproxy.signatures.matching import score_fingerprint  # matching reads fingerprints, not builds

    fault = float(np.median([score_fingerprint(s, fp).score for s in fault_sigs]))
    twin = max(score_fingerprint(t, fp).score for t in twin_sigs)
    return round(fault - twin, 6), round(twin, 6)


def fingerprint_from_trace_set(ts: TraceSet, *, signature_params: SignatureParams = DEFAULT_PARAMS,
                               source: str = "proxy", fingerprint_id: str | None = None) -> Fingerprint:
    seeds = sorted(ts.fault_runs)
    twins = [ts.healthy_runs[s] for s in seeds if s in ts.healthy_runs]
    if len(twins) != len(seeds):
        twins = []
    prov = {
        "source": source,
        "model": ts.manifest.get("model"),
        "proxy_report": ts.manifest.get("proxy_report"),
        "params": dict(ts.params),
        "seeds": seeds,
        "runs": [f"{ts.fault_class}-seed{s}.jsonl" for s in seeds],
        "trace_dir": None if ts.path is None else str(ts.path),
        "engine": ts.manifest.get("engine") or ts.manifest.get("backend"),
        "steps": ts.manifest.get("steps"),
    }
    params = dict(ts.params)
    onsets = None
    if ts.onsets is not None and ts.fault_class != "healthy":
        onsets = [ts.onsets.get(s) for s in seeds]
        prov["onsets"] = {str(s): o for s, o in zip(seeds, onsets, strict=True)}
        # The fingerprint's parameters say how the onset was chosen, not one run's step.
        if ts.manifest.get("onset_rule") is not None:
            params["onset"] = ts.manifest["onset_rule"]
    return build_fingerprint(ts.fault_class, [ts.fault_runs[s] for s in seeds], twins, variant=ts.variant,
                             params=params, provenance=prov, fingerprint_id=fingerprint_id,
                             signature_params=signature_params, onsets=onsets)


#: Parameter names under which the engine's injectors take their onset step.
ONSET_PARAMS = ("onset", "onset_step")


def _injected_onset(params: Mapping[str, Any]) -> int | None:
    for key in ONSET_PARAMS:
        value = params.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def _reference_onset(sig: RunSignature, affected: Sequence[str], injected: int | None) -> int | None:
    """The class onset of one fingerprint run: the injection step when the campaign knows it (the
    lags of the fingerprint are then physical: "KL rises 2 steps after the fault"), else the
    earliest onset among the affected metrics."""
    if injected is not None and sig.steps.size and sig.steps[0] <= injected <= sig.steps[-1]:
        return int(np.searchsorted(sig.steps, injected))
    return sig.onset_of(affected)


def _params_key(params: Mapping[str, Any]) -> str:
    if not params:
        return "default"
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def _common_metrics(sigs: Sequence[RunSignature]) -> list[str]:
    counts = Counter(m for s in sigs for m in s.metrics)
    keep = [m for m, c in counts.items() if c * 2 >= len(sigs) and m not in EXCLUDED_METRICS
            and not m.startswith(EXCLUDED_PREFIXES)]
    return sorted(keep)


def _majority(values: Sequence[int]) -> tuple[int, float]:
    if not values:
        return 0, 0.0
    (value, count), = Counter(values).most_common(1)
    return int(value), count / len(values)


def _unanimous(values: Sequence[int]) -> int:
    """The sign every run shows, else 0."""
    return int(values[0]) if values and all(v == values[0] for v in values) else 0


def _is_affected(m: str, sigs: Sequence[RunSignature], twins: Sequence[RunSignature], fault_class: str) -> bool:
    fault_dirs = [s.metrics[m].direction for s in sigs if m in s.metrics]
    nonfinite = np.mean([s.metrics[m].has_nonfinite for s in sigs if m in s.metrics])
    direction, share = _majority(fault_dirs)
    # A strict majority of the runs (with two seeds: both) must show the change.
    if fault_class == "healthy":
        # A healthy run that learns moves: reward rising, KL growing, entropy falling (SPEC section
        # 3). Its steady trends are what a fault takes away, so they count like a change, however
        # small against the noise (drift): with small batches a learning reward rises by only ~2
        # noise widths over a run, and a healthy fingerprint that calls it unaffected makes every
        # learning run a surprise. A drift counts only when every run shows it: the trend test
        # takes autocorrelated noise for a trend now and then, never in every seed the same way.
        return (direction != 0 and share > 0.5) or _unanimous([s.metrics[m].drift for s in sigs if m in s.metrics]) != 0
    twin_nonfinite = np.mean([t.metrics[m].has_nonfinite for t in twins if m in t.metrics]) if twins else 0.0
    if nonfinite >= 0.5 and twin_nonfinite < 0.5:
        return True
    if share <= 0.5:
        return False
    if not twins:
        return direction != 0
    twin_dir, twin_share = _majority([t.metrics[m].direction for t in twins if m in t.metrics])
    if direction == 0:
        # No change where the twins show one, or a different trend than theirs: the fault took
        # away a healthy run's dynamics (a reward that never rises, a KL that never grows). With
        # a fault present from step 0 this is often all that separates it from a healthy run.
        # With small batches a learning twin often only drifts (a significant trend below the
        # trend gate): a fault whose runs do not drift with it (no update, a constant reward) took
        # that learning away, which is all an onset-0 fault of that kind shows.
        trend, trend_share = _majority([s.metrics[m].trend for s in sigs if m in s.metrics])
        twin_trend, twin_trend_share = _majority([t.metrics[m].trend for t in twins if m in t.metrics])
        twin_drift = _unanimous([t.metrics[m].drift for t in twins if m in t.metrics])
        follows = np.mean([s.metrics[m].drift == twin_drift for s in sigs if m in s.metrics]) > 0.5
        return ((twin_dir != 0 and twin_share > 0.5)
                or (trend_share > 0.5 and twin_trend_share > 0.5 and trend != twin_trend)
                or (twin_drift != 0 and not follows))
    if twin_dir != direction:
        return True
    # Same direction as the twins: affected when the fault makes the change 3x larger or smaller
    # (omitted updates leave KL growing far less than in the twin), or turns its trend.
    fz = np.median([abs(s.metrics[m].effect_z) for s in sigs if m in s.metrics])
    tz = np.median([abs(t.metrics[m].effect_z) for t in twins if m in t.metrics])
    if max(fz, tz) > 3.0 and (max(fz, 1.0) / max(tz, 1.0) > 3.0 or max(tz, 1.0) / max(fz, 1.0) > 3.0):
        return True
    trend, share = _majority([s.metrics[m].trend for s in sigs if m in s.metrics])
    twin_trend, _ = _majority([t.metrics[m].trend for t in twins if m in t.metrics])
    return share > 0.5 and trend != twin_trend


def _volatility_changed(m: str, sigs, ref, twins, twin_ref) -> bool:
    """The fault changes the metric's spread around the onset 5x more than the twins show."""
    fv = [s.volatility(m, o) for s, o in zip(sigs, ref, strict=True) if o is not None and m in s.metrics]
    fv = [v for v in fv if v is not None]
    if not fv or not twins:
        return False
    tv = [t.volatility(m, o) for t, o in zip(twins, twin_ref, strict=True) if o is not None and m in t.metrics]
    tv = [v for v in tv if v is not None]
    base = float(np.median(tv)) if tv else 0.0
    return abs(float(np.median(fv)) - base) > FLAT_VOLATILITY


def _expectation(m: str, sigs: Sequence[RunSignature], onsets: Sequence[int | None], affected: bool,
                 pre: int) -> MetricExpectation:
    present = [(s, o) for s, o in zip(sigs, onsets, strict=True) if m in s.metrics]
    ms = [s.metrics[m] for s, _ in present]
    direction, agreement = _majority([x.direction for x in ms])
    trend, _ = _majority([x.trend for x in ms])
    drift = _unanimous([x.drift for x in ms])
    lags = [x.event_index - o for x, (_, o) in zip(ms, present, strict=True)
            if o is not None and x.event_index is not None]
    ratios = [np.log10(x.ratio) for x in ms if x.ratio is not None and x.ratio > 0]
    vols = [s.volatility(m, o) for s, o in present if o is not None]
    vols = [v for v in vols if v is not None]
    traces: list[tuple[float, ...]] = []
    if affected:
        for s, o in present:
            if o is not None:
                t = s.effect_trace(m, o)
                if t.size > pre:
                    traces.append(tuple(float(v) for v in t))
    return MetricExpectation(
        source=ms[0].source,
        role="affected" if affected else "unaffected",
        direction=direction,
        agreement=agreement,
        trend=trend,
        onset_lag=float(np.median(lags)) if lags and affected else None,
        onset_lag_spread=float(np.std(lags)) if len(lags) > 1 and affected else 0.0,
        log10_ratio=float(np.median(ratios)) if ratios else None,
        effect_z=float(np.clip(np.median([x.effect_z for x in ms]), -1e6, 1e6)),
        nonfinite_rate=float(np.mean([x.has_nonfinite for x in ms])),
        traces=tuple(traces),
        log10_volatility=float(np.median(vols)) if vols and affected else None,
        freeze_rate=float(np.mean([x.frozen for x in ms])),
        drift=drift,
    )
