"""Planner parameter counts against real tiny transformers models (issue 9).

Every architecture, original and proxy: ``count_parameters`` must equal
``sum(p.numel() for p in model.parameters())`` of the model transformers builds
from the same config (the proxy built directly with the smaller expert count).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from moeproxy.proxy_builder.params import count_parameters, expert_count
from tiny_models import build_model, tiny_config

torch.set_num_threads(1)

EXPERT_KEY = {
    "qwen3_moe": "num_experts",
    "qwen2_moe": "num_experts",
    "mixtral": "num_local_experts",
    "olmoe": "num_experts",
    "deepseek_v3": "n_routed_experts",
    "deepseek_v32": "n_routed_experts",
}

# (tiny_models architecture, overrides): the base configs plus the variants
# whose counting differs (tied embeddings, biases, dense layers, MLA without
# q_lora, the V3.2 indexer).
VARIANTS = {
    "qwen3_moe": ("qwen3_moe", {}),
    "qwen3_moe-tied": ("qwen3_moe", {"tie_word_embeddings": True}),
    "qwen3_moe-dense-layer-bias": ("qwen3_moe", {"mlp_only_layers": [1], "attention_bias": True}),
    "qwen2_moe": ("qwen2_moe", {}),
    "qwen2_moe-sparse-step-2-nobias": ("qwen2_moe", {"decoder_sparse_step": 2, "qkv_bias": False}),
    "mixtral": ("mixtral", {}),
    "mixtral-tied": ("mixtral", {"tie_word_embeddings": True}),
    "olmoe": ("olmoe", {}),
    "olmoe-tied": ("olmoe", {"tie_word_embeddings": True}),
    "deepseek_v3": ("deepseek_v3", {}),
    "deepseek_v3-tied": ("deepseek_v3", {"tie_word_embeddings": True}),
    "deepseek_v3-no-q-lora-2-dense": ("deepseek_v3", {"q_lora_rank": None, "first_k_dense_replace": 2}),
    "deepseek_v32": (
        "deepseek_v3",
        {"model_type": "deepseek_v32", "index_n_heads": 4, "index_head_dim": 8, "index_topk": 4},
    ),
}


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _numel_where(model, predicate) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if predicate(name))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_original_count_equals_model_numel(variant):
    arch, overrides = VARIANTS[variant]
    cfg = tiny_config(arch, **overrides)
    model = build_model(arch, **overrides)
    count = count_parameters(cfg)
    assert count.trainable == _numel(model)
    buffers = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert count.router_bias == buffers
    assert count.total == _numel(model) + buffers
    # Components against the modules they name.
    assert count.routed_experts == _numel_where(model, lambda n: ".mlp.experts." in n)
    assert count.routers == _numel_where(model, lambda n: n.endswith("mlp.gate.weight"))
    assert count.embeddings == _numel_where(model, lambda n: "embed_tokens" in n)
    assert count.lm_head == _numel_where(model, lambda n: n.startswith("lm_head"))
    assert count.shared_experts == _numel_where(model, lambda n: ".shared_expert" in n)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_proxy_count_equals_model_built_with_fewer_experts(variant):
    arch, overrides = VARIANTS[variant]
    cfg = tiny_config(arch, **overrides)
    keep = 4  # >= top_k (2); 2 experts per group for DeepSeek's n_group=2
    assert keep < expert_count(cfg)
    key = EXPERT_KEY[cfg["model_type"]]
    proxy_model = build_model(arch, **{**overrides, key: keep})
    count = count_parameters(cfg, keep=keep)
    assert count.trainable == _numel(proxy_model)
    assert count.experts_per_layer == keep
    # Only routed experts, routers (and router bias) shrink.
    full = count_parameters(cfg)
    for same in ("embeddings", "lm_head", "attention", "dense_mlp", "shared_experts", "norms"):
        assert getattr(count, same) == getattr(full, same)


def test_qwen3_config_written_with_num_local_experts_is_read():
    """transformers 5.24 writes Qwen3-MoE configs with num_local_experts only (SPEC section 2)."""
    model = build_model("qwen3_moe")
    written = model.config.to_dict()
    assert "num_experts" not in written or written.get("num_local_experts")
    written.pop("num_experts", None)
    assert count_parameters(written).trainable == _numel(model)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_json_as_transformers_writes_it_plans(variant, tmp_path):
    """The builder plans from the config.json on disk, not from our dicts: count and plan from that."""
    import json

    from moeproxy.proxy_builder.plan import plan

    arch, overrides = VARIANTS[variant]
    model = build_model(arch, **overrides)
    model.config.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert count_parameters(written).trainable == _numel(model)
    p = plan(written, keep=4)
    assert p.proxy.devices <= p.original.devices
    assert p.proxy.parameters.experts_per_layer == 4
