"""A rollout/trainer mismatch class needs its defining symptom in the run (matching.PRIMARY_EVIDENCE):
on a run that logs no discrepancy metric at all, its fingerprints can match only side effects (a KL
to the reference that rises) that other classes move too, and are held like flat-only ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from moeproxy.signatures.canonical import RunMetrics, canonicalise, load_run
from moeproxy.signatures.features import run_signature
from moeproxy.signatures.fingerprint import load_library
from moeproxy.signatures.levels import MISMATCH_CLASSES
from moeproxy.signatures.matching import Weights, lacks_primary, triage

PUBLIC = Path(__file__).resolve().parents[2] / "benchmarks" / "public_runs"
N = 120


@pytest.fixture(scope="module")
def library():
    return load_library()


def _trl(with_discrepancy: bool, seed: int = 0) -> RunMetrics:
    """A TRL run whose KL to the reference jumps at step 40 and keeps rising; optionally with vLLM's
    sampling discrepancy jumping with it."""
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    cols = {"reward": 0.5 + 0.1 * (1 - np.exp(-t / 30)) + rng.normal(0, 0.02, N),
            "kl": np.where(t < 40, 0.002 + 0.0001 * t, 0.05 * np.exp((t - 40) / 40)) * (1 + rng.normal(0, 0.05, N)),
            "grad_norm": 0.5 + rng.normal(0, 0.05, N), "loss": rng.normal(0, 0.01, N),
            "completions/mean_length": 200 + rng.normal(0, 5, N), "learning_rate": np.full(N, 1e-6)}
    if with_discrepancy:
        cols["sampling/sampling_logp_difference/mean"] = np.where(t < 40, 0.002, 0.03) * (1 + rng.normal(0, 0.05, N))
    steps = [{"step": k + 1, "values": {m: float(v[k]) for m, v in cols.items()}} for k in range(N)]
    return RunMetrics.from_steps(steps, framework="trl")


def test_only_the_mismatch_classes_need_a_discrepancy_metric(library):
    bare = run_signature(canonicalise(_trl(False)), library.params)
    logged = run_signature(canonicalise(_trl(True)), library.params)
    for fp in library.fingerprints:
        assert lacks_primary(fp, bare) is (fp.fault_class in MISMATCH_CLASSES)
        assert not lacks_primary(fp, logged)


def test_without_one_a_rising_kl_scores_no_mismatch_class(library):
    held = triage(_trl(False), library, framework="trl")
    assert all(c.score == 0.0 for c in held.candidates if c.fault_class in MISMATCH_CLASSES)
    # The rule off: the same run is read as a mismatch on its KL alone (what it was before).
    loose = triage(_trl(False), library, framework="trl", weights=Weights(needs_primary=False))
    assert loose.candidates[0].fault_class in MISMATCH_CLASSES
    # With the discrepancy logged and jumping, a mismatch class is named again.
    assert triage(_trl(True), library, framework="trl").candidates[0].fault_class in MISMATCH_CLASSES


def test_a_real_trl_run_whose_kl_ran_away_is_named_a_kl_misconfiguration(library):
    """benchmarks/public_runs: the authors raised beta afterwards because this run's KL reached 3."""
    rid = "trl-ningguo-hotpotqa-grpo-v1"
    assert json.loads((PUBLIC / "labels.json").read_text())[rid]["label"] == "kl_misconfiguration"
    result = triage(load_run(PUBLIC / "traces" / f"{rid}.json", framework="trl"), library, framework="trl")
    assert result.candidates[0].fault_class == "kl_misconfiguration"
    assert not {c.fault_class for c in result.candidates[:2]} & set(MISMATCH_CLASSES)
