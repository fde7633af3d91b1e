"""One architecture entry alone drives the planner, the builder, fidelity and the reference recipes.

The fixture registers a throwaway entry, ``tiny_moe`` (Qwen3-MoE's facts under another name), and
takes ``qwen3_moe``'s own entry out of the table, so a tiny Qwen3-MoE whose config says
``model_type = "tiny_moe"`` is known to every stage through that one entry only.  Both are put back
when the test ends.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from moeproxy.proxy_builder import build as build_module
from moeproxy.proxy_builder.architectures import ARCHITECTURES, architecture_for
from moeproxy.proxy_builder.build import BuildRequest, build_proxy
from moeproxy.proxy_builder.errors import UnsupportedArchitecture
from moeproxy.proxy_builder.params import count_parameters, moe_layer_indices
from moeproxy.proxy_builder.plan_errors import PlanError
from moeproxy.reproduction import fidelity, reference
from moeproxy.reproduction.errors import ModelLoadError
from moeproxy.reproduction.policy import Policy
from transformers import Qwen3MoeConfig
from transformers import Qwen3MoeForCausalLM

from tiny_models import build_model, build_tiny, tiny_config


class TinyMoeConfig(Qwen3MoeConfig):
    model_type = "tiny_moe"  # what to_dict() writes, so the model reads as the throwaway architecture


@pytest.fixture
def tiny_moe(monkeypatch):
    entry = replace(ARCHITECTURES["qwen3_moe"], model_type="tiny_moe")
    monkeypatch.delitem(ARCHITECTURES, "qwen3_moe")
    monkeypatch.setitem(ARCHITECTURES, "tiny_moe", entry)
    return entry


def _tiny_moe_model():
    model = build_model("qwen3_moe")
    model.config.__class__ = TinyMoeConfig
    return model


def test_plan_counts_through_the_entry(tiny_moe):
    config = {**tiny_config("qwen3_moe"), "model_type": "tiny_moe"}
    real = Qwen3MoeForCausalLM(Qwen3MoeConfig(**tiny_config("qwen3_moe")))
    assert count_parameters(config).total == sum(p.numel() for p in real.parameters())
    assert moe_layer_indices(config) == tiny_moe.moe_layers(config)
    with pytest.raises(UnsupportedArchitecture, match="'qwen3_moe' is not supported; supported: .*tiny_moe"):
        count_parameters(tiny_config("qwen3_moe"))
    assert issubclass(UnsupportedArchitecture, PlanError)  # one exception for planner and builder


def test_build_reads_the_entry(tiny_moe, tmp_path, monkeypatch):
    src = build_tiny("qwen3_moe", tmp_path / "src")
    cfg_path = src / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_type"] = "tiny_moe"
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setattr(build_module, "load_model", lambda *a, **k: pytest.fail("first_k needs no model"))
    build_proxy(BuildRequest(src, tmp_path / "proxy", keep=4, method="first_k"))
    out = json.loads((tmp_path / "proxy" / "config.json").read_text())
    assert architecture_for(out) is tiny_moe
    assert tiny_moe.expert_count(out) == 4
    monkeypatch.delitem(ARCHITECTURES, "tiny_moe")
    with pytest.raises(UnsupportedArchitecture):
        build_proxy(BuildRequest(src, tmp_path / "proxy2", keep=4, method="first_k"))


def test_fidelity_and_policy_introspect_through_the_entry(tiny_moe, monkeypatch):
    model = _tiny_moe_model()
    gates = fidelity.moe_layers(model)
    assert sorted(gates) == tiny_moe.moe_layers(model.config.to_dict())
    assert fidelity.num_routed_experts(model) == model.config.num_experts
    policy = Policy(model, "cpu", torch.float32)
    assert policy.moe_layers == sorted(gates) and policy.num_experts == model.config.num_experts
    monkeypatch.delitem(ARCHITECTURES, "tiny_moe")
    with pytest.raises(UnsupportedArchitecture):
        fidelity.num_routed_experts(model)
    with pytest.raises(ModelLoadError, match="no top-k router found"):
        Policy(_tiny_moe_model(), "cpu", torch.float32)


def test_reference_recipes_read_the_entry(tiny_moe, monkeypatch):
    # The tiny sizes are the recipe's (reference.ARCH_CONFIGS); which transformers config class
    # and which router scoring the recipe trains with come from the entry.
    monkeypatch.setitem(reference.ARCH_CONFIGS, "tiny_moe", reference.ARCH_CONFIGS["qwen3_moe"])
    assert type(reference.build_config("tiny_moe")) is Qwen3MoeConfig
    monkeypatch.setitem(ARCHITECTURES, "tiny_moe", replace(tiny_moe, config_class="DeepseekV3Config"))
    assert type(reference.build_config("tiny_moe")).__name__ == "DeepseekV3Config"
    monkeypatch.delitem(ARCHITECTURES, "tiny_moe")
    with pytest.raises(UnsupportedArchitecture):
        reference.build_config("tiny_moe")


def test_reference_training_scores_routers_as_the_entry_says(tiny_moe, monkeypatch):
    monkeypatch.setitem(reference.ARCH_CONFIGS, "tiny_moe", reference.ARCH_CONFIGS["qwen3_moe"])
    monkeypatch.setitem(ARCHITECTURES, "tiny_moe", replace(tiny_moe, router_scoring="sigmoid"))
    seen = []
    real = reference.balance_loss

    def spy(router_logits, attention_mask, top_k, scoring):
        seen.append(scoring)
        return real(router_logits, attention_mask, top_k, scoring)

    monkeypatch.setattr(reference, "balance_loss", spy)
    recipe = reference.TrainingRecipe(steps=1, batch_size=2, warmup_steps=1)
    reference.train_model("tiny_moe", recipe, config_overrides={"num_hidden_layers": 1})
    assert seen == ["sigmoid"]
