"""Exact parameter counts of MoE checkpoints from their ``config.json`` alone.

Sums the per-architecture counting fields (attention flavour, routed and shared
expert sizes, router bias, which layers are MoE) of the one architecture table,
:mod:`moeproxy.proxy_builder.architectures`; the formulas themselves are in
:mod:`moeproxy.proxy_builder.counting`.  Pure Python: no torch, no
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

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from moeproxy.proxy_builder.architectures import Architecture, architecture_for
from moeproxy.proxy_builder.counting import swiglu
from moeproxy.proxy_builder.plan_errors import IncompleteConfig, InvalidKeepSpec

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


def architecture(config: Config) -> Architecture:
    """The architecture table's entry for a config (``UnsupportedArchitecture`` when it has none)."""
    return architecture_for(config)


def expert_count(config: Config) -> int:
    """Routed experts per MoE layer, read through the architecture's key list."""
    return architecture_for(config).expert_count(config)


def top_k(config: Config) -> int:
    return int(config["num_experts_per_tok"])


def moe_layer_indices(config: Config) -> list[int]:
    return architecture_for(config).moe_layers(config)


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
        dense_mlp=dense_layers * swiglu(h, config["intermediate_size"]),
        shared_experts=moe_layers * arch.shared_experts(config),
        routed_experts=moe_layers * experts * expert_size,
        routers=moe_layers * experts * h,
        router_bias=moe_layers * experts if arch.has_router_bias else 0,
        norms=n_layers * (2 * h + attn_norms) + h,
        num_moe_layers=moe_layers,
        experts_per_layer=experts,
        expert_parameters=expert_size,
    )

