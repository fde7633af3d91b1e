"""Resource planner (issue 9): how many accelerators an RL step needs, for a
model and for its proxy with fewer routed experts.

Pure Python (no torch, no transformers): it reads a ``config.json`` dict and
counts parameters with :mod:`moeproxy.proxy_builder.params`.  The builder's
report and the closed loop's resource request call :func:`plan` so there is one
code path for cost figures.  Imports nothing from later stages.

The memory model (documented with its reasons in docs/planner.md) is the peak of
one colocated RL step, the way verl's hybrid engine and MindSpeed-RL run on
Ascend: actor (trainer), frozen reference policy and rollout engine share the
same devices and stay resident.  Model states are sharded over all devices
(ZeRO-3 / FSDP style); each device additionally holds the activation
checkpoints of its own training micro-batch, which does not shrink as devices
are added.  The device count is then rounded the way deployments are laid out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder.architectures import architecture_for, keep_for_ratio
from moeproxy.proxy_builder.params import (
    ParameterCount,
    count_parameters,
    expert_count,
    top_k,
    validate_keep,
)
from moeproxy.proxy_builder.plan_errors import (
    IncompleteConfig,
    InvalidAssumptions,
    InvalidKeepSpec,
    UnknownPreset,
)

__all__ = [
    "MemoryBreakdown",
    "ModelPlan",
    "Plan",
    "PlanAssumptions",
    "count_parameters",
    "kv_cache_bytes_per_token",
    "load_preset",
    "plan",
    "preset_names",
    "resolve_keep",
]

GB = 1e9  # decimal gigabytes, the unit device vendors quote (a "64 GB" Ascend 910B)


@dataclass(frozen=True)
class PlanAssumptions:
    """Every assumption of the memory model, with its default and why.

    One set of defaults for every model: nothing here is tuned per preset.
    """

    # Device: Huawei Ascend 910B, 64 GB HBM, the paper's accelerators.
    device_memory_gb: float = 64.0
    # Share of device memory the frameworks can use: the runtime, HCCL/NCCL
    # communication buffers and allocator fragmentation take the rest (~10%).
    usable_memory_fraction: float = 0.9
    # Trainer (actor) model states: mixed-precision Adam as in the ZeRO paper
    # (Rajbhandari et al. 2020): bf16 weights and gradients, fp32 master
    # weights and both Adam moments, 16 bytes per trained parameter.
    weight_bytes: float = 2.0
    grad_bytes: float = 2.0
    master_weight_bytes: float = 4.0
    adam_m_bytes: float = 4.0
    adam_v_bytes: float = 4.0
    # GRPO/PPO's frozen reference policy, bf16, colocated with the actor and
    # sharded the same way (verl's actor_rollout_ref worker group).
    reference_bytes: float = 2.0
    # The rollout engine's own bf16 weight copy (vLLM / vllm-ascend), resident:
    # no sleep-mode offload, which would trade step time for memory.
    rollout_weight_bytes: float = 2.0
    # Sequence length (prompt + response) of one rollout / training sample.
    seq_len: int = 4096
    # Sequences the rollout engine holds a KV cache for at once, across the
    # whole cluster.  The same RL step (same batch) runs on original and proxy.
    rollout_batch: int = 256
    # KV cache element size (bf16).
    kv_cache_bytes: float = 2.0
    # Tokens of one training micro-batch on one device (verl's dynamic batching,
    # ppo_max_token_len_per_gpu; here 8 sequences of 4096).  A micro-batch holds
    # at least one whole sequence, so the planner uses max(this, seq_len).
    train_tokens_per_device: int = 32768
    # Full activation recomputation (standard at these sizes): each layer keeps
    # only its bf16 input per token.  Under 1F1B pipelining the first stage holds
    # PP micro-batches of L/PP layers, so the per-device total is tokens x L x H
    # whatever the pipeline depth.  The recomputed layer's transient working set
    # is inside the usable-fraction headroom.
    activation_bytes: float = 2.0
    # Accelerators per node (Atlas 800T A2: 8 NPUs; an A3 super-node board: 16).
    # Above one node, jobs get whole nodes.
    devices_per_node: int = 8
    # Deployments use power-of-two device counts (TP x PP x DP x EP layouts).
    power_of_two: bool = True

    def __post_init__(self) -> None:
        for name in (
            "weight_bytes",
            "grad_bytes",
            "master_weight_bytes",
            "adam_m_bytes",
            "adam_v_bytes",
            "reference_bytes",
            "rollout_weight_bytes",
            "kv_cache_bytes",
            "activation_bytes",
        ):
            if getattr(self, name) < 0:
                raise InvalidAssumptions(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.device_memory_gb <= 0:
            raise InvalidAssumptions(f"device_memory_gb must be > 0, got {self.device_memory_gb}")
        if not 0 < self.usable_memory_fraction <= 1:
            raise InvalidAssumptions(
                f"usable_memory_fraction must be in (0, 1], got {self.usable_memory_fraction}"
            )
        for name in ("seq_len", "rollout_batch", "train_tokens_per_device", "devices_per_node"):
            if getattr(self, name) < 1:
                raise InvalidAssumptions(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def trainer_bytes_per_param(self) -> float:
        return (
            self.weight_bytes
            + self.grad_bytes
            + self.master_weight_bytes
            + self.adam_m_bytes
            + self.adam_v_bytes
        )

    @property
    def usable_bytes_per_device(self) -> float:
        return self.device_memory_gb * GB * self.usable_memory_fraction

    @property
    def micro_batch_tokens(self) -> int:
        return max(self.train_tokens_per_device, self.seq_len)


def kv_cache_bytes_per_token(config: Mapping[str, Any], element_bytes: float = 2.0) -> float:
    """KV-cache bytes one token occupies in the rollout engine, all layers.

    MLA (DeepSeek) caches the compressed latent plus the shared rope key
    (kv_lora_rank + qk_rope_head_dim per layer), as vLLM's MLA backend does;
    DeepSeek-V3.2's sparse-attention indexer adds its own key (index_head_dim).
    GQA models cache K and V for every KV head.
    """
    layers = config["num_hidden_layers"]
    if config.get("kv_lora_rank"):
        per_layer = config["kv_lora_rank"] + config["qk_rope_head_dim"] + (config.get("index_head_dim") or 0)
    else:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        per_layer = 2 * kv_heads * head_dim
    return layers * per_layer * element_bytes


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of one RL step's peak, by component.

    ``sharded`` components are cluster totals divided over the devices;
    ``activations_per_device`` is held by every device.
    """

    trainer_weights: float
    trainer_gradients: float
    optimizer_states: float  # fp32 master + Adam m + v
    reference_weights: float
    rollout_weights: float
    kv_cache: float
    activations_per_device: float

    @property
    def sharded(self) -> float:
        return (
            self.trainer_weights
            + self.trainer_gradients
            + self.optimizer_states
            + self.reference_weights
            + self.rollout_weights
            + self.kv_cache
        )

    def total(self, devices: int) -> float:
        return self.sharded + self.activations_per_device * devices

    def to_gb(self, devices: int) -> dict[str, float]:
        out = {name: value / GB for name, value in asdict(self).items() if name != "activations_per_device"}
        out["activations"] = self.activations_per_device * devices / GB
        out["total"] = self.total(devices) / GB
        out["per_device"] = self.total(devices) / devices / GB
        return {k: round(v, 3) for k, v in out.items()}


def memory_breakdown(
    config: Mapping[str, Any], params: ParameterCount, a: PlanAssumptions
) -> MemoryBreakdown:
    trained = params.trainable
    # The router bias (a buffer) is stored with the weights but has no optimizer state.
    stored = params.total
    return MemoryBreakdown(
        trainer_weights=stored * a.weight_bytes,
        trainer_gradients=trained * a.grad_bytes,
        optimizer_states=trained * (a.master_weight_bytes + a.adam_m_bytes + a.adam_v_bytes),
        reference_weights=stored * a.reference_bytes,
        rollout_weights=stored * a.rollout_weight_bytes,
        kv_cache=a.rollout_batch * a.seq_len * kv_cache_bytes_per_token(config, a.kv_cache_bytes),
        activations_per_device=a.micro_batch_tokens
        * config["num_hidden_layers"]
        * config["hidden_size"]
        * a.activation_bytes,
    )


def round_devices(raw: float, a: PlanAssumptions) -> int:
    """Deployment rounding: power of two, then whole nodes once above one node.

    With the usual node sizes (8 or 16, powers of two) a power-of-two count above
    one node is already a whole number of nodes.
    """
    n = max(1, math.ceil(raw - 1e-9))
    if a.power_of_two:
        n = 1 << (n - 1).bit_length()
    if n > a.devices_per_node:
        n = math.ceil(n / a.devices_per_node) * a.devices_per_node
    return n


def expert_parallel_degree(devices: int, experts: int) -> int:
    """Largest expert-parallel degree that divides both the device count and the expert count.

    With EP below the device count the remaining factor is expert data
    parallelism; states stay sharded over all devices (ZeRO-3), so memory is
    unchanged, but a layout must exist: this is it.
    """
    return math.gcd(devices, experts)


@dataclass(frozen=True)
class ModelPlan:
    parameters: ParameterCount
    memory: MemoryBreakdown
    devices_raw: float  # fractional devices before rounding
    devices: int
    experts_per_layer: int
    expert_parallel: int
    kv_cache_bytes_per_token: float

    @property
    def memory_gb_total(self) -> float:
        return self.memory.total(self.devices) / GB

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters.to_dict(),
            "parameters_billion": round(self.parameters.total / 1e9, 3),
            "experts_per_layer": self.experts_per_layer,
            "memory_gb": self.memory.to_gb(self.devices),
            "devices_raw": round(self.devices_raw, 2),
            "devices": self.devices,
            "expert_parallel": self.expert_parallel,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
        }


@dataclass(frozen=True)
class Plan:
    model_type: str
    top_k: int
    keep: int
    original: ModelPlan
    proxy: ModelPlan
    assumptions: PlanAssumptions = field(default_factory=PlanAssumptions)

    @property
    def saving(self) -> dict[str, float]:
        o, p = self.original, self.proxy
        return {
            "devices_ratio": round(o.devices / p.devices, 3),
            "devices_saved_fraction": round(1 - p.devices / o.devices, 4),
            "memory_ratio": round(o.memory_gb_total / p.memory_gb_total, 3),
            "parameter_ratio": round(o.parameters.total / p.parameters.total, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "top_k": self.top_k,
            "keep": self.keep,
            "original": self.original.to_dict(),
            "proxy": self.proxy.to_dict(),
            "saving": self.saving,
            "assumptions": asdict(self.assumptions),
        }


def resolve_keep(config: Mapping[str, Any], keep: int | None = None, keep_ratio: float | None = None,
                 group_policy: str = "per_group") -> int:
    """Turn ``--keep K`` or ``--keep-ratio r`` into a validated expert count.

    A ratio goes through the builder's own rule (:func:`architectures.keep_for_ratio`: round(r·E),
    per group for group-routed models under per-group retention), so plan and build agree on K;
    at least top_k is still required.
    """
    if (keep is None) == (keep_ratio is None):
        raise InvalidKeepSpec(
            "give exactly one of keep (experts per MoE layer) or keep_ratio (fraction in (0, 1])"
        )
    expert_count(config)  # the planner's own check of the architecture, with its message
    if keep_ratio is not None:
        if not (isinstance(keep_ratio, int | float) and 0 < keep_ratio <= 1):
            raise InvalidKeepSpec(f"keep_ratio must be in (0, 1], got {keep_ratio!r}")
        keep = keep_for_ratio(architecture_for(config), config, keep_ratio, group_policy)
    validate_keep(config, keep)
    return keep


def _model_plan(config: Mapping[str, Any], keep: int | None, a: PlanAssumptions) -> ModelPlan:
    params = count_parameters(config, keep)
    mem = memory_breakdown(config, params, a)
    room = a.usable_bytes_per_device - mem.activations_per_device
    if room <= 0:
        raise InvalidAssumptions(
            f"one training micro-batch of {a.micro_batch_tokens} tokens needs "
            f"{mem.activations_per_device / GB:.1f} GB of activations per device, more than the "
            f"{a.usable_bytes_per_device / GB:.1f} GB usable: lower train_tokens_per_device or seq_len"
        )
    raw = mem.sharded / room
    devices = round_devices(raw, a)
    return ModelPlan(
        parameters=params,
        memory=mem,
        devices_raw=raw,
        devices=devices,
        experts_per_layer=params.experts_per_layer,
        expert_parallel=expert_parallel_degree(devices, params.experts_per_layer),
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(config, a.kv_cache_bytes),
    )


def plan(
    config: Mapping[str, Any],
    keep: int | None = None,
    keep_ratio: float | None = None,
    assumptions: PlanAssumptions = PlanAssumptions(),
) -> Plan:
    """Plan original vs proxy for one RL step; exactly one of ``keep`` / ``keep_ratio``."""
    config = strip_notes(config)
    try:
        return _plan(config, resolve_keep(config, keep, keep_ratio), assumptions)
    except KeyError as exc:
        raise IncompleteConfig(
            f"config of model_type {config.get('model_type')!r} lacks {exc.args[0]!r}, "
            "which the planner needs"
        ) from None


def _plan(config: dict[str, Any], k: int, assumptions: PlanAssumptions) -> Plan:
    return Plan(
        model_type=config["model_type"],
        top_k=top_k(config),
        keep=k,
        original=_model_plan(config, None, assumptions),
        proxy=_model_plan(config, k, assumptions),
        assumptions=assumptions,
    )


# --- presets ---------------------------------------------------------------

_PRESETS = resources.files("moeproxy.proxy_builder") / "presets"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _PRESETS.iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> dict[str, Any]:
    """A shipped config (typed from the public config.json; ``_source`` says where)."""
    path = _PRESETS / f"{name.lower()}.json"
    if not path.is_file():
        raise UnknownPreset(f"no preset {name!r}; available: {', '.join(preset_names())}")
    return json.loads(path.read_text())


def strip_notes(config: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the ``_source``-style annotation keys the presets carry."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def load_config_file(path: Path | str) -> dict[str, Any]:
    """Read a config.json (or a checkpoint directory containing one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    return json.loads(p.read_text())
