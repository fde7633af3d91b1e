"""Tiny random MoE checkpoints for tests, built from small configs (no downloads).

``build_tiny(arch, tmp_path, **overrides)`` builds a randomly initialised
transformers model of one supported architecture, saves it with
``save_pretrained`` (safetensors) together with a small byte-level tokenizer,
and returns the checkpoint directory.  ``TINY_CONFIGS`` holds the configs, so
the planner tests can count parameters from the same dicts.

What transformers 5.24 writes (checked when this file was written): experts on
disk are per-expert keys (``model.layers.N.mlp.experts.E.gate_proj.weight``,
Mixtral ``model.layers.N.block_sparse_moe.experts.E.w1.weight``) although the
in-memory modules stack them (``gate_up_proj [E, 2I, H]``); a Qwen3-MoE config
is written with ``num_local_experts`` and no ``num_experts``.
``build_tiny(..., layout="fused")`` writes the in-memory stacked layout instead,
to exercise readers of fused checkpoints.

Every factory takes ``seed`` so two builds with the same arguments are
bit-identical.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

# Shared by every architecture: small enough that a forward pass is a few ms.
_COMMON: dict[str, Any] = {
    "vocab_size": 260,  # 256 byte tokens + 4 specials, see _byte_tokenizer
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "num_experts_per_tok": 2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
    "dtype": "float32",
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        **_COMMON,
        "model_type": "qwen3_moe",
        "head_dim": 8,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "num_experts": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    },
    "qwen2_moe": {
        **_COMMON,
        "model_type": "qwen2_moe",
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 32,
        "num_experts": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": False,
    },
    "mixtral": {
        **_COMMON,
        "model_type": "mixtral",
        "intermediate_size": 16,
        "num_local_experts": 8,
    },
    "olmoe": {
        **_COMMON,
        "model_type": "olmoe",
        "num_key_value_heads": 4,
        "intermediate_size": 16,
        "num_experts": 8,
        "norm_topk_prob": False,
    },
    "deepseek_v3": {
        **_COMMON,
        "model_type": "deepseek_v3",
        "num_hidden_layers": 3,
        "num_key_value_heads": 4,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "topk_method": "noaux_tc",
    },
}

ARCHITECTURES: tuple[str, ...] = tuple(TINY_CONFIGS)

#: Test cases by name: (tiny config, overrides).  DeepSeek-V3.2 is V3 plus the DSA
#: indexer, built from the V3 config.
ARCH_CASES: dict[str, tuple[str, dict[str, Any]]] = {arch: (arch, {}) for arch in ARCHITECTURES}
ARCH_CASES["deepseek_v32"] = (
    "deepseek_v3",
    {"model_type": "deepseek_v32", "index_n_heads": 4, "index_head_dim": 8, "index_topk": 4},
)


def tiny_config(arch: str, **overrides: Any) -> dict[str, Any]:
    """The config dict of one tiny architecture with ``overrides`` applied."""
    if arch not in TINY_CONFIGS:
        raise KeyError(f"no tiny config for {arch!r}; known: {', '.join(TINY_CONFIGS)}")
    cfg = copy.deepcopy(TINY_CONFIGS[arch])
    cfg.update(overrides)
    return cfg


def _byte_tokenizer():
    """A byte-level tokenizer (ids 0..3 specials, 4..259 bytes), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    byte_chars.sort()
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in byte_chars:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def build_model(arch: str, *, seed: int = 0, **overrides: Any):
    """The randomly initialised ``AutoModelForCausalLM`` for a tiny config (in memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_config(arch, **overrides)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    _randomise_routing_buffers(model, seed)
    return model.eval()


def _randomise_routing_buffers(model, seed: int) -> None:
    """Give zero-initialised router parameters and biases random values.

    Qwen/OLMoE routers and DeepSeek's ``e_score_correction_bias`` start at zero;
    a test of slicing them would pass for the wrong reason if every entry were
    equal.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("mlp.gate.weight", "e_score_correction_bias")):
                scale = 0.5 if name.endswith("weight") else 0.05
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * scale)


def build_tiny(
    arch: str,
    tmp_path: Path | str,
    *,
    seed: int = 0,
    layout: str = "per_expert",
    max_shard_size: str | int | None = None,
    with_tokenizer: bool = True,
    **overrides: Any,
) -> Path:
    """Build, save and return the directory of a tiny ``arch`` checkpoint.

    ``layout="per_expert"`` is what ``save_pretrained`` writes; ``"fused"`` writes
    the in-memory stacked expert tensors under their module names instead.
    ``max_shard_size`` (e.g. ``"20KB"``) forces a sharded checkpoint with an index.
    """
    out = Path(tmp_path) / f"{arch}-{layout}-s{seed}"
    model = build_model(arch, seed=seed, **overrides)
    kwargs: dict[str, Any] = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out, **kwargs)
    if layout == "fused":
        _rewrite_fused(model, out)
    elif layout != "per_expert":
        raise ValueError(f"layout must be 'per_expert' or 'fused', not {layout!r}")
    if with_tokenizer:
        _byte_tokenizer().save_pretrained(out)
    return out


def _rewrite_fused(model, out: Path) -> None:
    """Replace the saved checkpoint with one shard of the in-memory (fused) state dict.

    Mixtral's in-memory module names (``mlp.*``) differ from its disk names
    (``block_sparse_moe.*``); the disk prefix is kept so the fused file looks like
    a checkpoint written by a converter that stacks experts in place.
    """
    from safetensors.torch import save_file

    for f in out.glob("model*.safetensors*"):
        f.unlink()
    state = {}
    mixtral = model.config.model_type == "mixtral"
    for name, tensor in model.state_dict().items():
        if mixtral and ".mlp." in name:
            name = name.replace(".mlp.", ".block_sparse_moe.")
        state[name] = tensor.detach().contiguous().clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def load_config(model_dir: Path | str) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())
