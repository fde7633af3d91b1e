"""Exact parameter counts of MoE checkpoints from their ``config.json`` alone.

Owns the parameter-counting side of the per-architecture differences (which
config key holds the expert count, which layers are MoE, shared experts,
attention flavour); the on-disk key patterns used by checkpoint surgery live
in :mod:`moeproxy.proxy_builder.architectures`.  Pure Python: no torch, no
transformers, so the light install can plan (issue 9).

Counts follow the HF transformers 5.x modules one to one (``Qwen3MoeForCausalLM``,
``Qwen2MoeForCausalLM``, ``MixtralForCausalLM``, ``OlmoeForCausalLM``,
``DeepseekV3ForCausalLM``, ``DeepseekV32ForCausalLM``); tests compare them with
``sum(p.numel() for p in model.parameters())`` of tiny real models.  DeepSeek's
multi-token-prediction layers (``num_nextn_predict_layers``) are not
instantiated by transformers and are not used by RL post-training, so they are
not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from moeproxy.proxy_builder.plan_errors import IncompleteConfig, InvalidKeepSpec, UnsupportedArchitecture

Config = Mapping[str, Any]


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by component for one model (original or proxy).

    ``router_bias`` is DeepSeek's ``e_score_correction_bias``: a persistent
    buffer (saved in the checkpoint, not trained by the optimizer), so it is in
    :attr:`total` but not in :attr:`trainable`.
    """

    embeddings: int
    lm_head: int  # 0 when tied to the embeddings
    attention: int  # q/k/v/o (+biases); MLA low-rank projections and their norms; DSA indexer
    dense_mlp: int  # MLP of non-MoE layers
    shared_experts: int  # DeepSeek shared experts; Qwen2-MoE shared expert + shared_expert_gate
    routed_experts: int
    routers: int  # router weight matrices (E x H per MoE layer)
    router_bias: int  # DeepSeek e_score_correction_bias (buffer)
    norms: int  # layer norms, final norm, Qwen3/OLMoE q_norm/k_norm
    # Shape facts the memory model needs.
    num_moe_layers: int
    experts_per_layer: int  # routed experts per MoE layer in this model
    expert_parameters: int  # parameters of one routed expert

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in COMPONENTS)

    @property
    def trainable(self) -> int:
        return self.total - self.router_bias

    @property
    def non_expert(self) -> int:
        """Everything but the routed experts (kept whole by the proxy, SPEC section 2)."""
        return self.total - self.routed_experts

    def to_dict(self) -> dict[str, int]:
        out = {name: getattr(self, name) for name in COMPONENTS}
        out["total"] = self.total
        out["trainable"] = self.trainable
        return out


COMPONENTS: tuple[str, ...] = tuple(
    f.name
    for f in fields(ParameterCount)
    if f.name not in {"num_moe_layers", "experts_per_layer", "expert_parameters"}
)


@dataclass(frozen=True)
class ArchitectureCounting:
    """How to read one architecture's config for counting.

    ``expert_count_keys`` are tried in order (SPEC section 2: transformers 5.24
    writes Qwen3-MoE configs with ``num_local_experts``, released checkpoints
    carry ``num_experts``).
    """

    expert_count_keys: tuple[str, ...]
    is_moe_layer: Callable[[Config, int], bool]
    attention: Callable[[Config], tuple[int, int]]  # -> (attention params, attention-internal norms)
    routed_expert_size: Callable[[Config], int]  # parameters of one routed expert
    shared_experts: Callable[[Config], int]  # per MoE layer
    has_router_bias: bool = False


def _head_dim(cfg: Config) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def _gqa_attention(*, qkv_bias_key: str, o_bias_key: str | None, qk_norm: str | None) -> Callable:
    """q/k/v/o projections with grouped KV heads.

    ``qk_norm``: ``"head"`` (Qwen3: RMSNorm over head_dim) or ``"full"`` (OLMoE:
    RMSNorm over all q heads and all kv heads).
    """

    def count(cfg: Config) -> tuple[int, int]:
        h, hd = cfg["hidden_size"], _head_dim(cfg)
        q_out = cfg["num_attention_heads"] * hd
        kv_out = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        kv_out *= hd
        qkv_bias = bool(cfg.get(qkv_bias_key, qkv_bias_key == "qkv_bias"))
        o_bias = bool(cfg.get(o_bias_key, False)) if o_bias_key else False
        params = h * q_out + 2 * h * kv_out + q_out * h
        if qkv_bias:
            params += q_out + 2 * kv_out
        if o_bias:
            params += h
        norms = {"head": 2 * hd, "full": q_out + kv_out, None: 0}[qk_norm]
        return params, norms

    return count


def _mla_attention(cfg: Config) -> tuple[int, int]:
    """DeepSeek multi-head latent attention (+ the V3.2 sparse-attention indexer).

    MLA's own norms (q_a_layernorm, kv_a_layernorm) are counted with attention.
    """
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    q_lora, kv_lora = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    bias = bool(cfg.get("attention_bias", False))
    qk_head = nope + rope
    if q_lora:
        params = h * q_lora + (q_lora if bias else 0) + q_lora + q_lora * nh * qk_head  # q_a, q_a_norm, q_b
    else:
        params = h * nh * qk_head
    params += h * (kv_lora + rope) + ((kv_lora + rope) if bias else 0)  # kv_a_proj_with_mqa
    params += kv_lora  # kv_a_layernorm
    params += kv_lora * nh * (nope + v)  # kv_b_proj
    params += nh * v * h + (h if bias else 0)  # o_proj
    if cfg.get("index_n_heads"):  # DeepSeek-V3.2 DSA lightning indexer
        n, d = cfg["index_n_heads"], cfg["index_head_dim"]
        params += q_lora * n * d + h * d + 2 * d + h * n  # wq_b, wk, k_norm (LayerNorm w+b), weights_proj
    return params, 0


def _swiglu(h: int, i: int) -> int:
    return 3 * h * i  # gate, up, down


def _qwen_is_moe_layer(cfg: Config, idx: int) -> bool:
    # transformers Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer condition.
    step = cfg.get("decoder_sparse_step", 1) or 1
    return idx not in (cfg.get("mlp_only_layers") or []) and (idx + 1) % step == 0


def _deepseek_is_moe_layer(cfg: Config, idx: int) -> bool:
    # transformers uses first_k_dense_replace only (moe_layer_freq is 1 in every release).
    return idx >= cfg.get("first_k_dense_replace", 0)


ARCHITECTURES: dict[str, ArchitectureCounting] = {
    "qwen3_moe": ArchitectureCounting(
        expert_count_keys=("num_experts", "num_local_experts"),
        is_moe_layer=_qwen_is_moe_layer,
        attention=_gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm="head"),
        routed_expert_size=lambda c: _swiglu(c["hidden_size"], c["moe_intermediate_size"]),
        shared_experts=lambda c: 0,
    ),
    "qwen2_moe": ArchitectureCounting(
        expert_count_keys=("num_experts", "num_local_experts"),
        is_moe_layer=_qwen_is_moe_layer,
        attention=_gqa_attention(qkv_bias_key="qkv_bias", o_bias_key=None, qk_norm=None),
        routed_expert_size=lambda c: _swiglu(c["hidden_size"], c["moe_intermediate_size"]),
        # shared expert MLP + its sigmoid gate (Linear(H, 1), no bias)
        shared_experts=lambda c: (
            _swiglu(c["hidden_size"], c["shared_expert_intermediate_size"]) + c["hidden_size"]
        ),
    ),
    "mixtral": ArchitectureCounting(
        expert_count_keys=("num_local_experts", "num_experts"),
        is_moe_layer=lambda c, i: True,
        attention=_gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm=None),
        routed_expert_size=lambda c: _swiglu(c["hidden_size"], c["intermediate_size"]),
        shared_experts=lambda c: 0,
    ),
    "olmoe": ArchitectureCounting(
        expert_count_keys=("num_experts", "num_local_experts"),
        is_moe_layer=lambda c, i: True,
        attention=_gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm="full"),
        routed_expert_size=lambda c: _swiglu(c["hidden_size"], c["intermediate_size"]),
        shared_experts=lambda c: 0,
    ),
    "deepseek_v3": ArchitectureCounting(
        expert_count_keys=("n_routed_experts", "num_local_experts"),
        is_moe_layer=_deepseek_is_moe_layer,
        attention=_mla_attention,
        routed_expert_size=lambda c: _swiglu(c["hidden_size"], c["moe_intermediate_size"]),
        shared_experts=lambda c: (
            _swiglu(c["hidden_size"], c["moe_intermediate_size"] * c.get("n_shared_experts", 1))
            if c.get("n_shared_experts")
            else 0
        ),
        has_router_bias=True,
    ),
}
# DeepSeek-V3.2 is DeepSeek-V3 plus the DSA indexer, which _mla_attention counts
# from index_n_heads/index_head_dim.
ARCHITECTURES["deepseek_v32"] = ARCHITECTURES["deepseek_v3"]


def architecture(config: Config) -> ArchitectureCounting:
    model_type = config.get("model_type")
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"model_type {model_type!r} is not supported by the planner; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None


def expert_count(config: Config) -> int:
    """Routed experts per MoE layer, read through the architecture's key list."""
    arch = architecture(config)
    for key in arch.expert_count_keys:
        if config.get(key):
            return int(config[key])
    raise UnsupportedArchitecture(
        f"config of model_type {config.get('model_type')!r} has none of {', '.join(arch.expert_count_keys)}"
    )


def top_k(config: Config) -> int:
    return int(config["num_experts_per_tok"])


def moe_layer_indices(config: Config) -> list[int]:
    arch = architecture(config)
    return [i for i in range(config["num_hidden_layers"]) if arch.is_moe_layer(config, i)]


def validate_keep(config: Config, keep: int) -> None:
    """Reject a keep count the proxy cannot have, before any work (STYLE: fail early)."""
    e, k = expert_count(config), top_k(config)
    if not isinstance(keep, int) or isinstance(keep, bool):
        raise InvalidKeepSpec(f"keep must be an integer number of experts, got {keep!r}")
    if keep > e:
        raise InvalidKeepSpec(
            f"cannot keep {keep} experts: the model has only {e} routed experts per MoE layer"
        )
    if keep < k:
        raise InvalidKeepSpec(
            f"cannot keep {keep} experts: top-k routing selects {k} per token (num_experts_per_tok), "
            f"so keep at least {k}"
        )


def count_parameters(config: Config, keep: int | None = None) -> ParameterCount:
    """Exact parameter counts by component; ``keep`` = routed experts kept per MoE layer."""
    try:
        return _count_parameters(config, keep)
    except KeyError as exc:
        raise IncompleteConfig(
            f"config of model_type {config.get('model_type')!r} lacks {exc.args[0]!r}, "
            "which the planner needs"
        ) from None


def _count_parameters(config: Config, keep: int | None) -> ParameterCount:
    arch = architecture(config)
    experts = expert_count(config)
    if keep is not None:
        validate_keep(config, keep)
        experts = keep
    h, vocab, n_layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    moe_layers = len(moe_layer_indices(config))
    dense_layers = n_layers - moe_layers
    attn, attn_norms = arch.attention(config)
    expert_size = arch.routed_expert_size(config)
    tied = bool(config.get("tie_word_embeddings", False))
    return ParameterCount(
        embeddings=vocab * h,
        lm_head=0 if tied else vocab * h,
        attention=n_layers * attn,
        dense_mlp=dense_layers * _swiglu(h, config["intermediate_size"]),
        shared_experts=moe_layers * arch.shared_experts(config),
        routed_experts=moe_layers * experts * expert_size,
        routers=moe_layers * experts * h,
        router_bias=moe_layers * experts if arch.has_router_bias else 0,
        norms=n_layers * (2 * h + attn_norms) + h,
        num_moe_layers=moe_layers,
        experts_per_layer=experts,
        expert_parameters=expert_size,
    )

