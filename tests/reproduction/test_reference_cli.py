"""The reference checkpoints through the command line a user types (issue 14, item 1):
``moeproxy reference list --json`` names each checkpoint's use, and ``moeproxy reproduce --model
NAME`` runs a shipped checkpoint by its name with that checkpoint's own RL setting."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.cli import app  # noqa: E402
from moeproxy.reproduction.reference import REFERENCE_MODELS, reference_model_path  # noqa: E402
from typer.testing import CliRunner  # noqa: E402


def test_reference_list_json_gives_every_checkpoint_its_use():
    res = CliRunner().invoke(app, ["reference", "list", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(REFERENCE_MODELS)
    for name, model in REFERENCE_MODELS.items():
        assert rows[name]["use"] == list(model.use)
        assert set(rows[name]["use"]) <= {"rl", "fidelity"}
    assert rows["qwen3-moe-64e-rl"]["use"] == ["rl"] and rows["deepseek-v3-64e-rl"]["use"] == ["rl"]
    assert rows["qwen3-moe-64e"]["use"] == ["fidelity"] and rows["deepseek-v3-64e"]["use"] == ["fidelity"]
    assert rows["qwen3-moe-64e-rl"]["present"] is True


def test_reproduce_takes_a_reference_name_and_starts_from_its_rl_setting(tmp_path):
    """One step of a small batch on the shipped RL starting point, named, not pathed: the run is
    made on that checkpoint, with its ``rl_engine`` (learning rate and task mix) as the defaults an
    ``--engine`` option still overrides."""
    torch.set_num_threads(1)
    name = "qwen3-moe-64e-rl"
    rl = REFERENCE_MODELS[name].rl_engine
    out = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "reproduce", "--model", name, "--fault", "rollout_logp_precision", "--variant", "bf16",
        "--steps", "1", "--seeds", "0", "--no-healthy", "--quiet", "--out", str(out), "--json",
        "--engine", "prompts_per_step=2", "--engine", "group_size=2", "--engine", "ppo_mini_batch_size=1",
    ])
    assert res.exit_code == 0, res.output
    assert f"{name}: engine defaults" in res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["path"] == str(reference_model_path(name).resolve())
    engine = manifest["engine"]
    assert engine["lr"] == rl["lr"] and tuple(engine["tasks"]) == tuple(rl["tasks"])
    assert engine["prompts_per_step"] == 2 and engine["group_size"] == 2  # --engine still wins
    assert len(manifest["traces"]) == 1


def test_reproduce_refuses_a_name_that_is_neither_a_directory_nor_a_reference():
    res = CliRunner().invoke(app, ["reproduce", "--model", "qwen3-moe-65e-rl", "--fault", "reward_fault",
                                   "--out", "unused"])
    assert res.exit_code != 0
    assert "not a known reference model name" in res.output
