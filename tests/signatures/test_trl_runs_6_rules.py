"""The two rules written after trl_runs_6's blind scoring, on its real TRL runs against the shipped
library. The KL step (levels.kl_step_jump): the run whose MoE routers had a quarter of their rows
re-initialised at step 50 is named ``router_corruption`` from the KL's step alone (TRL logs no
routing metric), and the batch's healthy runs and its run with routers noised at their own scale
(KL x17, under the x30) show no step. The LR never reached (levels.lr_never_reached): the run whose
warm-up is 100x its length is named ``actor_update_omission`` from its config, and without the
config it is not. The load-balancing loss (levels.balance_loss_rises, written after trl_runs_7):
both router runs end with TRL's ``aux_loss`` 0.8% above where it started, and the noised one, which
no other rule sees, is named ``router_corruption`` from it; the batch's healthy runs are not."""

from __future__ import annotations

from pathlib import Path

import pytest
from moeproxy.signatures.canonical import load_config, load_run
from moeproxy.signatures.fingerprint import load_library
from moeproxy.signatures.matching import triage
from moeproxy.signatures.settings import settings_from_config

TRL_6 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "trl_runs_6"


def _triage(rid: str):
    path = TRL_6 / f"{rid}.json"
    return triage(load_run(path, framework="trl"), load_library(), framework="trl",
                  settings=settings_from_config(load_config(path)))


def test_a_real_router_reinitialised_mid_run_is_named_by_its_kl_step():
    res = _triage("router_reinit_quarter")
    (jump,) = [f for f in res.findings if f.rule == "kl_step_jump"]
    assert " at step 50 " in jump.text and jump.value > 100
    top = res.candidates[0]
    assert top.fault_class == "router_corruption" and top.strength == "weak"  # evidence, not a definition
    assert jump.text in top.evidence


@pytest.mark.parametrize("rid", ["healthy_temperature", "healthy_clip_higher", "router_noise_mid"])
def test_no_step_where_the_kl_only_grows_or_rises_less(rid):
    assert not [f for f in _triage(rid).findings if f.rule == "kl_step_jump"]


def test_a_real_warm_up_longer_than_the_run_is_named_from_its_config():
    res = _triage("warmup_never_ends")
    (never,) = [f for f in res.findings if f.rule == "lr_never_reached"]
    assert never.threshold == pytest.approx(5e-6) and never.value < 5e-7 * 1.01
    assert res.candidates[0].fault_class == "actor_update_omission" and never.text in res.candidates[0].evidence
    # The trace alone: a rising LR is a warm-up, nothing to read.
    bare = triage(load_run(TRL_6 / "warmup_never_ends.json", framework="trl"), load_library(), framework="trl")
    assert not [f for f in bare.findings if f.rule == "lr_never_reached"]
    for rid in ("healthy_temperature", "healthy_clip_higher"):  # their LR reaches the configured 5e-5
        assert not [f for f in _triage(rid).findings if f.rule == "lr_never_reached"]


@pytest.mark.parametrize("rid", ["router_noise_mid", "router_reinit_quarter"])
def test_a_real_router_fault_raises_the_load_balancing_loss(rid):
    res = _triage(rid)
    (rise,) = [f for f in res.findings if f.rule == "balance_loss_rises"]
    assert rise.source_name == "aux_loss" and 0.005 < rise.value < 0.02
    top = res.candidates[0]
    assert top.fault_class == "router_corruption" and rise.text in top.evidence


@pytest.mark.parametrize("rid", ["healthy_temperature", "healthy_clip_higher"])
def test_a_real_healthy_run_keeps_its_load_balancing_loss(rid):
    res = _triage(rid)
    assert not [f for f in res.findings if f.rule == "balance_loss_rises"]
    assert res.candidates[0].fault_class == "healthy"
