"""Reference-model shapes, the training loop and the shipped checkpoints."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.reproduction import reference
from moeproxy.reproduction.reference import (
    ARCH_CONFIGS,
    REFERENCE_MODELS,
    CheckpointMissing,
    TrainingRecipe,
    UnknownReferenceModel,
    balance_loss,
    build_config,
    encode_batch,
    reference_model_path,
    train_model,
)
from moeproxy.reproduction.tasks import Example, make_split
from moeproxy.reproduction.tokenizer import build_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)

TINY = {
    "qwen3_moe": {"hidden_size": 32, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2},
    "deepseek_v3": {"hidden_size": 32, "num_hidden_layers": 2, "n_routed_experts": 8, "n_group": 2,
                    "topk_group": 1, "num_experts_per_tok": 2},
}


def test_architectures_are_shaped_like_the_real_ones():
    q = build_config("qwen3_moe")
    assert q.num_experts == 64 and q.num_experts_per_tok >= 4 and q.num_hidden_layers >= 8
    assert q.mlp_only_layers == [] and q.norm_topk_prob
    d = build_config("deepseek_v3")
    assert d.n_routed_experts == 64 and d.num_experts_per_tok >= 4 and d.num_hidden_layers >= 8
    assert d.n_shared_experts == 1 and d.first_k_dense_replace == 1
    # group-limited routing must be able to fill top-k from the allowed groups
    assert d.n_routed_experts % d.n_group == 0
    assert d.num_experts_per_tok <= d.topk_group * d.n_routed_experts // d.n_group
    with pytest.raises(UnknownReferenceModel):
        build_config("mixtral")


def test_registry_entries_are_consistent():
    assert {m.arch for m in REFERENCE_MODELS.values()} == set(ARCH_CONFIGS)
    for name, m in REFERENCE_MODELS.items():
        assert m.name == name and m.path.name == name
    with pytest.raises(UnknownReferenceModel):
        reference_model_path("gpt-5")


def test_recipe_validation():
    with pytest.raises(ValueError):
        TrainingRecipe(steps=0)
    with pytest.raises(ValueError):
        TrainingRecipe(lr=2.0)
    with pytest.raises(ValueError):
        TrainingRecipe(save_dtype="float8")


def test_encode_batch_labels_only_the_answer_and_end_marker():
    tok = build_tokenizer()
    ex = [Example("addition", "1+2=", "3"), Example("reversal", "rev:abc=", "cba")]
    input_ids, attention, labels = encode_batch(tok, ex)
    assert input_ids.shape == labels.shape == attention.shape
    row = labels[0][labels[0] != -100].tolist()
    assert row == tok("3", add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert tok.decode(labels[1][labels[1] != -100]) == "cba<eos>"
    assert attention[0].sum() == 1 + 4 + 1 + 1  # <bos> 1+2= 3 <eos>


def test_balance_loss_is_one_for_uniform_routing_and_larger_when_skewed():
    mask = torch.ones(1, 64)
    uniform = torch.zeros(64, 8)
    assert balance_loss([uniform], mask, top_k=8, scoring="softmax").item() == pytest.approx(1.0)
    skewed = torch.zeros(64, 8)
    skewed[:, 0] = 5.0
    assert balance_loss([skewed], mask, top_k=2, scoring="softmax").item() > 1.5


@pytest.mark.parametrize("arch", sorted(TINY))
def test_tiny_training_run_lowers_the_loss(arch, tmp_path):
    recipe = TrainingRecipe(steps=40, batch_size=16, lr=1e-2, warmup_steps=5,
                            bias_update_speed=1e-3 if arch == "deepseek_v3" else 0.0)
    result = train_model(arch, recipe, TINY[arch])
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    if arch == "deepseek_v3":  # the loss-free balancing moved the correction biases
        biases = [layer.mlp.gate.e_score_correction_bias for layer in result.model.model.layers[1:]]
        assert all(b.abs().sum() > 0 for b in biases)
    out = reference.save_checkpoint(result, tmp_path / arch, recipe, {"arch": arch})
    info = json.loads((out / "training.json").read_text())
    assert info["recipe"]["steps"] == 40 and len(info["loss_curve"]["values"]) >= 1
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    batch = tok(["1+2=3"], return_tensors="pt")
    assert loaded(**batch).logits.shape[-1] == loaded.config.vocab_size


def test_training_is_reproducible_from_the_seed():
    recipe = TrainingRecipe(steps=3, batch_size=4, warmup_steps=1)
    a = train_model("qwen3_moe", recipe, TINY["qwen3_moe"]).losses
    b = train_model("qwen3_moe", recipe, TINY["qwen3_moe"]).losses
    assert a == b


SHIPPED = [name for name, m in REFERENCE_MODELS.items() if (m.path / "config.json").exists()]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_checkpoint_loads_and_solves_tasks(name):
    path = reference_model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == REFERENCE_MODELS[name].arch
    size_mb = sum(f.stat().st_size for f in path.iterdir()) / 2**20
    assert size_mb <= 15
    from moeproxy.reproduction.fidelity import generate_completions, task_accuracy
    from moeproxy.reproduction.formats import format_of_config

    fmt = format_of_config(model.config.to_dict())  # answer, or reasoning for the RL starting points
    assert fmt.name == REFERENCE_MODELS[name].recipe.task_format
    examples = make_split("heldout", 140, seed=5)
    completions = generate_completions(model, tok, examples, max_new_tokens=fmt.max_new_tokens)
    acc = task_accuracy(examples, completions, fmt)
    mean = sum(v["accuracy"] for v in acc.values()) / len(acc)
    # The shipped weights reproduce the figure recorded at training time (500 prompts per task,
    # docs/reference_models.md); 140 prompts give a standard error of about 0.04 on the mean.
    recorded = json.loads((path / "training.json").read_text())["heldout_accuracy"]
    assert mean > 0.1, acc
    assert abs(mean - recorded["mean"]) < 0.12, (mean, recorded)


def test_missing_checkpoint_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(reference, "MODELS_DIR", tmp_path)
    m = REFERENCE_MODELS["qwen3-moe-64e"]
    monkeypatch.setitem(REFERENCE_MODELS, m.name, reference.ReferenceModel(m.name, m.arch, m.recipe))
    with pytest.raises(CheckpointMissing, match="moeproxy reference train"):
        reference_model_path(m.name)


# --- `moeproxy reference train --arch`: the names come from ARCH_CONFIGS ---------------------------

def _train_help(reference_app) -> str:
    from typer.testing import CliRunner

    result = CliRunner().invoke(reference_app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_cli_names_every_registered_architecture(tmp_path):
    from typer.testing import CliRunner

    from moeproxy.cli.reference import reference_app

    assert all(arch in _train_help(reference_app) for arch in ARCH_CONFIGS)
    missing = CliRunner().invoke(reference_app, ["train", "--out", str(tmp_path / "out")])
    assert missing.exit_code == 2
    assert all(arch in missing.output for arch in ARCH_CONFIGS)


def test_an_added_architecture_reaches_the_cli_without_editing_it(monkeypatch):
    """The help is written when the CLI module loads: a fresh load after adding an entry shows it."""
    import importlib

    from moeproxy.cli import reference as cli_reference

    try:
        with monkeypatch.context() as patch:
            patch.setitem(ARCH_CONFIGS, "toy_moe", dict(ARCH_CONFIGS["qwen3_moe"]))
            assert "toy_moe" in _train_help(importlib.reload(cli_reference).reference_app)
    finally:
        importlib.reload(cli_reference)
    assert "toy_moe" not in _train_help(cli_reference.reference_app)
