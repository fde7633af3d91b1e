"""A healthy fingerprint made from small-batch runs that learn slowly still says they learn.

Small-batch proxy runs raise their reward by only about two noise widths over a run: significant,
but below the effect-size gate of ``trend``. A large-batch user run shows the same learning as a
clear rise. The healthy fingerprint records the slow rise as ``drift``, so the user's learning
run is what it expects and not a surprise."""

from __future__ import annotations

import json

import numpy as np
import pytest
from moeproxy.signatures.build import build_fingerprint
from moeproxy.signatures.canonical import RunMetrics, canonicalise
from moeproxy.signatures.features import run_signature
from moeproxy.signatures.fingerprint import FingerprintLibrary, library_from_dict
from moeproxy.signatures.matching import WEIGHTS, score_fingerprint

STEPS = 120
# verl's names, and the canonical ones the signatures and fingerprints use
LOGGED = {"reward_mean": "critic/score/mean", "entropy": "actor/entropy", "kl": "actor/kl_loss",
          "grad_norm": "actor/grad_norm"}
REWARD, ENTROPY, KL = "reward_mean", "entropy", "kl"


def _learning_arrays(seed: int, noise: float) -> dict[str, np.ndarray]:
    """Reward up 0.5, entropy down 0.1, KL up 0.05 over the run; ``noise`` sets how clearly."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS) / (STEPS - 1)
    return {
        LOGGED[REWARD]: 0.5 + 0.5 * t + noise * 0.5 * rng.normal(size=STEPS),
        LOGGED[ENTROPY]: 0.3 - 0.1 * t + noise * 0.1 * rng.normal(size=STEPS),
        LOGGED[KL]: 0.01 + 0.05 * t + noise * 0.05 * rng.normal(size=STEPS),
        LOGGED["grad_norm"]: 1.0 + 0.1 * rng.normal(size=STEPS),
    }


def _learning_run(seed: int, noise: float) -> RunMetrics:
    return RunMetrics.from_arrays(_learning_arrays(seed, noise), framework="verl", name=f"learning-{seed}")


@pytest.fixture(scope="module")
def healthy():
    # Noise of half the run's rise: every seed's trend is significant, none passes the gate.
    return build_fingerprint("healthy", [_learning_run(s, noise=0.5) for s in range(3)])


def test_the_proxy_runs_drift_below_the_trend_gate():
    for s in range(3):
        m = run_signature(canonicalise(_learning_run(s, noise=0.5))).metrics
        assert [m[k].drift for k in (REWARD, ENTROPY, KL)] == [1, -1, 1]
        assert [m[k].trend for k in (REWARD, ENTROPY, KL)] == [0, 0, 0]


def test_a_healthy_fingerprint_records_that_its_runs_learn(healthy):
    for name, sign in ((REWARD, 1), (ENTROPY, -1), (KL, 1)):
        exp = healthy.metrics[name]
        assert exp.affected and exp.drift == sign and exp.trend == 0
    assert not healthy.metrics["grad_norm"].affected
    assert healthy.metrics["grad_norm"].drift == 0


def test_drift_survives_the_library_file(healthy):
    back = library_from_dict(json.loads(json.dumps(FingerprintLibrary((healthy,)).to_dict())))
    assert back.fingerprints[0].metrics[REWARD].drift == 1


def test_a_clearly_learning_run_is_no_surprise_to_the_healthy_fingerprint(healthy):
    sig = run_signature(canonicalise(_learning_run(10, noise=0.1)))
    assert sig.metrics[REWARD].direction == 1  # the large-batch run's rise is a change
    matches = {m.metric: m for m in score_fingerprint(sig, healthy).matches}
    for name in (REWARD, ENTROPY, KL):
        assert matches[name].direction_score == 1.0


def test_a_run_that_unlearns_is_a_surprise(healthy):
    arrays = _learning_arrays(10, noise=0.1)
    arrays[LOGGED[REWARD]] = 1.5 - arrays[LOGGED[REWARD]]  # the reward falls by as much as it should rise
    flipped = RunMetrics.from_arrays(arrays, framework="verl")
    sig = run_signature(canonicalise(flipped))
    assert sig.metrics[REWARD].direction == -1
    matches = {m.metric: m for m in score_fingerprint(sig, healthy).matches}
    assert matches[REWARD].direction_score == WEIGHTS.direction_surprise_score
    learning = score_fingerprint(run_signature(canonicalise(_learning_run(10, noise=0.1))), healthy)
    assert score_fingerprint(sig, healthy).score < learning.score


def _frozen_run(seed: int) -> RunMetrics:
    """A fault from step 0 that takes the learning away (no update is applied): flat, noisy."""
    arrays = _learning_arrays(seed, noise=0.5)
    rng = np.random.default_rng(100 + seed)
    arrays[LOGGED[REWARD]] = 0.5 + 0.25 * rng.normal(size=STEPS)
    arrays[LOGGED[ENTROPY]] = 0.3 + 0.05 * rng.normal(size=STEPS)
    arrays[LOGGED[KL]] = 0.01 + 0.025 * rng.normal(size=STEPS)
    return RunMetrics.from_arrays(arrays, framework="verl", name=f"frozen-{seed}")


def test_a_fault_that_takes_a_drifting_learning_away_is_affected_and_separates(healthy):
    twins = [_learning_run(s, noise=0.5) for s in range(3)]
    fp = build_fingerprint("actor_update_omission", [_frozen_run(s) for s in range(3)], twins,
                           params={"onset": 0}, fingerprint_id="omission/onset=0")
    for name in (REWARD, ENTROPY, KL):
        exp = fp.metrics[name]
        assert exp.affected and exp.drift == 0 and exp.direction == 0, name
    assert fp.separable
    # A held-out learning run: the healthy fingerprint matches it better than the fault does,
    # and a held-out frozen run the other way round.
    learning = run_signature(canonicalise(_learning_run(7, noise=0.5)))
    frozen = run_signature(canonicalise(_frozen_run(7)))
    assert score_fingerprint(learning, healthy).score > score_fingerprint(learning, fp).score
    assert score_fingerprint(frozen, fp).score > score_fingerprint(frozen, healthy).score
