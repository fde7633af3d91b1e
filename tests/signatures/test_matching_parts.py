"""The matcher's parts as a registry (issue 15, item 8): the registry-driven score against a direct
computation of the documented formula (docs/signatures.md, section 4), every part's weight taken
from ``Weights``, and no scoring constant left outside it."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
from dataclasses import fields, replace

import numpy as np
import pytest
from moeproxy.signatures import dtw, matching
from moeproxy.signatures.canonical import canonicalise
from moeproxy.signatures.features import run_signature
from moeproxy.signatures.matching import PART_SCORERS, WEIGHTS, MetricContext, class_onset, score_fingerprint
from moeproxy.signatures.synthetic import synthetic_run
from moeproxy.signatures.vocabulary import CONTROL_METRICS

from .conftest import CLASSES

# The weights of the parts (the docs' "weight" column); the other fields are constants inside parts.
#: The weights of the whole-run findings (applied by matching.with_findings, tested below).
FINDING_FIELDS = ("evidence_mass", "finding_weights", "finding_default")
#: Read by triage, not by score_fingerprint (tests/signatures/test_flat_only.py moves it).
TRIAGE_FIELDS = ("flat_only_finding_weight", "flat_in_view", "above_twins", "needs_primary",
                 "definitional_weight")  # read by triage (tested there and in test_strong_by_definition.py)
PART_WEIGHTS = ("direction_affected", "direction_unaffected", "surprise_change", "shape",
                "timing", "nonfinite", "freeze", "magnitude", "trend", "volatility", "direction_flat_affected")


HELDOUT = {"seed": 300, "steps": 64, "onset": 23, "magnitude": 1.4, "scale": 3.0}
SOME_METRICS = ("critic/score/mean", "training/rollout_probs_diff_mean", "rollout_corr/kl", "actor/pg_clipfrac")


def _signatures(library):
    """Held-out runs of every class (other seeds, onset, length and scale than the library's):
    whole, cut short, and logging only some metrics, so that every part and the coverage factor
    apply somewhere."""
    out = []
    for c in CLASSES:
        run = synthetic_run(c, **HELDOUT)
        for r in (run, run.truncated(30), synthetic_run(c, metrics=SOME_METRICS, **HELDOUT)):
            out.append(run_signature(canonicalise(r), library.params))
    return out


def _direct_score(sig, fp) -> float:
    """The score as docs/signatures.md writes it, with the default numbers, as one plain loop."""
    onset = class_onset(sig, fp) if fp.aligned else None
    num = den = cover_have = cover_all = 0.0
    for name, exp in fp.metrics.items():
        if name in CONTROL_METRICS:  # settings are not compared with fingerprints
            continue
        cover = 1.0 if exp.affected else 0.1
        cover_all += cover
        ms = sig.metrics.get(name)
        if ms is None:
            continue
        cover_have += cover
        terms = []
        if exp.direction != 0:
            s = 1.0 if ms.direction == exp.direction else (
                (0.25 + 0.75 * (1.0 - exp.agreement)) if ms.direction == 0 else 0.0)
            terms.append((1.0 if exp.affected else 0.1, s))
        elif ms.direction != 0 and ms.direction not in (exp.trend, exp.drift):  # along the expected trend is none
            terms.append((1.0, 0.15))
        else:
            terms.append((0.2 if exp.affected else 0.1, 1.0))
        if exp.nonfinite_rate >= 0.5 or ms.has_nonfinite:
            terms.append((2.0, float(ms.has_nonfinite == (exp.nonfinite_rate >= 0.5))))
        if exp.freeze_rate >= 0.5 or ms.frozen:
            terms.append((1.5, exp.freeze_rate if ms.frozen else 1.0 - exp.freeze_rate))
        # shape and timing leave out a metric the fingerprint's runs show no change in at all
        flat = (exp.direction == 0 and exp.trend == 0 and exp.drift == 0 and exp.freeze_rate < 0.5 and exp.nonfinite_rate < 0.5
                and (exp.log10_volatility is None or abs(exp.log10_volatility) < 0.7))
        shaped = exp.affected and fp.aligned and not flat
        if shaped and onset is None and exp.traces:
            terms.append((1.0, 0.0))
        if shaped and onset is not None:
            if exp.traces:
                trace = sig.effect_trace(name, onset, pre=fp.trace_pre)
                n = min(trace.size, min(len(t) for t in exp.traces))
                if n >= fp.trace_pre + 2:
                    refs = [dtw.znorm(np.asarray(t[:n])) for t in exp.traces]
                    d = min(dtw.dtw_reference(dtw.znorm(trace[:n]), r, radius=dtw.band_radius(n)) for r in refs)
                    terms.append((1.0, math.exp(-d * d / n)))
            if exp.onset_lag is not None:
                if ms.event_index is None:
                    terms.append((0.5, 0.3))
                else:
                    tau = max(2.0, 2.0 * exp.onset_lag_spread)
                    terms.append((0.5, math.exp(-abs(ms.event_index - onset - exp.onset_lag) / tau)))
        # where the fingerprint's runs show no trend, the drifts are compared
        run_t, exp_t = (ms.drift, exp.drift) if exp.trend == 0 else (ms.trend, exp.trend)
        if exp.affected and (exp_t or run_t):
            terms.append((0.5, 1.0 if run_t == exp_t else (0.3 if 0 in (run_t, exp_t) else 0.0)))
        if exp.affected and exp.log10_volatility is not None and onset is not None:
            vol = sig.volatility(name, onset)
            if vol is not None:
                terms.append((1.0, math.exp(-abs(vol - exp.log10_volatility))))
        if exp.affected and exp.log10_ratio is not None and ms.ratio and ms.ratio > 0 and exp.direction:
            terms.append((0.3, math.exp(-abs(math.log10(ms.ratio) - exp.log10_ratio))))
        num += sum(w * s for w, s in terms)
        den += sum(w for w, _ in terms)
    raw = num / den if den else 0.0
    coverage = cover_have / cover_all if cover_all else 0.0
    return min(max(raw * (0.5 + 0.5 * coverage), 0.0), 1.0)


def test_registry_driven_score_equals_the_direct_formula(synthetic_library):
    compared = 0
    for sig in _signatures(synthetic_library):
        for fp in synthetic_library.fingerprints:
            assert score_fingerprint(sig, fp, synthetic_library).score == pytest.approx(
                _direct_score(sig, fp), abs=1e-9), fp.id
            compared += 1
    assert compared == 3 * len(CLASSES) * len(synthetic_library.fingerprints)


def _contexts(library, weights):
    for sig in _signatures(library):
        for fp in library.fingerprints:
            onset = class_onset(sig, fp) if fp.aligned else None
            for name, exp in fp.metrics.items():
                if name in sig.metrics:
                    yield MetricContext(sig, sig.metrics[name], exp, fp, onset, weights)


def test_every_registered_part_takes_its_weight_from_weights(synthetic_library):
    """Tripling every weight field triples every part's weight and leaves its score alone; a part
    with a weight of its own would not follow."""
    tripled = replace(WEIGHTS, **{f: 3 * getattr(WEIGHTS, f) for f in PART_WEIGHTS})
    applied = set()
    for base, scaled in zip(_contexts(synthetic_library, WEIGHTS), _contexts(synthetic_library, tripled)):
        for name, scorer in PART_SCORERS.items():
            a, b = scorer.score(base), scorer.score(scaled)
            assert (a is None) == (b is None), name
            if a is None:
                continue
            applied.add(name)
            assert b.weight == pytest.approx(3 * a.weight) and a.weight > 0, name
            assert b.score == a.score, name
            assert 0.0 <= a.score <= 1.0, name
    assert applied == set(PART_SCORERS), f"parts never exercised by the fixture: {set(PART_SCORERS) - applied}"


def test_the_part_weights_are_the_weights_fields():
    assert set(PART_WEIGHTS) < {f.name for f in fields(WEIGHTS)}
    assert {"direction", "nonfinite", "freeze", "shape", "timing", "trend", "volatility", "magnitude"} == set(PART_SCORERS)


def _numbers(fn) -> set[float]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)}


def test_no_scoring_constant_lives_outside_weights():
    """Part scores run from 0 to 1; any other number in a scorer belongs in ``Weights``."""
    scorers = [s.score for s in PART_SCORERS.values()]
    for fn in [*scorers, matching._shape_score, matching._metric_parts, score_fingerprint]:
        assert _numbers(fn) <= {0, 1}, (fn.__name__, _numbers(fn) - {0, 1})


def test_every_constant_in_weights_moves_some_score(synthetic_library):
    """The constants are read from the ``Weights`` passed in: each one, changed, changes the score
    of some held-out run against some fingerprint (a constant nothing reads would not)."""
    pairs = [(sig, fp) for sig in _signatures(synthetic_library) for fp in synthetic_library.fingerprints]
    base = [score_fingerprint(sig, fp, synthetic_library).score for sig, fp in pairs]
    for f in fields(WEIGHTS):
        if f.name in PART_WEIGHTS or f.name in FINDING_FIELDS or f.name in TRIAGE_FIELDS:
            continue
        v = getattr(WEIGHTS, f.name)
        moved = any(
            score_fingerprint(sig, fp, synthetic_library, replace(WEIGHTS, **{f.name: other})).score != b
            for other in (0.5 * v, 2 * v + 100)
            for (sig, fp), b in zip(pairs, base)
        )
        assert moved, f"Weights.{f.name} changes no score"


def _finding(rule: str, supports=("reward_fault",)):
    from moeproxy.signatures.levels import Finding

    return Finding(rule, "reward_mean", "reward", 0.0, 1.0, supports, "text", "healthy-dynamics")


def test_findings_move_a_score_by_their_weight_against_the_mass():
    """with_findings as docs/signatures.md writes it: (mass * s + supporting) / (mass + supporting
    + against); a finding about other classes leaves a class's score alone."""
    from moeproxy.signatures.levels import RULES
    from moeproxy.signatures.matching import FINDING_WEIGHTS, with_findings

    assert set(FINDING_WEIGHTS) == set(RULES)  # every rule has its weight
    f = _finding("no_reward_signal")
    w = FINDING_WEIGHTS["no_reward_signal"]
    m = WEIGHTS.evidence_mass
    assert with_findings(0.4, "reward_fault", [f]) == pytest.approx((m * 0.4 + w) / (m + w))
    assert with_findings(0.4, "healthy", [f]) == pytest.approx(m * 0.4 / (m + w))
    assert with_findings(0.4, "lr_misconfiguration", [f]) == pytest.approx(0.4)
    for name in FINDING_FIELDS:
        v = getattr(WEIGHTS, name)
        other = {k: 2 * x + 1 for k, x in v.items()} if isinstance(v, dict) else 2 * v + 1
        changed = replace(WEIGHTS, **{name: other})
        rule = "no_reward_signal" if name != "finding_default" else "a_rule_without_a_weight"
        assert (with_findings(0.4, "reward_fault", [_finding(rule)], changed)
                != with_findings(0.4, "reward_fault", [_finding(rule)])), name
