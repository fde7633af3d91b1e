"""Per-architecture facts the builder needs (SPEC section 2), one short entry each.

Everything any stage needs to know about an architecture lives here and nowhere
else: where its MoE blocks sit on disk and in memory, which config keys hold the
expert count, top-k and group-routing settings, which router tensors are sliced
per expert, which layers are MoE (builder); which formulas count its parameters
(planner, :mod:`moeproxy.proxy_builder.params`); which transformers router class
and routing maths it uses and how its router scores experts (reproduction's policy,
fidelity and reference recipes read these fields).  Adding an architecture is
adding one entry to ``ARCHITECTURES`` (docs/proxy_builder.md shows one).

Pure Python (no torch): the validation step runs before anything heavy loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moeproxy.proxy_builder.counting import gqa_attention, mla_attention, swiglu
from moeproxy.proxy_builder.errors import InvalidPruneRequest, UnsupportedArchitecture

Config = Mapping[str, Any]


@dataclass(frozen=True)
class GroupRouting:
    """DeepSeek group-limited routing: the config keys of the group count and groups chosen per token.

    Each group is scored by the sum of its top-2 experts (transformers
    ``DeepseekV3TopkRouter``), so every group needs at least 2 experts.
    """

    n_group_key: str = "n_group"
    topk_group_key: str = "topk_group"


@dataclass(frozen=True)
class Architecture:
    """How one architecture lays out its MoE layers.

    ``disk_moe_prefix`` / ``runtime_router`` are templates with ``{layer}``.  On
    disk, experts are ``{prefix}.experts.{e}.<rest>`` (per-expert keys, what
    transformers 5 writes) or ``{prefix}.experts.<name>`` with experts stacked
    along dim 0 (fused); both are handled.
    """

    model_type: str
    expert_count_keys: tuple[str, ...]  # read: first present; patched: every one present
    is_moe_layer: Callable[[Config, int], bool]
    # Parameter counting (planner), following the transformers 5.x modules one to one.
    attention: Callable[[Config], tuple[int, int]]  # -> (attention params, attention-internal norms)
    routed_expert_size: Callable[[Config], int]  # parameters of one routed expert
    # Routing at run time (reproduction): the transformers router module class, the name of
    # the routing maths in reproduction.policy.ROUTING_MATHS, and how experts are scored
    # ("softmax" or "sigmoid", for the load-balancing loss of the reference recipes).
    router_class: str
    routing: str = "softmax_topk"
    router_scoring: str = "softmax"
    config_class: str = ""  # transformers config class, for the reference recipes; "" = none
    shared_experts: Callable[[Config], int] = lambda c: 0  # parameters per MoE layer
    has_router_bias: bool = False  # e_score_correction_bias: a buffer, counted but not trained
    disk_moe_prefix: str = "model.layers.{layer}.mlp"
    # In memory (transformers 5): every supported model names its MoE block ``mlp``
    # (Mixtral included) with a ``gate`` router returning (logits, weights, ids) and
    # ``experts`` holding stacked [E, ...] parameters.
    runtime_moe_prefix: str = "model.layers.{layer}.mlp"
    top_k_key: str = "num_experts_per_tok"
    router_weight: str = "gate.weight"  # under the MoE prefix; rows = experts
    # Per-expert router vectors sliced with the router rows, when present on disk.
    router_vectors: tuple[str, ...] = ("gate.bias",)
    # Kept untouched (listed so the table says what the shared parts are called).
    shared_expert_prefixes: tuple[str, ...] = ()
    group_routing: GroupRouting | None = None
    notes: str = ""

    def moe_layers(self, config: Config) -> list[int]:
        return [i for i in range(int(config["num_hidden_layers"])) if self.is_moe_layer(config, i)]

    def expert_count(self, config: Config) -> int:
        for key in self.expert_count_keys:
            if config.get(key):
                return int(config[key])
        raise UnsupportedArchitecture(
            f"config of model_type {self.model_type!r} has none of the expert-count keys "
            f"{', '.join(self.expert_count_keys)}"
        )

    def top_k(self, config: Config) -> int:
        try:
            return int(config[self.top_k_key])
        except KeyError:
            raise UnsupportedArchitecture(f"config has no {self.top_k_key!r} (top-k)") from None

    @property
    def runtime_router(self) -> str:
        return self.runtime_moe_prefix + ".gate"

    def prefix(self, layer: int) -> str:
        return self.disk_moe_prefix.format(layer=layer)

    def expert_key_pattern(self) -> re.Pattern[str]:
        """Matches expert tensors on disk; groups: layer, expert (per-expert keys) or fused name."""
        prefix = re.escape(self.disk_moe_prefix).replace(re.escape("{layer}"), r"(?P<layer>\d+)")
        return re.compile(prefix + r"\.experts\.(?:(?P<expert>\d+)\.(?P<rest>.+)|(?P<fused>[A-Za-z_][^.]*(?:\..+)?))$")


def _qwen_is_moe_layer(cfg: Config, idx: int) -> bool:
    # transformers Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer condition.
    step = cfg.get("decoder_sparse_step", 1) or 1
    return idx not in (cfg.get("mlp_only_layers") or []) and (idx + 1) % step == 0


def _deepseek_is_moe_layer(cfg: Config, idx: int) -> bool:
    # transformers DeepseekV3DecoderLayer uses first_k_dense_replace only.
    return idx >= int(cfg.get("first_k_dense_replace", 0) or 0)


def _every_layer(cfg: Config, idx: int) -> bool:
    return True


def _qwen3_attention(cfg: Config) -> tuple[int, int]:
    return gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm="head")(cfg)


def _moe_swiglu(cfg: Config) -> int:
    return swiglu(cfg["hidden_size"], cfg["moe_intermediate_size"])


def _dense_swiglu(cfg: Config) -> int:
    return swiglu(cfg["hidden_size"], cfg["intermediate_size"])


def _deepseek_shared(cfg: Config) -> int:
    shared = cfg.get("n_shared_experts")
    return swiglu(cfg["hidden_size"], cfg["moe_intermediate_size"] * shared) if shared else 0


_DEEPSEEK = {
    "expert_count_keys": ("n_routed_experts", "num_local_experts"),
    "is_moe_layer": _deepseek_is_moe_layer,
    # MLA; the V3.2 DSA indexer is counted from index_n_heads/index_head_dim.
    "attention": mla_attention,
    "routed_expert_size": _moe_swiglu,
    "shared_experts": _deepseek_shared,
    "has_router_bias": True,
    "router_class": "DeepseekV3TopkRouter",
    "routing": "sigmoid_group_topk",
    "router_scoring": "sigmoid",
    "router_vectors": ("gate.e_score_correction_bias", "gate.bias"),
    "shared_expert_prefixes": ("shared_experts",),
    "group_routing": GroupRouting(),
    "notes": "dense MLP in the first first_k_dense_replace layers; fp32 e_score_correction_bias sliced",
}

ARCHITECTURES: dict[str, Architecture] = {
    # transformers 5.24 writes num_local_experts for Qwen3-MoE; released checkpoints carry num_experts.
    "qwen3_moe": Architecture(
        "qwen3_moe",
        ("num_experts", "num_local_experts"),
        _qwen_is_moe_layer,
        attention=_qwen3_attention,
        routed_expert_size=_moe_swiglu,
        router_class="Qwen3MoeTopKRouter",
        config_class="Qwen3MoeConfig",
    ),
    "qwen2_moe": Architecture(
        "qwen2_moe",
        ("num_experts", "num_local_experts"),
        _qwen_is_moe_layer,
        attention=gqa_attention(qkv_bias_key="qkv_bias", o_bias_key=None, qk_norm=None),
        routed_expert_size=_moe_swiglu,
        # shared expert MLP + its sigmoid gate (Linear(H, 1), no bias)
        shared_experts=lambda c: swiglu(c["hidden_size"], c["shared_expert_intermediate_size"]) + c["hidden_size"],
        router_class="Qwen2MoeTopKRouter",
        shared_expert_prefixes=("shared_expert", "shared_expert_gate"),
        notes="shared expert and its sigmoid gate kept; norm_topk_prob untouched",
    ),
    "mixtral": Architecture(
        "mixtral",
        ("num_local_experts", "num_experts"),
        _every_layer,
        attention=gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm=None),
        routed_expert_size=_dense_swiglu,
        router_class="MixtralTopKRouter",
        routing="softmax_topk_renorm",
        disk_moe_prefix="model.layers.{layer}.block_sparse_moe",
        notes="experts w1/w2/w3 on disk; transformers loads them as mlp.experts.*",
    ),
    "olmoe": Architecture(
        "olmoe",
        ("num_experts", "num_local_experts"),
        _every_layer,
        attention=gqa_attention(qkv_bias_key="attention_bias", o_bias_key="attention_bias", qk_norm="full"),
        routed_expert_size=_dense_swiglu,
        router_class="OlmoeTopKRouter",
    ),
    "deepseek_v3": Architecture("deepseek_v3", config_class="DeepseekV3Config", **_DEEPSEEK),
    # V3.2 = V3 + the DSA indexer (attention side): same MoE layout, same router class.
    # Reproduction does not instrument V3.2's own DeepseekV32TopkRouter yet (router_class "").
    "deepseek_v32": Architecture("deepseek_v32", **{**_DEEPSEEK, "router_class": ""}),
}


def architecture_named(model_type: str) -> Architecture:
    """The entry for a model_type string (what the reference recipes and CLI name)."""
    return architecture_for({"model_type": model_type})


def architecture_for(config: Config) -> Architecture:
    """The table entry for a config, or ``UnsupportedArchitecture`` naming what is supported."""
    model_type = config.get("model_type")
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}"
        ) from None


@dataclass(frozen=True)
class GroupSpec:
    """How a DeepSeek layer's experts split into routing groups, before and after pruning."""

    n_group: int
    topk_group: int
    policy: str  # "per_group" keeps every group; "flatten" rewrites n_group = topk_group = 1
    new_n_group: int
    new_topk_group: int
    groups: tuple[tuple[int, ...], ...] = field(default=())  # original expert ids of each group

    def config_patch(self) -> dict[str, int]:
        if self.policy == "flatten":
            return {"n_group": self.new_n_group, "topk_group": self.new_topk_group}
        return {}


GROUP_POLICIES: tuple[str, ...] = ("per_group", "flatten")


def keep_for_ratio(arch: Architecture, config: Config, keep_ratio: float, policy: str = "per_group") -> int:
    """The one rule that turns ``--keep-ratio r`` into K, for the planner and the builder alike:
    round(r·E), except under per-group retention of a group-routed model, where the ratio applies
    inside each group: round(r·E / n_group) per group, times n_group (so K is a valid per-group K)."""
    experts = arch.expert_count(config)
    groups = 1
    if arch.group_routing is not None and policy == "per_group":
        groups = int(config.get(arch.group_routing.n_group_key) or 1)
    return max(1, round(keep_ratio * experts / groups)) * groups


def group_spec(arch: Architecture, config: Config, keep: int, policy: str) -> GroupSpec | None:
    """Check the DeepSeek group constraints for keeping ``keep`` experts; None without group routing.

    ``per_group`` (default) keeps keep / n_group experts in every group, so the
    pruned router still does group-limited routing exactly as the original does.
    ``flatten`` rewrites n_group = topk_group = 1 (routing over all kept experts,
    i.e. group limiting switched off) for K that per-group retention cannot give.
    """
    if arch.group_routing is None:
        return None
    n_group = int(config.get(arch.group_routing.n_group_key) or 1)
    topk_group = int(config.get(arch.group_routing.topk_group_key) or 1)
    experts, top_k = arch.expert_count(config), arch.top_k(config)
    if policy not in GROUP_POLICIES:
        raise InvalidPruneRequest(f"unknown group policy {policy!r}; choose one of {', '.join(GROUP_POLICIES)}")
    if experts % n_group:
        raise InvalidPruneRequest(f"config is inconsistent: {experts} experts do not split into n_group={n_group}")
    per = experts // n_group
    groups = tuple(tuple(range(g * per, (g + 1) * per)) for g in range(n_group))
    if n_group == 1 or policy == "flatten":
        if keep < 2:
            raise InvalidPruneRequest("group-limited routing scores a group by its top-2 experts: keep at least 2")
        return GroupSpec(n_group, topk_group, "flatten" if n_group > 1 else policy, 1, 1, groups)
    valid = valid_per_group_keeps(n_group, topk_group, per, top_k)
    if keep not in valid:
        reasons = []
        if keep % n_group:
            reasons.append(f"{keep} is not divisible by n_group={n_group}")
        elif keep // n_group < 2:
            reasons.append(f"each of the {n_group} groups would keep {keep // n_group} < 2 experts")
        elif top_k > topk_group * (keep // n_group):
            reasons.append(
                f"top_k={top_k} > topk_group={topk_group} x {keep // n_group} kept per group "
                f"= {topk_group * (keep // n_group)} selectable experts"
            )
        shown = ", ".join(map(str, valid[:12])) + (" ..." if len(valid) > 12 else "")
        raise InvalidPruneRequest(
            f"cannot keep {keep} experts with per-group retention: {'; '.join(reasons)}. "
            f"Valid --keep values: {shown or 'none'}; or pass --group-policy flatten to rewrite "
            f"n_group/topk_group to 1 (switches group-limited routing off)."
        )
    return GroupSpec(n_group, topk_group, "per_group", n_group, topk_group, groups)


def valid_per_group_keeps(n_group: int, topk_group: int, per_group: int, top_k: int) -> list[int]:
    return [
        n_group * m for m in range(2, per_group + 1) if top_k <= topk_group * m
    ]
