"""Checkpoint surgery: write the proxy's safetensors, index and config (SPEC section 2, no torch).

Works on safetensors keys and the original ``config.json`` only, shard by shard:
kept experts are copied under their new ids 0..K-1 (or, for fused checkpoints,
their dim-0 rows), router rows and per-expert router vectors (router bias,
DeepSeek ``e_score_correction_bias``) are sliced in the same order, and every
other tensor is copied byte for byte.  Tensors are streamed as byte ranges
(:mod:`moeproxy.proxy_builder.checkpoint`), so memory stays bounded by the copy
buffer, not by the shard size.  The config is patched as a JSON dict (only the
expert-count keys and, with ``--group-policy flatten``, ``n_group`` and
``topk_group`` change); it is never re-serialised from a config object.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder.architectures import Architecture, GroupSpec
from moeproxy.proxy_builder.checkpoint import (
    INDEX_NAME,
    Checkpoint,
    OutputTensor,
    Shard,
    TensorInfo,
    dim0_rows,
    whole,
    write_safetensors,
)
from moeproxy.proxy_builder.errors import CheckpointError

# Files never copied from the source directory: weights in any format (they
# would disagree with the pruned safetensors) and an earlier build report.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
_NOT_COPIED = {"config.json", INDEX_NAME, "proxy_report.json"}


@dataclass(frozen=True)
class MoeLayout:
    """What the checkpoint holds for each MoE layer, found from its keys."""

    layers: tuple[int, ...]  # every layer index with a router on disk (MTP layers included)
    fused: bool
    hidden_size: int


def inspect_layout(checkpoint: Checkpoint, arch: Architecture, config: Mapping[str, Any]) -> MoeLayout:
    """Check the checkpoint's expert tensors against the config; raise ``CheckpointError`` on mismatch."""
    num_experts = arch.expert_count(config)
    pattern = arch.expert_key_pattern()
    tensors = checkpoint.tensor_map()
    per_expert: dict[int, set[int]] = {}
    fused_layers: dict[int, list[TensorInfo]] = {}
    for name, (_, t) in tensors.items():
        m = pattern.match(name)
        if not m:
            continue
        layer = int(m["layer"])
        if m["expert"] is not None:
            per_expert.setdefault(layer, set()).add(int(m["expert"]))
        else:
            fused_layers.setdefault(layer, []).append(t)
    expected = arch.moe_layers(config)
    router_layers = sorted(
        int(m["layer"])
        for name in tensors
        if (m := _router_pattern(arch).match(name))
    )
    missing = [i for i in expected if i not in router_layers]
    if missing:
        raise CheckpointError(
            f"config says layers {missing} are MoE but the checkpoint has no router "
            f"({arch.prefix(missing[0])}.{arch.router_weight}) for them"
        )
    unexpected = [i for i in router_layers if i not in expected and i < int(config["num_hidden_layers"])]
    if unexpected:
        raise CheckpointError(f"checkpoint has routers in layers {unexpected} that the config does not make MoE")
    hidden = None
    for layer in router_layers:
        _, router = tensors[f"{arch.prefix(layer)}.{arch.router_weight}"]
        if len(router.shape) != 2 or router.shape[0] != num_experts:
            raise CheckpointError(
                f"router of layer {layer} has shape {list(router.shape)}; the config says {num_experts} experts"
            )
        hidden = router.shape[1]
        if layer in per_expert and per_expert[layer] != set(range(num_experts)):
            raise CheckpointError(
                f"layer {layer} has expert ids {sorted(per_expert[layer])[:8]}...; expected 0..{num_experts - 1}"
            )
        for t in fused_layers.get(layer, []):
            if not t.shape or t.shape[0] != num_experts:
                raise CheckpointError(f"fused expert tensor {t.name} has dim 0 = {t.shape[:1]}, expected {num_experts}")
        if layer not in per_expert and layer not in fused_layers:
            raise CheckpointError(f"layer {layer} has a router but no expert tensors")
    return MoeLayout(tuple(router_layers), bool(fused_layers), int(hidden or 0))


def _router_pattern(arch: Architecture):
    import re

    prefix = re.escape(arch.disk_moe_prefix).replace(re.escape("{layer}"), r"(?P<layer>\d+)")
    return re.compile(prefix + r"\." + re.escape(arch.router_weight) + "$")


def extend_to_extra_layers(
    selections: Mapping[int, Sequence[int]], layout: MoeLayout
) -> tuple[dict[int, tuple[int, ...]], dict[int, int]]:
    """Selections for every layer with a router on disk.

    Layers the model does not run (DeepSeek's multi-token-prediction layers,
    indices ≥ num_hidden_layers) collect no statistics; they take the kept set of
    the last MoE layer so the whole checkpoint agrees with the patched expert
    count.  Returns (selections, {extra layer: layer it copied}).
    """
    out = {int(k): tuple(v) for k, v in selections.items()}
    copied: dict[int, int] = {}
    last = max(out) if out else None
    for layer in layout.layers:
        if layer not in out:
            if last is None:
                raise CheckpointError(f"no selection for MoE layer {layer}")
            out[layer] = out[last]
            copied[layer] = last
    return out, copied


def plan_shard(shard: Shard, arch: Architecture, selections: Mapping[int, Sequence[int]]) -> list[OutputTensor]:
    """The output tensors of one shard, in the shard's order."""
    pattern = arch.expert_key_pattern()
    sliced_vectors = {
        f"{arch.prefix(layer)}.{suffix}": layer for layer in selections for suffix in (arch.router_weight, *arch.router_vectors)
    }
    out: list[OutputTensor] = []
    for t in shard.tensors:
        m = pattern.match(t.name)
        if m and int(m["layer"]) in selections:
            kept = list(selections[int(m["layer"])])
            if m["expert"] is not None:
                e = int(m["expert"])
                if e in kept:
                    new = f"{arch.prefix(int(m['layer']))}.experts.{kept.index(e)}.{m['rest']}"
                    out.append(whole(shard, t, new))
            else:
                out.append(dim0_rows(shard, t, kept))
        elif t.name in sliced_vectors:
            out.append(dim0_rows(shard, t, selections[sliced_vectors[t.name]]))
        else:
            out.append(whole(shard, t))
    return out


def patch_config(
    config_text: str, arch: Architecture, keep: int, group: GroupSpec | None = None
) -> tuple[str, dict[str, Any]]:
    """The original config.json with only the expert count (and group keys if flattened) changed.

    Returns (new text, {key: (old, new)}).  Keys are written in their original
    order; every expert-count key present is patched (a Qwen3-MoE config may carry
    both ``num_experts`` and ``num_local_experts``).
    """
    config = json.loads(config_text)
    changes: dict[str, Any] = {}
    for key in arch.expert_count_keys:
        if key in config:
            changes[key] = [config[key], keep]
            config[key] = keep
    if not changes:
        raise CheckpointError(f"config.json has none of {', '.join(arch.expert_count_keys)}")
    if group is not None:
        for key, value in group.config_patch().items():
            changes[key] = [config.get(key), value]
            config[key] = value
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n", changes


@dataclass(frozen=True)
class SurgeryResult:
    files: tuple[str, ...]
    tensors_written: int
    bytes_written: int
    config_changes: dict[str, Any]
    extra_layers: dict[int, int]  # layers without statistics -> layer whose kept set they use
    time_s: float


def write_proxy_checkpoint(
    checkpoint: Checkpoint,
    out_dir: Path,
    arch: Architecture,
    selections: Mapping[int, Sequence[int]],
    keep: int,
    *,
    group: GroupSpec | None = None,
    progress: Callable[[int], None] | None = None,
) -> SurgeryResult:
    """Write the proxy checkpoint into ``out_dir`` (which must exist and be empty).

    ``selections``: MoE layer -> kept original expert ids in their new order.
    ``progress``: called with the bytes of each finished shard.
    """
    start = time.perf_counter()
    config_text = (checkpoint.directory / "config.json").read_text(encoding="utf-8")
    config = json.loads(config_text)
    layout = inspect_layout(checkpoint, arch, config)
    selections, extra = extend_to_extra_layers(selections, layout)
    for layer, kept in selections.items():
        if len(kept) != keep or len(set(kept)) != keep:
            raise CheckpointError(f"layer {layer}: selection {list(kept)} is not {keep} distinct experts")

    weight_map: dict[str, str] = {}
    total_bytes = 0
    total_params = 0
    n_tensors = 0
    for shard in checkpoint.shards:
        tensors = plan_shard(shard, arch, selections)
        total_bytes += write_safetensors(out_dir / shard.path.name, tensors, shard.metadata)
        for t in tensors:
            weight_map[t.name] = shard.path.name
            total_params += _numel(t.shape)
        n_tensors += len(tensors)
        if progress is not None:
            progress(shard.path.stat().st_size)
    files = [s.path.name for s in checkpoint.shards]
    if checkpoint.index is not None:
        index = dict(checkpoint.index)
        metadata = dict(index.get("metadata") or {})
        metadata["total_size"] = total_bytes
        if "total_parameters" in metadata:
            metadata["total_parameters"] = total_params
        index["metadata"] = metadata
        index["weight_map"] = dict(sorted(weight_map.items()))
        (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        files.append(INDEX_NAME)

    new_config, changes = patch_config(config_text, arch, keep, group)
    (out_dir / "config.json").write_text(new_config, encoding="utf-8")
    files.append("config.json")
    files.extend(copy_side_files(checkpoint.directory, out_dir))
    return SurgeryResult(tuple(files), n_tensors, total_bytes, changes, extra, time.perf_counter() - start)


def copy_side_files(src: Path, dst: Path) -> list[str]:
    """Tokenizer, generation config, chat template, custom code...: every top-level non-weight file."""
    copied = []
    for f in sorted(src.iterdir()):
        if not f.is_file() or f.name in _NOT_COPIED or f.name.endswith(_WEIGHT_SUFFIXES):
            continue
        shutil.copy2(f, dst / f.name)
        copied.append(f.name)
    return copied


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
