"""Matching a run against the fingerprint library: scores, strength, evidence, verdict.

For each fingerprint, over the canonical metrics the fingerprint and the run share:

- **direction** — the run's change against its own pre-onset baseline (features.py) vs the
  expected direction; a metric the fingerprint calls unaffected but the run shows changing counts
  as a disagreement with full weight;
- **shape** — banded DTW between the run's z-normalised effect trace and the fingerprint's
  representative traces (aligned on the class onset: the earliest onset among the class's
  affected metrics), best of the representatives;
- **timing** — the onset lag of each affected metric after the class onset vs the fingerprint's;
- **non-finite events** — expected NaN/inf (``gradient_overflow``) present, or unexpected ones;
- **freeze events** — a metric that stops moving for good (``actor/ppo_kl`` exactly 0 once the
  optimizer stops stepping) where the fingerprint's runs froze it, or did not; a freeze moves no
  median, so without this term an omitted update reads as a quiet healthy run;
- **magnitude** — the level-shift ratio, a light term (proxy and production scales differ).

Each part is a small function registered in :data:`PART_SCORERS`; every weight and constant they
use is a field of :class:`Weights` (defaults in :data:`WEIGHTS`). The weighted mean of the parts is
multiplied by a coverage factor (a run that logs only some of the affected metrics cannot match
fully), giving a score in [0, 1]. A class scores
as its best fingerprint. ``strong`` means score ≥ the library's calibrated threshold.

Partial runs work as they are: the effect traces are shorter and fingerprint traces are truncated
to the same length before DTW.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from moeproxy.reproduction.catalogue import FAMILIES
from moeproxy.signatures import dtw
from moeproxy.signatures.canonical import CanonicalRun, RunMetrics, canonicalise
from moeproxy.signatures.features import MetricSignature, RunSignature, run_signature
from moeproxy.signatures.fingerprint import Fingerprint, FingerprintLibrary, MetricExpectation
from moeproxy.signatures.levels import MISMATCH_CLASSES, Finding, whole_run_evidence
from moeproxy.signatures.settings import DEFAULT_SETTINGS, RunSettings
from moeproxy.signatures.siblings import SiblingNote, sibling_notes
from moeproxy.signatures.vocabulary import CONTROL_METRICS, DEFAULT_ALIASES, MetricAlias


@dataclass(frozen=True)
class Weights:
    """Every number the matcher scores with: the weight of each part of a metric's score, and the
    constants inside the parts. Part scores run from 0 (disagrees) to 1 (agrees); those two ends are
    the scale, not tunable, and are written as 0.0 and 1.0 where they are used."""

    # weights of the parts (docs/signatures.md, section 4, "weight" column)
    direction_affected: float = 1.0
    direction_unaffected: float = 0.1
    surprise_change: float = 1.0  # an "unaffected" metric that changed in the run
    shape: float = 1.0
    timing: float = 0.5
    nonfinite: float = 2.0
    freeze: float = 1.5
    magnitude: float = 0.3
    trend: float = 0.5
    volatility: float = 1.0
    direction_flat_affected: float = 0.2  # an affected metric expected flat: its spread or trend
    # is the evidence, agreeing on "no change" says little
    # constants inside the parts
    shape_sharpness: float = 1.0  # s_shape = exp(-sharpness * dtw^2 / length)
    shape_min_post_points: int = 2  # run points after the onset needed before shapes are compared
    direction_missed_floor: float = 0.25  # an expected change the run does not show, by a fingerprint
    # whose runs all showed it; it rises to 1 as the share of its runs that showed it falls
    direction_surprise_score: float = 0.15  # a metric expected flat that changed
    trend_one_flat_score: float = 0.3  # post-onset trends where one of run and fingerprint is flat
    timing_no_onset_score: float = 0.3  # an affected metric with an expected lag but no onset in the run
    timing_tau_min: float = 2.0  # s_time = exp(-|lag - expected| / tau), tau = max(min, per_spread * spread)
    timing_tau_per_spread: float = 2.0
    nonfinite_expected_rate: float = 0.5  # share of the fingerprint's runs with NaN/inf to expect them
    freeze_expected_rate: float = 0.5  # share of the fingerprint's runs that froze the metric to score it
    coverage_floor: float = 0.5  # score = raw * (floor + (1 - floor) * coverage)
    # whole-run evidence (levels.py): a class's final score is
    #   (mass * fingerprint score + sum of the weights of the findings supporting it)
    #   / (mass + the same + the weights of the findings against it)
    evidence_mass: float = 4.0  # what the fingerprint comparison weighs against the findings
    # A finding of at least this weight states the class's definition (SPEC section 3: a NaN
    # gradient norm is an overflow, a gradient of exactly 0 no update); where one names a class
    # alone and nothing counts against it, the class is ``strong`` whatever its score. None: only
    # the calibrated threshold makes a class strong.
    definitional_weight: float | None = 4.0
    finding_weights: Mapping[str, float] = field(default_factory=lambda: dict(FINDING_WEIGHTS))
    finding_default: float = 1.0  # a rule without an entry in finding_weights
    flat_only_finding_weight: float = 2.0  # a flat-only fingerprint counts beside a finding for its
    # class of at least this weight (a definition or a documented range, not a trend a slow healthy
    # run misses too)
    flat_in_view: bool = True  # a fingerprint flat-only as the run sees it (flat_in_view) is held
    # like a flat-only one: counted only beside a finding for its class
    above_twins: bool = True  # a fault fingerprint scores a run only where it scores it above the
    # best of its own healthy twins (Fingerprint.twin_score): a run that looks no more like the fault
    # than a run without it is no evidence for it
    needs_primary: bool = True  # a class whose defining symptom the run does not log at all
    # (PRIMARY_EVIDENCE) is held like a flat-only fingerprint: what is left are side effects that
    # other classes move too


#: How much each whole-run rule weighs (in units of one fingerprint-score mass of ``evidence_mass``):
#: the definitional ones (NaN, a gradient of exactly 0, tied rewards from the start) nearly as much as
#: the whole fingerprint comparison, a documented range less, a trend against healthy dynamics least.
FINDING_WEIGHTS: dict[str, float] = {
    "nonfinite": 4.0,
    "nonfinite_update_skipped": 4.0,
    "kl_term_nonfinite": 4.0,
    "grad_norm_zero": 4.0,
    "update_not_applied": 4.0,
    "router_changed_outside_optimizer": 3.0,
    "kl_never_moves": 4.0,
    "kl_still_while_weights_move": 3.0,
    "kl_coef_negative": 4.0,
    "no_reward_signal": 3.0,
    "reward_stuck": 3.0,
    "reward_component_silent": 3.0,
    "lr_level": 3.0,
    "kl_coef_level": 3.0,
    "lr_never_reached": 3.0,
    "ratio_spikes": 3.0,
    "rollout_mismatch_level": 2.0,
    "routing_agreement_level": 2.0,
    "sync_sawtooth": 2.0,
    "mismatch_grows": 2.0,
    "importance_ratio_level": 2.0,
    "kl_step_jump": 2.0,
    "balance_loss_rises": 2.0,
    "kl_runaway": 1.5,
    "length_pinned": 1.0,
    "entropy_extreme": 1.0,
    "reward_never_rises": 1.0,
}

WEIGHTS = Weights()


@dataclass(frozen=True)
class MetricMatch:
    metric: str
    source: str
    affected: bool
    expected_direction: int
    observed_direction: int | None  # None: the run does not log it
    direction_score: float | None
    shape_score: float | None = None
    dtw_distance: float | None = None
    timing_score: float | None = None
    expected_lag: float | None = None
    observed_lag: int | None = None
    nonfinite_score: float | None = None
    freeze_score: float | None = None
    magnitude_score: float | None = None
    volatility_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class FingerprintScore:
    fingerprint: Fingerprint
    score: float
    matches: tuple[MetricMatch, ...]
    onset_index: int | None
    coverage: float


@dataclass(frozen=True)
class Candidate:
    fault_class: str
    family: str
    score: float
    strength: str
    evidence: tuple[str, ...]
    fingerprint_id: str
    onset_step: int | None
    matches: tuple[MetricMatch, ...] = ()
    fingerprint_score: float | None = None  # before the whole-run findings (None: no findings)
    findings: tuple[Finding, ...] = ()  # the whole-run findings for or against this class

    @property
    def before_findings(self) -> float:
        """The class's score from its fingerprints alone, before the whole-run findings moved it."""
        return self.score if self.fingerprint_score is None else self.fingerprint_score

    def to_dict(self, *, details: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "fault_class": self.fault_class,
            "family": self.family,
            "score": round(self.score, 4),
            "strength": self.strength,
            "evidence": list(self.evidence),
        }
        if details:
            d["fingerprint_id"] = self.fingerprint_id
            d["onset_step"] = self.onset_step
            d["metrics"] = [m.to_dict() for m in self.matches]
            d["fingerprint_score"] = None if self.fingerprint_score is None else round(self.fingerprint_score, 4)
            d["findings"] = [f.rule for f in self.findings]
        return d


@dataclass(frozen=True)
class TriageResult:
    run_id: Any
    evaluated_at: datetime
    candidates: tuple[Candidate, ...]
    verdict: str
    change_points: Mapping[str, int] = field(default_factory=dict)  # logged name -> onset step
    last_step: int | None = None
    strong_threshold: float = 0.0
    view: str | None = None  # the calibrated metric set whose threshold applies (None: library-wide)
    findings: tuple[Finding, ...] = ()  # whole-run evidence (levels.py)
    siblings: tuple[SiblingNote, ...] = ()  # top candidates that tie on shared evidence (siblings.py)

    @property
    def top(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def to_dict(self, *, details: bool = False) -> dict[str, Any]:
        """The triage object of SPEC section 5; ``details`` adds the matched fingerprint, the
        per-metric scores and the detected change points (for the triage page's plots)."""
        d: dict[str, Any] = {
            "run_id": self.run_id,
            "evaluated_at": self.evaluated_at.isoformat(),
            "candidates": [c.to_dict(details=details) for c in self.candidates],
            "verdict": self.verdict,
            "siblings": [note.to_dict() for note in self.siblings],
        }
        if details:
            d["change_points"] = dict(self.change_points)
            d["last_step"] = self.last_step
            d["strong_threshold"] = self.strong_threshold
            d["view"] = self.view
            d["findings"] = [f.to_dict() for f in self.findings]
        return d


# --------------------------------------------------------------------------------------------


def triage(run: RunMetrics | CanonicalRun | RunSignature, library: FingerprintLibrary, *,
           framework: str | None = None, aliases: Iterable[MetricAlias] = DEFAULT_ALIASES,
           run_id: Any = None, now: datetime | None = None, weights: Weights = WEIGHTS,
           settings: RunSettings | None = None) -> TriageResult:
    """Rank every fault class of ``library`` (healthy included) for one run: each class's best
    fingerprint score, combined with the run's whole-run findings, judged against the threshold of
    the calibrated metric set nearest to what the run logs. ``settings`` (what the run's config
    says, settings.py) applies to a run canonicalised here; a ``RunSignature`` carries its own."""
    sig = _signature(run, library, framework, aliases, settings)
    findings = tuple(whole_run_evidence(sig.run))
    # Classes a definitional or documented-range finding of this run supports: a flat-only
    # fingerprint (it expects only the absence of its twins' drift) is evidence beside one of them
    # (a KL that never moves, tied rewards from step 0) and matches any quiet run without.
    shown = {c for f in findings if weights.finding_weights.get(f.rule, weights.finding_default)
             >= weights.flat_only_finding_weight for c in f.supports}
    by_class: dict[str, FingerprintScore] = {}
    for fp in library.fingerprints:
        s = score_fingerprint(sig, fp, library, weights)
        flat_here = (fp.flat_only or (weights.flat_in_view and flat_in_view(fp, sig))
                     or (weights.needs_primary and lacks_primary(fp, sig)))
        if (not fp.separable or (flat_here and fp.fault_class not in shown)
                or (weights.above_twins and fp.twin_score is not None and s.score <= fp.twin_score)):
            # Its own healthy twins match it as well as its fault runs, it expects what any quiet
            # run shows, or this run matches it no better than one of its healthy twins did: it
            # keeps its class on the list (whole-run findings may still name it) but adds no score
            # of its own.
            s = FingerprintScore(fp, 0.0, s.matches, s.onset_index, s.coverage)
        best = by_class.get(fp.fault_class)
        if best is None or s.score > best.score:
            by_class[fp.fault_class] = s
    view, thr = library.calibration.threshold_for(set(sig.metrics) & library_metrics(library))
    scored = [_candidate(sig, s, thr, weights, findings) for s in by_class.values()]
    candidates = ranked(scored, findings)
    change_points = {m.source: m.onset_step for m in sig.metrics.values() if m.onset_step is not None}
    return TriageResult(
        run_id=run_id,
        evaluated_at=now or datetime.now(UTC),
        candidates=candidates,
        verdict=verdict(candidates),
        change_points=change_points,
        last_step=int(sig.steps[-1]) if sig.steps.size else None,
        strong_threshold=thr,
        view=view,
        findings=findings,
        siblings=sibling_notes(candidates, logged=set(sig.metrics)),
    )


#: Scores equal to this many digits are a tie (the same findings over the same fingerprint score).
TIE_DIGITS = 9


def ranked(candidates: Iterable[Candidate], findings: Sequence[Finding]) -> tuple[Candidate, ...]:
    """Strong before weak (a class strong by definition can score under a weak one), then best score
    first; equal scores in the order the supporting findings list their classes."""
    return tuple(sorted(candidates, key=lambda c: (c.strength != "strong", -round(c.score, TIE_DIGITS),
                                                   tie_rank(c.fault_class, findings), c.fault_class)))


def tie_rank(fault_class: str, findings: Iterable[Finding]) -> float:
    """Where the findings supporting ``fault_class`` list it (``Finding.supports`` puts the cause
    its source names first): the order of classes that score alike because one finding is all the
    run shows of them (a rollout/training difference above verl's 0.01 with no fingerprint seen).
    A class no finding supports comes after those that one does."""
    return min((f.supports.index(fault_class) for f in findings if fault_class in f.supports), default=math.inf)


#: The metrics that show a class's defining symptom: a rollout/trainer mismatch is the difference
#: between the rollout's and the trainer's log-probs, routing or importance ratios (SPEC section 3);
#: what it does to the reward or the KL to the reference, other classes do as well.
MISMATCH_EVIDENCE = frozenset({"rollout_train_logp_diff", "rollout_train_logp_diff_max", "rollout_train_logp_diff_std",
                               "rollout_kl", "importance_ratio", "importance_ratio_min", "importance_ratio_max",
                               "routing_agreement"})
PRIMARY_EVIDENCE: dict[str, frozenset[str]] = {c: MISMATCH_EVIDENCE for c in MISMATCH_CLASSES}


def lacks_primary(fp: Fingerprint, sig: RunSignature) -> bool:
    """The run logs none of the metrics that show ``fp``'s class's defining symptom."""
    need = PRIMARY_EVIDENCE.get(fp.fault_class)
    return need is not None and not need & sig.metrics.keys()


def flat_in_view(fp: Fingerprint, sig: RunSignature) -> bool:
    """A fault fingerprint is flat-only as this run sees it: of its affected metrics the run logs
    none, or only ones its runs left flat (``MetricExpectation.flat``). What told its runs from their
    twins (a frozen ``actor/ppo_kl``, the MoE and rollout-correction metrics of the engine's full
    view) is then not in the run, and what is left agrees with any quiet healthy run: a real TRL
    run that learns slowly matched the step-skip fingerprint at 0.64 on agreement alone."""
    if fp.fault_class == "healthy":
        return False
    return all(fp.metrics[m].flat for m in fp.affected_metrics if m not in CONTROL_METRICS and m in sig.metrics)


def library_metrics(library: FingerprintLibrary) -> frozenset[str]:
    """Every canonical metric some fingerprint of ``library`` compares (settings excluded)."""
    cache = library.__dict__.setdefault("_metrics", {})
    if "all" not in cache:
        cache["all"] = frozenset(m for fp in library.fingerprints for m in fp.metrics) - CONTROL_METRICS
    return cache["all"]


def by_definition(fault_class: str, findings: Sequence[Finding], w: Weights = WEIGHTS) -> Finding | None:
    """The finding that establishes ``fault_class`` by its definition: one of at least
    ``definitional_weight`` that supports this class alone, with no finding of the run against the
    class. On campaign v2's 189 runs (three views) and every evaluation set such findings fire only
    on runs of the class they name (docs/signatures.md, "Strong by definition")."""
    if w.definitional_weight is None or any(fault_class in f.against for f in findings):
        return None
    return next((f for f in findings if f.supports == (fault_class,)
                 and w.finding_weights.get(f.rule, w.finding_default) >= w.definitional_weight), None)


def with_findings(score: float, fault_class: str, findings: Iterable[Finding], w: Weights = WEIGHTS) -> float:
    """A class's fingerprint score moved by the whole-run findings: toward 1 by each finding that
    supports the class, toward 0 by each that is evidence against it, by the finding's weight
    against ``evidence_mass``. Findings about other classes leave it where it is."""
    num = den = w.evidence_mass
    num *= score
    for f in findings:
        weight = w.finding_weights.get(f.rule, w.finding_default)
        if fault_class in f.supports:
            num += weight
            den += weight
        elif fault_class in f.against:
            den += weight
    return num / den


def _signature(run, library, framework, aliases, settings: RunSettings | None) -> RunSignature:
    if isinstance(run, RunSignature):
        return run
    if isinstance(run, RunMetrics):
        run = canonicalise(run, aliases=aliases, framework=framework, settings=settings or DEFAULT_SETTINGS)
    elif settings is not None:
        run = replace(run, settings=settings)
    return run_signature(run, library.params)


def verdict(candidates: Sequence[Candidate]) -> str:
    if not candidates:
        return "no fingerprints to compare with"
    top = candidates[0]
    if top.strength == "strong":
        if top.fault_class == "healthy":
            return f"healthy: no fault signature matches (healthy score {top.score:.2f})"
        second = next((c for c in candidates[1:] if c.strength == "strong"), None)
        also = f"; also consistent with {second.fault_class} ({second.score:.2f})" if second else ""
        return f"likely {top.fault_class} ({FAMILIES[top.family]}), score {top.score:.2f}{also}"
    return (f"no confident match: closest is {top.fault_class} (weak, {top.score:.2f}); "
            "the fault may be outside the library")


def score_fingerprint(sig: RunSignature, fp: Fingerprint, library: FingerprintLibrary | None = None,
                      weights: Weights = WEIGHTS) -> FingerprintScore:
    onset = class_onset(sig, fp) if fp.aligned else None
    num = den = 0.0
    cover_have = cover_all = 0.0
    matches = []
    for name, exp in fp.metrics.items():
        if name in CONTROL_METRICS:  # a setting is not model behaviour (vocabulary.CONTROL_METRICS)
            continue
        w_cover = weights.direction_affected if exp.affected else weights.direction_unaffected
        cover_all += w_cover
        ms = sig.metrics.get(name)
        if ms is None:
            matches.append(MetricMatch(name, exp.source, exp.affected, exp.direction, None, None))
            continue
        cover_have += w_cover
        parts, match = _metric_parts(sig, ms, exp, fp, onset, weights)
        matches.append(match)
        for w, s in parts:
            num += w * s
            den += w
    raw = num / den if den > 0 else 0.0
    coverage = cover_have / cover_all if cover_all > 0 else 0.0
    score = raw * (weights.coverage_floor + (1.0 - weights.coverage_floor) * coverage)
    return FingerprintScore(fp, float(np.clip(score, 0.0, 1.0)), tuple(matches), onset, coverage)


def class_onset(sig: RunSignature, fp: Fingerprint) -> int | None:
    """Where the fingerprint's fault would have started in this run.

    Every affected metric with an onset in the run votes ``its onset − the fingerprint's lag``;
    the weighted median of the votes (weights fall with the lag's spread across the proxy runs)
    is robust to one metric with an unrelated early change point. Without any lag, the earliest
    onset among the affected metrics. A fault the fingerprint's runs had from their first step
    starts at the run's first step: such a fault has no change point to find."""
    if fp.from_start:
        return 0
    votes, weights = [], []
    for name in fp.affected_metrics:
        ms = sig.metrics.get(name)
        exp = fp.metrics[name]
        if ms is None or ms.event_index is None or exp.onset_lag is None:
            continue
        votes.append(ms.event_index - exp.onset_lag)
        weights.append(1.0 / (1.0 + exp.onset_lag_spread))
    if not votes:
        return sig.onset_of(fp.affected_metrics)
    order = np.argsort(votes)
    v, w = np.asarray(votes)[order], np.asarray(weights)[order]
    k = int(np.searchsorted(np.cumsum(w), 0.5 * w.sum()))
    return int(np.clip(round(v[min(k, v.size - 1)]), 0, sig.steps.size - 1))


@dataclass(frozen=True)
class MetricContext:
    """What a part-scorer sees: one metric of the run and the fingerprint's expectation of it."""

    sig: RunSignature
    ms: MetricSignature
    exp: MetricExpectation
    fp: Fingerprint
    onset: int | None  # the class onset in the run (None: not aligned, or no onset found)
    w: Weights


@dataclass(frozen=True)
class Part:
    """One term of a metric's score: weight, score in [0, 1], and further :class:`MetricMatch`
    fields it explains (the DTW distance behind a shape score, the lag behind a timing score)."""

    weight: float
    score: float
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartScorer:
    """A registered part: ``score`` returns a :class:`Part`, or None where it does not apply to
    this metric; ``match_field`` is the :class:`MetricMatch` field that records the score."""

    score: Callable[[MetricContext], Part | None]
    match_field: str | None = None


#: name -> part-scorer, in the order the parts are summed. Adding a part is adding an entry.
PART_SCORERS: dict[str, PartScorer] = {}


def register_part(name: str, *, match_field: str | None = None):
    def add(fn: Callable[[MetricContext], Part | None]) -> Callable[[MetricContext], Part | None]:
        PART_SCORERS[name] = PartScorer(fn, match_field)
        return fn

    return add


@register_part("direction", match_field="direction_score")
def direction_part(c: MetricContext) -> Part:
    exp, ms, w = c.exp, c.ms, c.w
    if exp.direction != 0:
        # A change the proxy runs showed in only some seeds is missed at a smaller cost.
        missed = w.direction_missed_floor + (1.0 - w.direction_missed_floor) * (1.0 - exp.agreement)
        score = 1.0 if ms.direction == exp.direction else (missed if ms.direction == 0 else 0.0)
        return Part(w.direction_affected if exp.affected else w.direction_unaffected, score)
    # A change along the trend the fingerprint's runs show is no surprise: a healthy KL that grows
    # steadily has a significant rise in some runs and only a trend in others, and a reward that
    # rises by many noise widths in a large-batch run only drifts up in small-batch proxy runs.
    along_trend = ms.direction != 0 and ms.direction in (exp.trend, exp.drift)
    score = 1.0 if ms.direction == 0 or along_trend else w.direction_surprise_score
    if ms.direction != 0 and not along_trend:
        weight = w.surprise_change
    else:
        weight = w.direction_flat_affected if exp.affected else w.direction_unaffected
    return Part(weight, score)


@register_part("nonfinite", match_field="nonfinite_score")
def nonfinite_part(c: MetricContext) -> Part | None:
    expected = c.exp.nonfinite_rate >= c.w.nonfinite_expected_rate
    if not (expected or c.ms.has_nonfinite):
        return None
    return Part(c.w.nonfinite, 1.0 if c.ms.has_nonfinite == expected else 0.0)


@register_part("freeze", match_field="freeze_score")
def freeze_part(c: MetricContext) -> Part | None:
    # Scored by how often the fingerprint's runs froze the metric, so a metric that freezes now
    # and then in healthy runs (pg_clipfrac stuck at 0 under a small LR) costs little.
    rate = c.exp.freeze_rate
    if not (rate >= c.w.freeze_expected_rate or c.ms.frozen):
        return None
    return Part(c.w.freeze, rate if c.ms.frozen else 1.0 - rate)


def _aligned_affected(c: MetricContext) -> bool:
    """Shape and timing compare traces aligned on the class onset: affected metrics of aligned
    fingerprints only, and not flat ones (the shape of noise, z-normalised, is noise)."""
    return c.exp.affected and c.fp.aligned and not c.exp.flat


@register_part("shape", match_field="shape_score")
def shape_part(c: MetricContext) -> Part | None:
    if not (_aligned_affected(c) and c.exp.traces):
        return None
    if c.onset is None:  # a fault with an expected shape and no onset in the run
        return Part(c.w.shape, 0.0)
    score, d_min = _shape_score(c.sig, c.ms.name, c.onset, c.exp, c.fp.trace_pre, c.w)
    return None if score is None else Part(c.w.shape, score, {"dtw_distance": d_min})


@register_part("timing", match_field="timing_score")
def timing_part(c: MetricContext) -> Part | None:
    exp, w = c.exp, c.w
    if not _aligned_affected(c) or c.onset is None or exp.onset_lag is None:
        return None
    if c.ms.event_index is None:
        return Part(w.timing, w.timing_no_onset_score)
    lag = c.ms.event_index - c.onset
    tau = max(w.timing_tau_min, w.timing_tau_per_spread * exp.onset_lag_spread)
    return Part(w.timing, math.exp(-abs(lag - exp.onset_lag) / tau), {"observed_lag": lag})


@register_part("trend")
def trend_part(c: MetricContext) -> Part | None:
    """Post-onset trend of an affected metric (a frozen KL vs a growing one)."""
    run, expected = c.ms.trend, c.exp.trend
    if expected == 0:
        # Where the fingerprint's runs show no trend, compare drifts (significant trends too small
        # to gate): a healthy fingerprint's reward only drifts up in small-batch runs, and a fault
        # that takes the learning away leaves its runs without the drift their twins show; with
        # trends alone a learning run would look like either.
        run, expected = c.ms.drift, c.exp.drift
    if not c.exp.affected or (expected == 0 and run == 0):
        return None
    score = 1.0 if run == expected else (c.w.trend_one_flat_score if 0 in (run, expected) else 0.0)
    return Part(c.w.trend, score)


@register_part("volatility", match_field="volatility_score")
def volatility_part(c: MetricContext) -> Part | None:
    """Spread around the class onset (a metric that freezes or starts to spike)."""
    if not c.exp.affected or c.exp.log10_volatility is None or c.onset is None:
        return None
    vol = c.sig.volatility(c.ms.name, c.onset)
    if vol is None:
        return None
    return Part(c.w.volatility, math.exp(-abs(vol - c.exp.log10_volatility)))


@register_part("magnitude", match_field="magnitude_score")
def magnitude_part(c: MetricContext) -> Part | None:
    exp, ratio = c.exp, c.ms.ratio
    if not (exp.affected and exp.log10_ratio is not None and ratio is not None and ratio > 0 and exp.direction):
        return None
    return Part(c.w.magnitude, math.exp(-abs(math.log10(ratio) - exp.log10_ratio)))


def _metric_parts(sig: RunSignature, ms: MetricSignature, exp: MetricExpectation, fp: Fingerprint,
                  onset: int | None, w: Weights) -> tuple[list[tuple[float, float]], MetricMatch]:
    """The (weight, score) of every registered part that applies, and the metric's match record."""
    context = MetricContext(sig, ms, exp, fp, onset, w)
    parts: list[tuple[float, float]] = []
    recorded: dict[str, Any] = {"direction_score": None, "expected_lag": exp.onset_lag}
    for scorer in PART_SCORERS.values():
        part = scorer.score(context)
        if part is None:
            continue
        parts.append((part.weight, part.score))
        if scorer.match_field is not None:
            recorded[scorer.match_field] = part.score
        recorded.update(part.details)
    return parts, MetricMatch(ms.name, ms.source, exp.affected, exp.direction, ms.direction, **recorded)


def _shape_score(sig: RunSignature, name: str, onset: int, exp: MetricExpectation, pre: int,
                 w: Weights) -> tuple[float | None, float | None]:
    trace = sig.effect_trace(name, onset, pre=pre)
    n = min(trace.size, min(len(t) for t in exp.traces))
    if n < pre + w.shape_min_post_points:  # too little of the run after the onset to compare shapes
        return None, None
    q = dtw.znorm(trace[:n])
    d = float(dtw.one_to_many(q, _reference_stack(exp, n), radius=dtw.band_radius(n)).min())
    return math.exp(-w.shape_sharpness * d * d / n), d


def _reference_stack(exp: MetricExpectation, n: int) -> np.ndarray:
    """The fingerprint's traces truncated to ``n`` and z-normalised, cached on the (frozen,
    immutable) expectation: a partial run asks for the same few lengths again and again."""
    cache = exp.__dict__.setdefault("_stacks", {})
    if n not in cache:
        cache[n] = np.stack([dtw.znorm(np.asarray(t[:n])) for t in exp.traces])
    return cache[n]


# --------------------------------------------------------------------------------------------
# evidence in plain words


def _candidate(sig: RunSignature, s: FingerprintScore, threshold: float, weights: Weights,
               findings: Sequence[Finding] = ()) -> Candidate:
    fp = s.fingerprint
    mine = tuple(f for f in findings if fp.fault_class in f.supports or fp.fault_class in f.against)
    score = with_findings(s.score, fp.fault_class, mine, weights) if mine else s.score
    defining = by_definition(fp.fault_class, mine, weights)
    strength = "strong" if score >= threshold or defining else "weak"
    onset_step = None if s.onset_index is None else int(sig.steps[s.onset_index])
    lines = [f.text if fp.fault_class in f.supports else f"against {fp.fault_class}: {f.text}" for f in mine]
    if defining and score < threshold:
        lines.append(f"strong by definition: {defining.rule} is what {fp.fault_class} means, and nothing in the run "
                     f"counts against it (its score, {score:.2f}, is under this view's strong threshold {threshold:.2f})")
    return Candidate(fp.fault_class, fp.family, score, strength, tuple(lines + evidence(sig, s, weights=weights)),
                     fp.id, onset_step, s.matches, s.score if mine else None, mine)


def describe_metric(ms: MetricSignature) -> str | None:
    """One metric's own change in words, or None when it did not change."""
    src = ms.source
    if ms.has_nonfinite:
        kinds = ", ".join(f"{k}×{n}" for k, n in (("NaN", ms.nan_count), ("+inf", ms.posinf_count),
                                                   ("-inf", ms.neginf_count)) if n)
        return (f"{src} non-finite from step {ms.first_nonfinite_step} "
                f"({ms.nonfinite_count} of {ms.n_points} steps: {kinds})")
    if ms.direction == 0:
        if ms.frozen:
            return f"{src} stopped moving: constant {ms.freeze_value:.4g} from step {ms.freeze_step}"
        return None
    if ms.onset_step is not None:
        at = f"at step {ms.onset_step}"
        if ms.ratio is not None and ms.ratio >= 2.0:
            text = f"{src} jumped ×{_fmt(ms.ratio)} {at}"
        elif ms.ratio is not None and 0 < ms.ratio <= 0.5:
            text = f"{src} dropped to ×{_fmt(ms.ratio)} of its baseline {at}"
        else:
            verb = "rose" if ms.direction > 0 else "fell"
            if ms.flat_baseline:
                text = f"{src} {verb} from a constant {ms.baseline_level:.4g} to {ms.post_level:.4g} {at}"
            else:
                text = f"{src} {verb} by {abs(ms.effect_z):.1f} baseline σ {at}"
        if ms.frozen:
            text += f", constant {ms.freeze_value:.4g} from step {ms.freeze_step}"
        elif ms.trend:
            text += f", {'rising' if ms.trend > 0 else 'falling'} after it"
        return text
    return f"{src} {'rising' if ms.direction > 0 else 'falling'} over the run (no single change point)"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:.2e}"


def evidence(sig: RunSignature, s: FingerprintScore, *, limit: int = 4, weights: Weights = WEIGHTS) -> list[str]:
    fp = s.fingerprint
    lines: list[str] = []
    agree = [m for m in s.matches if m.affected and m.observed_direction is not None
             and ((m.direction_score or 0) >= 1.0 or (m.freeze_score or 0) >= 0.5)
             and (m.nonfinite_score is None or m.nonfinite_score > 0)]
    agree.sort(key=lambda m: (sig.metrics[m.metric].onset_index is None, -(abs(sig.metrics[m.metric].effect_z))))
    for m in agree:
        text = describe_metric(sig.metrics[m.metric])
        if text:
            lines.append(text)
        if len(lines) >= limit - 1:
            break
    lines.append(_summary(fp, s))
    contrary = [m for m in s.matches if m.observed_direction is not None and (m.direction_score or 0) <= weights.direction_surprise_score]
    for m in contrary[:2]:
        seen = describe_metric(sig.metrics[m.metric]) or f"{m.source} did not change"
        lines.append(f"against {fp.fault_class}: {seen} (expected {_dir_word(m.expected_direction)})")
    missing = [m.source for m in s.matches if m.affected and m.observed_direction is None]
    if missing:
        lines.append(f"not logged by this run: {', '.join(missing[:4])}")
    return lines


def _dir_word(d: int) -> str:
    return {1: "a rise", -1: "a fall", 0: "no change"}[d]


def _summary(fp: Fingerprint, s: FingerprintScore) -> str:
    aff = [m for m in s.matches if m.affected and m.observed_direction is not None]
    if fp.fault_class == "healthy":
        surprises = [m.source for m in s.matches if (m.expected_direction == 0 and m.observed_direction)
                     or (m.freeze_score is not None and m.freeze_score < 0.5)]
        if not surprises:
            return "no unexpected change point or trend; looks like the healthy reference runs"
        return f"healthy runs do not show the changes in {', '.join(surprises[:3])}"
    if not aff:
        return f"the run logs none of the metrics {fp.fault_class} affects"
    dir_ok = sum((m.direction_score or 0) >= 1.0 for m in aff) / len(aff)
    timing = [m.timing_score for m in aff if m.timing_score is not None]
    shape = [m.shape_score for m in aff if m.shape_score is not None]
    good = ["direction"]
    if timing and np.mean(timing) >= 0.6:
        good.append("timing")
    if shape and np.mean(shape) >= 0.5:
        good.append("shape")
    what = ", ".join(good[:-1]) + " and " + good[-1] if len(good) > 1 else good[0]
    if dir_ok >= 0.75:
        return f"matches {fp.fault_class} in {what} ({fp.id})"
    if dir_ok >= 0.5:
        return f"partly matches {fp.fault_class}: {dir_ok:.0%} of its affected metrics move as expected"
    return f"weak resemblance to {fp.fault_class}: only {dir_ok:.0%} of its affected metrics move as expected"


def expected_traces(sig: RunSignature, fp: Fingerprint) -> dict[str, dict[str, list]]:
    """The fingerprint's expected shape of each affected metric in the run's own units and steps
    (for plots): its mean effect trace, placed at the class onset this run is matched with, mapped
    back from baseline units as ``level + trace * scale`` (the inverse of ``effect_trace``)."""
    onset = class_onset(sig, fp) if fp.aligned else None
    if onset is None:
        return {}
    steps = sig.run.steps
    out: dict[str, dict[str, list]] = {}
    for name in fp.affected_metrics:
        exp = fp.metrics[name]
        trace = exp.mean_trace()
        if name not in sig.metrics or trace is None or trace.size == 0:
            continue
        series = sig.run.metrics[name]
        lo = max(0, onset - fp.trace_pre)
        base = series.values[lo:onset] if onset > lo else series.values[:1]
        level = float(np.median(base))
        scale = max(sig.metrics[name].baseline_scale, 1e-6 * abs(level) + 1e-12)
        idx = np.arange(onset - fp.trace_pre, onset - fp.trace_pre + trace.size)
        keep = (idx >= 0) & (idx < steps.size)
        if keep.any():
            out[series.source] = {"steps": steps[idx[keep]].tolist(),
                                  "values": (level + trace[keep] * scale).tolist()}
    return out
