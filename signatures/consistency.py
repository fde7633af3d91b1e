"""Is one run's anomaly signature consistent with another's? (the check the proxy method rests on)

Typical use: a proxy reproduction against the production run, or a proxy run against its original
model's run. Each run is compared with *its own* pre-onset baseline (no healthy twin needed), then,
per shared canonical metric:

- direction of the change (+1 / -1 / 0) in each run and whether they agree;
- onset step in each run and their offset; timing agrees when the metric's lag after its run's
  anomaly onset (the earliest onset among the shared changed metrics) differs by at most
  ``onset_tolerance`` steps between the runs (issue 6's ±2 steps);
- banded DTW distance between the z-normalised effect traces, each aligned on its run's onset;
- non-finite events in each run.

Overall: ``consistent`` when every metric that changed in either run agrees in direction (and
non-finite events) and at least ``timing_share`` of them agree in timing; ``partially consistent``
when at least half agree in direction; ``inconsistent`` otherwise. Two runs with no change at all
are consistent (both look healthy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from moeproxy.signatures import dtw
from moeproxy.signatures.canonical import CanonicalRun, RunMetrics, canonicalise
from moeproxy.signatures.features import DEFAULT_PARAMS, RunSignature, SignatureParams, run_signature
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, MetricAlias

VERDICTS = ("consistent", "partially consistent", "inconsistent")


@dataclass(frozen=True)
class MetricConsistency:
    metric: str
    source_a: str
    source_b: str
    direction_a: int
    direction_b: int
    direction_agrees: bool
    onset_step_a: int | None
    onset_step_b: int | None
    onset_offset: int | None  # onset_b - onset_a in steps
    lag_difference: int | None  # (lag after run onset in b) - (in a), in steps
    timing_agrees: bool | None
    dtw_distance: float | None  # per point, z-normalised traces
    nonfinite_a: bool
    nonfinite_b: bool
    changed: bool  # changed (or went non-finite) in either run

    @property
    def agrees(self) -> bool:
        return self.direction_agrees and self.nonfinite_a == self.nonfinite_b


@dataclass(frozen=True)
class ConsistencyReport:
    verdict: str
    metrics: tuple[MetricConsistency, ...]
    onset_step_a: int | None
    onset_step_b: int | None
    direction_agreement: float | None  # share of changed metrics agreeing; None if none changed
    timing_agreement: float | None
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "onset_step_a": self.onset_step_a,
            "onset_step_b": self.onset_step_b,
            "direction_agreement": self.direction_agreement,
            "timing_agreement": self.timing_agreement,
            "shared_metrics": len(self.metrics),
            "changed_metrics": sum(m.changed for m in self.metrics),
            "metrics": [dict(asdict(m), agrees=m.agrees) for m in self.metrics],
            "only_a": list(self.only_a),
            "only_b": list(self.only_b),
        }


def consistency(a: RunMetrics | CanonicalRun | RunSignature, b: RunMetrics | CanonicalRun | RunSignature, *,
                aliases: Iterable[MetricAlias] = DEFAULT_ALIASES, framework_a: str | None = None,
                framework_b: str | None = None, params: SignatureParams = DEFAULT_PARAMS,
                onset_tolerance: int = 2, timing_share: float = 0.75) -> ConsistencyReport:
    alias_list = list(aliases)
    sa = _signature(a, alias_list, framework_a, params)
    sb = _signature(b, alias_list, framework_b, params)
    from moeproxy.signatures.build import EXCLUDED_METRICS, EXCLUDED_PREFIXES

    shared = sorted(m for m in set(sa.metrics) & set(sb.metrics)
                    if m not in EXCLUDED_METRICS and not m.startswith(EXCLUDED_PREFIXES))
    changed = [m for m in shared if _counts(sa, sb, m, params)]
    # The anomaly onset of each run: the earliest change point among the metrics that change the
    # same way in both runs (an lr warm-up or a noisy metric changing in one run only must not set it).
    common = [m for m in changed if sa.metrics[m].direction == sb.metrics[m].direction != 0]
    ta = _first_onset(sa, common or changed)
    tb = _first_onset(sb, common or changed)
    rows = tuple(_compare(sa, sb, m, ta, tb, m in changed, onset_tolerance) for m in shared)
    moving = [r for r in rows if r.changed]
    if not moving:
        verdict, d_share, t_share = "consistent", None, None
    else:
        d_share = sum(r.agrees for r in moving) / len(moving)
        timed = [r.timing_agrees for r in moving if r.timing_agrees is not None]
        t_share = sum(timed) / len(timed) if timed else None
        if d_share == 1.0 and (t_share is None or t_share >= timing_share):
            verdict = "consistent"
        elif d_share >= 0.5:
            verdict = "partially consistent"
        else:
            verdict = "inconsistent"
    step = lambda s, i: None if i is None else int(s.steps[i])
    report = ConsistencyReport(
        verdict, rows, step(sa, ta), step(sb, tb), d_share, t_share,
        tuple(sorted(set(sa.metrics) - set(sb.metrics))), tuple(sorted(set(sb.metrics) - set(sa.metrics))), "",
    )
    return ConsistencyReport(**{**report.__dict__, "summary": _summary(report)})


def _signature(run, aliases, framework, params) -> RunSignature:
    if isinstance(run, RunSignature):
        return run
    if isinstance(run, RunMetrics):
        run = canonicalise(run, aliases=aliases, framework=framework)
    return run_signature(run, params)


def _changed(s: RunSignature, m: str) -> bool:
    ms = s.metrics[m]
    return ms.direction != 0 or ms.has_nonfinite


def _counts(sa: RunSignature, sb: RunSignature, m: str, params: SignatureParams) -> bool:
    """A metric takes part in the verdict when it changed in both runs, or clearly (twice the
    detection threshold) in one: a marginal change in one run only is noise, not a disagreement."""
    a, b = _changed(sa, m), _changed(sb, m)
    if a and b:
        return True

    def clear(s: RunSignature) -> bool:
        ms = s.metrics[m]
        return ms.has_nonfinite or (ms.direction != 0 and abs(ms.effect_z) >= 2 * params.min_effect)

    return (a and clear(sa)) or (b and clear(sb))


def _first_onset(s: RunSignature, names) -> int | None:
    idx = [s.metrics[n].onset_index for n in names if s.metrics[n].onset_index is not None]
    return min(idx) if idx else None


def _stride(s: RunSignature) -> int:
    return int(s.steps[1] - s.steps[0]) if s.steps.size > 1 else 1


def _compare(sa: RunSignature, sb: RunSignature, m: str, ta: int | None, tb: int | None, changed: bool,
             tol: int) -> MetricConsistency:
    ma, mb = sa.metrics[m], sb.metrics[m]
    offset = None
    if ma.onset_step is not None and mb.onset_step is not None:
        offset = mb.onset_step - ma.onset_step
    lag_diff = timing = None
    if changed and ma.onset_index is not None and mb.onset_index is not None and ta is not None and tb is not None:
        lag_a = (ma.onset_index - ta) * _stride(sa)
        lag_b = (mb.onset_index - tb) * _stride(sb)
        lag_diff = int(lag_b - lag_a)
        timing = abs(lag_diff) <= tol
    dist = None
    if changed and ta is not None and tb is not None:
        xa = sa.effect_trace(m, ta)
        xb = sb.effect_trace(m, tb)
        n = min(xa.size, xb.size)
        if n >= 4:
            d = dtw.dtw_distance(dtw.znorm(xa[:n]), dtw.znorm(xb[:n]), radius=dtw.band_radius(n))
            dist = round(d / np.sqrt(n), 4)
    return MetricConsistency(
        metric=m, source_a=ma.source, source_b=mb.source, direction_a=ma.direction, direction_b=mb.direction,
        direction_agrees=ma.direction == mb.direction, onset_step_a=ma.onset_step, onset_step_b=mb.onset_step,
        onset_offset=offset, lag_difference=lag_diff, timing_agrees=timing, dtw_distance=dist,
        nonfinite_a=ma.has_nonfinite, nonfinite_b=mb.has_nonfinite, changed=changed,
    )


def _summary(r: ConsistencyReport) -> str:
    moving = [m for m in r.metrics if m.changed]
    if not moving:
        return f"no metric changed in either run ({len(r.metrics)} shared metrics): both look healthy"
    agree = [m.metric for m in moving if m.agrees]
    disagree = [m.metric for m in moving if not m.agrees]
    text = f"{len(agree)} of {len(moving)} changed metrics move the same way"
    if r.onset_step_a is not None and r.onset_step_b is not None:
        text += f"; anomaly onset at step {r.onset_step_a} vs {r.onset_step_b}"
    if disagree:
        text += f"; differing: {', '.join(disagree[:5])}"
    return text
