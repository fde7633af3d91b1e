"""Build requests and their validation: every check a build makes before any expensive work.

:class:`BuildRequest` checks the values that need no files when it is built; :func:`validate_request`
reads the config and the safetensors headers only (no model in memory), so every impossible request
fails there, with a message that says what would work, and nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder import calibration as calib
from moeproxy.proxy_builder.architectures import (
    GROUP_POLICIES,
    keep_for_ratio,
    Architecture,
    GroupSpec,
    architecture_for,
    group_spec,
)
from moeproxy.proxy_builder.checkpoint import Checkpoint, open_checkpoint
from moeproxy.proxy_builder.errors import CalibrationError, InvalidPruneRequest
from moeproxy.proxy_builder.layer_stats import LayerStatistics
from moeproxy.proxy_builder.methods import (
    DEFAULT_METHOD,
    Method,
    SelectionOptions,
    get_method,
    method_weights,
    parse_view_weights,
)
from moeproxy.proxy_builder.surgery import MoeLayout, inspect_layout

DEVICES: tuple[str, ...] = ("cpu", "cuda", "npu")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class BuildRequest:
    """Everything a build needs; construction checks the values that need no files."""

    model_dir: Path
    out_dir: Path
    keep: int | None = None
    keep_ratio: float | None = None
    method: str = DEFAULT_METHOD
    calibration: str | Iterable | None = None  # spec string (see calibration.py) or documents
    max_tokens: int = 16384
    seq_len: int = 512
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "auto"
    view_weights: Mapping[str, float] | str | None = None  # None = equal, "auto" = KL grid search
    representative: str = "most_frequent"
    group_policy: str = "per_group"
    weighted_prototypes: bool = True
    heldout_fraction: float = 0.2
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_dir", Path(self.model_dir).expanduser())
        object.__setattr__(self, "out_dir", Path(self.out_dir).expanduser())
        if (self.keep is None) == (self.keep_ratio is None):
            raise InvalidPruneRequest("give exactly one of keep (experts per layer) and keep_ratio")
        if self.keep is not None and (not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 1):
            raise InvalidPruneRequest(f"keep must be a positive integer, got {self.keep!r}")
        if self.keep_ratio is not None and not 0 < self.keep_ratio <= 1:
            raise InvalidPruneRequest(f"keep_ratio must be in (0, 1], got {self.keep_ratio}")
        if self.device not in DEVICES:
            raise InvalidPruneRequest(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise InvalidPruneRequest(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.group_policy not in GROUP_POLICIES:
            raise InvalidPruneRequest(
                f"unknown group policy {self.group_policy!r}; choose one of {', '.join(GROUP_POLICIES)}"
            )
        for name in ("max_tokens", "seq_len", "batch_size"):
            if getattr(self, name) < 1:
                raise InvalidPruneRequest(f"{name} must be at least 1")
        if not 0 < self.heldout_fraction < 1:
            raise InvalidPruneRequest("heldout_fraction must be in (0, 1)")
        if isinstance(self.view_weights, str) and self.view_weights != "auto":
            object.__setattr__(self, "view_weights", parse_view_weights(self.view_weights))
        SelectionOptions(representative=self.representative)  # validates the rule name


@dataclass(frozen=True)
class ValidatedRequest:
    request: BuildRequest
    config: dict[str, Any]
    arch: Architecture
    method: Method
    checkpoint: Checkpoint
    layout: MoeLayout
    num_experts: int
    top_k: int
    keep: int
    moe_layers: tuple[int, ...]
    group: GroupSpec | None
    needs_model: bool


def _resolve_keep(req: BuildRequest, arch: Architecture, config: Mapping[str, Any], num_experts: int) -> int:
    if req.keep is not None:
        return req.keep
    return keep_for_ratio(arch, config, req.keep_ratio, req.group_policy)


def validate_request(req: BuildRequest, *, have_statistics: bool = False) -> ValidatedRequest:
    """Every check that needs no model in memory; raises a ``ProxyBuildError`` saying what would work."""
    method = get_method(req.method)
    checkpoint = open_checkpoint(req.model_dir)
    config = json.loads((req.model_dir / "config.json").read_text(encoding="utf-8"))
    arch = architecture_for(config)
    num_experts, top_k = arch.expert_count(config), arch.top_k(config)
    keep = _resolve_keep(req, arch, config, num_experts)
    if keep > num_experts:
        raise InvalidPruneRequest(f"cannot keep {keep} experts: the model has only {num_experts} per MoE layer")
    if keep < top_k:
        raise InvalidPruneRequest(
            f"cannot keep {keep} experts: top-k routing selects {top_k} per token ({arch.top_k_key}); keep at least {top_k}"
        )
    group = group_spec(arch, config, keep, req.group_policy)
    layout = inspect_layout(checkpoint, arch, config)
    _validate_view_weights(req, method)
    needs_model = (
        (method.needs_statistics and not have_statistics) or req.view_weights == "auto" or req.calibration is not None
    )
    if needs_model:
        _validate_calibration(req, method)
        _validate_device(req.device)
    _validate_out_dir(req)
    return ValidatedRequest(
        req, config, arch, method, checkpoint, layout, num_experts, top_k, keep,
        tuple(arch.moe_layers(config)), group, needs_model,
    )  # fmt: skip


def _validate_view_weights(req: BuildRequest, method: Method) -> None:
    if req.view_weights is None:
        return
    if not method.views:
        raise InvalidPruneRequest(f"view weights apply to the clustering methods; {method.name!r} uses no views")
    if req.view_weights == "auto":
        if len(method.views) < 2:
            raise InvalidPruneRequest(f"'auto' view weights need a method with at least 2 views; {method.name!r} has one")
        return
    method_weights(method.views, req.view_weights)


def _validate_calibration(req: BuildRequest, method: Method) -> None:
    if req.calibration is None:
        raise CalibrationError(
            f"method {method.name!r} needs calibration data: pass --calibration (a .txt/.jsonl file, a tokenized "
            f"directory, or one of: {', '.join(sorted(calib.CALIBRATION_SOURCES))}:ARG)"
        )
    if isinstance(req.calibration, str):
        calib.validate_spec(req.calibration)
        kind, _ = calib.parse_spec(req.calibration)
        if kind in ("text", "jsonl") and not any((req.model_dir / f).is_file() for f in TOKENIZER_FILES):
            raise CalibrationError(f"{req.model_dir} has no tokenizer files, so text calibration cannot be tokenized")


def _validate_device(device: str) -> None:
    if device == "cpu":
        return
    import torch

    if device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            raise InvalidPruneRequest("device 'npu' needs torch_npu (pip install 'moeproxy[npu]')") from None
    available = getattr(torch, device).is_available()
    if not available:
        raise InvalidPruneRequest(f"device {device!r} is not available on this machine")


def _validate_out_dir(req: BuildRequest) -> None:
    out, src = req.out_dir.resolve(), req.model_dir.resolve()
    if out == src or src in out.parents:
        raise InvalidPruneRequest(f"output directory {req.out_dir} must not be the model directory or inside it")
    if out.exists():
        if not out.is_dir():
            raise InvalidPruneRequest(f"output path {req.out_dir} exists and is not a directory")
        if any(out.iterdir()) and not req.overwrite:
            raise InvalidPruneRequest(f"output directory {req.out_dir} is not empty (pass --overwrite to replace it)")


def validate_with_statistics(req: BuildRequest, statistics: Mapping[int, LayerStatistics]) -> ValidatedRequest:
    """:func:`validate_request` for a build from precomputed statistics, which must cover every
    MoE layer with the model's expert count."""
    if req.view_weights == "auto":
        raise InvalidPruneRequest("'auto' view weights need the model and calibration data, not precomputed statistics")
    v = validate_request(req, have_statistics=True)
    missing = [layer for layer in v.moe_layers if layer not in statistics]
    if missing:
        raise InvalidPruneRequest(f"precomputed statistics lack MoE layers {missing}")
    bad = [layer for layer in v.moe_layers if statistics[layer].num_experts != v.num_experts]
    if bad:
        raise InvalidPruneRequest(f"precomputed statistics of layers {bad} do not have {v.num_experts} experts")
    return v
