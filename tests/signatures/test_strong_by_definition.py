"""A class is ``strong`` by definition (matching.by_definition): a whole-run finding of the
definitional weight that names one class alone (a non-finite gradient norm is an overflow, a
gradient of exactly 0 is no update), with nothing in the run counting against the class, makes it
strong whatever its score, and a strong class ranks before weak ones. Checked on real TRL runs
(benchmarks/results/trl_runs_4) against the shipped library."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from moeproxy.signatures.canonical import load_config, load_run
from moeproxy.signatures.fingerprint import load_library
from moeproxy.signatures.levels import Finding
from moeproxy.signatures.matching import WEIGHTS, Candidate, by_definition, ranked, triage
from moeproxy.signatures.settings import settings_from_config

ROOT = Path(__file__).resolve().parents[2]
TRL_4 = ROOT / "benchmarks" / "results" / "trl_runs_4"


def _finding(rule: str, supports: tuple[str, ...], against: tuple[str, ...] = ()) -> Finding:
    return Finding(rule, "grad_norm", "grad_norm", 0.0, 0.0, supports, "text", "nonfinite", against=against)


def test_a_definitional_finding_for_one_class_and_nothing_against_it_defines_the_class():
    nan = _finding("nonfinite", ("gradient_overflow",), against=("healthy", "actor_update_omission"))
    assert by_definition("gradient_overflow", [nan]) is nan
    assert by_definition("actor_update_omission", [nan]) is None  # it counts against that one
    # Something in the run against the class: no definition holds.
    skipped = _finding("nonfinite_update_skipped", ("actor_update_omission",), against=("gradient_overflow",))
    assert by_definition("gradient_overflow", [nan, skipped]) is None
    # A documented range or a trend is evidence, not a definition; nor is a finding for several classes.
    assert by_definition("reward_fault", [_finding("reward_stuck", ("reward_fault",))]) is None
    assert by_definition("lr_misconfiguration", [_finding("kl_runaway", ("kl_misconfiguration",
                                                                         "lr_misconfiguration"))]) is None
    # The weight is read from Weights: off, nothing is strong by definition; lowered, weight 3 is.
    assert by_definition("gradient_overflow", [nan], replace(WEIGHTS, definitional_weight=None)) is None
    stuck = _finding("reward_stuck", ("reward_fault",))
    assert by_definition("reward_fault", [stuck], replace(WEIGHTS, definitional_weight=3.0)) is stuck


def _candidate(cls: str, score: float, strength: str) -> Candidate:
    return Candidate(cls, "family", score, strength, (), f"{cls}/x", None)


def test_a_strong_class_ranks_before_a_weak_one_that_scores_higher():
    order = ranked([_candidate("lr_misconfiguration", 0.6, "weak"), _candidate("gradient_overflow", 0.5, "strong"),
                    _candidate("healthy", 0.3, "weak")], [])
    assert [c.fault_class for c in order] == ["gradient_overflow", "lr_misconfiguration", "healthy"]


@pytest.fixture(scope="module")
def shipped():
    return load_library(ROOT / "signatures" / "library")


def _triage(name: str, library, weights=WEIGHTS):
    path = TRL_4 / f"{name}.json"
    return triage(load_run(path, framework="trl"), library, framework="trl",
                  settings=settings_from_config(load_config(path)), weights=weights)


@pytest.mark.parametrize(("run", "cls", "rule"), [("inf_grad_mid", "gradient_overflow", "nonfinite"),
                                                   ("frozen_late", "actor_update_omission", "grad_norm_zero")])
def test_a_real_trl_run_with_a_definitional_finding_is_strong_for_its_class(shipped, run, cls, rule):
    result = _triage(run, shipped)
    top = result.candidates[0]
    assert (top.fault_class, top.strength) == (cls, "strong")
    assert top.score < result.strong_threshold  # strong by definition, not by its score
    assert any(line.startswith(f"strong by definition: {rule} ") for line in top.evidence)
    assert result.verdict.startswith(f"likely {cls} ")
    # Without definitional strength the same run is only weak; the ranking is the same.
    off = _triage(run, shipped, replace(WEIGHTS, definitional_weight=None)).candidates[0]
    assert (off.fault_class, off.strength) == (cls, "weak")
    # With its class left out of the library nothing is strong: the run is outside what it knows.
    assert all(c.strength == "weak" for c in _triage(run, shipped.without_class(cls)).candidates)


@pytest.mark.parametrize("run", ["healthy_dr_grpo", "healthy_two_iterations"])
def test_a_real_healthy_trl_run_is_strong_for_no_fault(shipped, run):
    assert not [c for c in _triage(run, shipped).candidates if c.strength == "strong" and c.fault_class != "healthy"]
