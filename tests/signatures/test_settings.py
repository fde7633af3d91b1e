"""What a run's config says that its metrics cannot (signatures/settings.py): a LoRA policy, read
from the names verl, OpenRLHF, TRL and the TRL callback use, and what it changes (the LR range)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from moeproxy.signatures.canonical import RunMetrics, canonicalise, load_run
from moeproxy.signatures.levels import whole_run_evidence
from moeproxy.signatures.settings import DEFAULT_SETTINGS, MAX_DEPTH, RunSettings, settings_from_config

PUBLIC = Path(__file__).resolve().parents[2] / "benchmarks" / "public_runs"


@pytest.mark.parametrize("config", [
    {"actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-7B", "lora_rank": 64, "lora_alpha": 32}}},  # verl
    {"args": {"lora_rank": 16, "actor_learning_rate": 5e-6}},  # OpenRLHF's argparse namespace
    {"model_args": {"use_peft": True, "lora_r": 16}},  # TRL's ModelConfig
    {"peft": {"default": {"peft_type": "LORA", "r": 16, "lora_alpha": 32}}},  # the TRL callback's section
    {"stages": [{"name": "grpo", "lora": {"r": 8}}]},  # a script's own, in a list
])
def test_a_lora_policy_is_read_from_the_frameworks_own_names(config):
    settings = settings_from_config(config)
    assert settings.lora is True and settings.kl_coef is None


@pytest.mark.parametrize("config", [
    None, {}, {"actor_rollout_ref": {"model": {"lora_rank": 0}}},  # verl's default: full fine-tuning
    {"model_args": {"use_peft": False}, "training_args": {"learning_rate": 1e-6}},
    # TRL's ModelConfig dumped whole: PEFT off beside its default rank.
    {"model_args": {"use_peft": False, "lora_r": 16, "lora_alpha": 32}},
])
def test_full_fine_tuning_unless_the_config_says_otherwise(config):
    settings = settings_from_config(config)
    assert settings.lora is DEFAULT_SETTINGS.lora is False and settings.kl_coef is None


def test_flags_and_ranks_must_mean_it():
    assert settings_from_config({"lora": "yes", "lora_rank": True, "peft": {}}) == DEFAULT_SETTINGS
    deep: dict = {}
    node = deep
    for _ in range(MAX_DEPTH + 2):
        node["x"] = {}
        node = node["x"]
    node["lora_rank"] = 8  # below the depth the walk reads: not a config a trainer writes
    assert settings_from_config(deep) == DEFAULT_SETTINGS


def _lr_run(lr: float) -> RunMetrics:
    n = 60
    t = np.arange(n)
    return RunMetrics.from_arrays({"learning_rate": np.full(n, lr), "reward": 0.3 + 0.003 * t}, framework="trl")


@pytest.mark.parametrize(("lr", "full", "lora"), [(2e-4, True, False), (5e-6, False, False), (5e-2, True, True)])
def test_an_lr_level_is_judged_against_loras_range_for_a_lora_policy(lr, full, lora):
    def found(settings):
        return [f for f in whole_run_evidence(canonicalise(_lr_run(lr), settings=settings)) if f.rule == "lr_level"]

    assert bool(found(DEFAULT_SETTINGS)) is full
    got = found(RunSettings(lora=True))
    assert bool(got) is lora
    if got:
        assert got[0].source == "lora-lr" and "LoRA" in got[0].text


def test_a_real_lora_run_at_2e_4_is_no_lr_misconfiguration_once_its_config_says_lora():
    """benchmarks/public_runs: a TRL GRPO LoRA run at 2e-4 whose authors report it improved."""
    from moeproxy.signatures.fingerprint import load_library
    from moeproxy.signatures.matching import triage

    rid = "trl-raghuhemadri-watchdog-qwen3-8b-grpo"
    assert json.loads((PUBLIC / "labels.json").read_text())[rid]["label"] == "healthy"
    run = load_run(PUBLIC / "traces" / f"{rid}.json", framework="trl")
    lib = load_library()
    as_full = triage(run, lib, framework="trl")
    as_lora = triage(run, lib, framework="trl", settings=settings_from_config({"peft": {"default": {"r": 16}}}))
    assert "lr_level" in {f.rule for f in as_full.findings}
    assert "lr_level" not in {f.rule for f in as_lora.findings}
    assert as_lora.candidates[0].fault_class != "lr_misconfiguration"


@pytest.mark.parametrize(("config", "coef"), [
    ({"training_args": {"beta": -0.04, "learning_rate": 1e-6}}, -0.04),  # what the TRL callback sends
    ({"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.001}},
      "algorithm": {"kl_ctrl": {"kl_coef": -0.001}}}, -0.001),  # verl: the lower of its two terms
    ({"args": {"init_kl_coef": 0.01}}, 0.01),  # OpenRLHF
    # verl's defaults with both terms switched off: the coefficients are not terms of the loss.
    ({"actor_rollout_ref": {"actor": {"use_kl_loss": False, "kl_loss_coef": -0.001}},
      "algorithm": {"use_kl_in_reward": False, "kl_ctrl": {"kl_coef": 0.001}}}, None),
    ({"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.001}},
      "algorithm": {"use_kl_in_reward": False, "kl_ctrl": {"kl_coef": -0.5}}}, 0.001),
    ({"training_args": {"beta": True}}, None),  # a flag is no coefficient
    ({"optim": {"betas": [0.9, 0.999]}}, None),  # Adam's betas are not the KL's
    ({}, None),
])
def test_the_kl_coefficient_is_read_from_the_frameworks_own_names(config, coef):
    settings = settings_from_config(config)
    assert settings.kl_coef == coef and settings.lora is False


@pytest.mark.parametrize(("config", "lr"), [
    ({"training_args": {"beta": 0.04, "learning_rate": 5e-05}}, 5e-05),  # what the TRL callback sends
    ({"args": {"actor_learning_rate": 5e-07, "critic_learning_rate": 9e-06}}, 5e-07),  # OpenRLHF
    # verl: the actor's optim.lr, not the critic's
    ({"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-06, "lr_warmup_steps": -1}}},
      "critic": {"optim": {"lr": 1e-05}}}, 1e-06),
    ({"critic": {"optim": {"lr": 1e-05}}}, None),
    ({"training_args": {"learning_rate": "5e-5"}}, None),  # a string is no number
    ({}, None),
])
def test_the_policys_learning_rate_is_read_from_the_frameworks_own_names(config, lr):
    assert settings_from_config(config).learning_rate == lr
