"""Build a proxy model end to end: validate → statistics → (weight search) → selection → surgery → report.

:func:`build_proxy` is the one programmatic entry point (the CLI ``moeproxy build``
is a thin wrapper).  :func:`validate_request` runs first and is cheap (config and
safetensors headers only): every impossible request fails there, before a model
is loaded or a statistic collected, and nothing is written.  The proxy is
written into a temporary sibling directory that is renamed into place only when
complete, so a failed build never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
import dataclasses
from dataclasses import dataclass, field
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
from moeproxy.proxy_builder.process_memory import peak_rss_mb
from moeproxy.proxy_builder.methods import (
    DEFAULT_METHOD,
    LayerSelection,
    Method,
    SelectionOptions,
    get_method,
    method_weights,
    parse_view_weights,
    select_experts,
)
from moeproxy.proxy_builder.surgery import MoeLayout, inspect_layout, write_proxy_checkpoint

REPORT_NAME = "proxy_report.json"
REPORT_VERSION = 1
DEVICES: tuple[str, ...] = ("cpu", "cuda", "npu")
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
        if kind in ("text", "jsonl") and not any((req.model_dir / f).is_file() for f in _TOKENIZER_FILES):
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


@dataclass
class BuildResult:
    out_dir: Path
    report: dict[str, Any]
    selections: dict[int, LayerSelection]
    statistics: dict[int, LayerStatistics] | None = field(repr=False, default=None)


class _Stages:
    """One progress bar per stage (tqdm on stderr), or silence."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.times: dict[str, float] = {}

    def bar(self, desc: str, total: int | None = None, unit: str = "it", **kw):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=not self.enabled, leave=True, dynamic_ncols=True, **kw)


def build_proxy(
    request: BuildRequest,
    *,
    statistics: Mapping[int, LayerStatistics] | None = None,
    progress: bool = False,
) -> BuildResult:
    """Build the proxy ``request`` describes and return its report.

    ``statistics`` (from :func:`collect_statistics_for` or an earlier build) skips
    calibration, and the request's ``calibration`` is not read; otherwise it is a spec
    string (``text:PATH``, ``jsonl:PATH``, ``tokenized:DIR``, ``random:SEED`` or a
    registered name) or an iterable of texts / token-id lists.  Raises a
    ``ProxyBuildError`` subclass for any impossible request, before any expensive work
    and without writing.
    """
    req = request if statistics is None else dataclasses.replace(request, calibration=None)
    t0 = time.perf_counter()
    stages = _Stages(progress)
    if statistics is not None and req.view_weights == "auto":
        raise InvalidPruneRequest("'auto' view weights need the model and calibration data, not precomputed statistics")
    v = validate_request(req) if statistics is None else _validate_with_statistics(req, statistics)
    stages.times["validate_s"] = time.perf_counter() - t0

    search = None
    calib_info: dict[str, Any] | None = None
    if v.needs_model:
        statistics, search, calib_info = _statistics_stage(v, stages)
    options = SelectionOptions(
        view_weights=search.best if search else (None if req.view_weights == "auto" else req.view_weights),
        representative=req.representative,
        seed=req.seed,
    )
    t = time.perf_counter()
    selections = select_experts(v.method, statistics, v.moe_layers, v.num_experts, v.keep, options, group=v.group)
    stages.times["selection_s"] = time.perf_counter() - t

    out = _surgery_stage(v, selections, stages, statistics, options, search, calib_info, t0)
    return BuildResult(out, json.loads((out / REPORT_NAME).read_text()), selections, dict(statistics or {}) or None)


def _validate_with_statistics(req: BuildRequest, statistics: Mapping[int, LayerStatistics]) -> ValidatedRequest:
    v = validate_request(req, have_statistics=True)
    missing = [layer for layer in v.moe_layers if layer not in statistics]
    if missing:
        raise InvalidPruneRequest(f"precomputed statistics lack MoE layers {missing}")
    bad = [layer for layer in v.moe_layers if statistics[layer].num_experts != v.num_experts]
    if bad:
        raise InvalidPruneRequest(f"precomputed statistics of layers {bad} do not have {v.num_experts} experts")
    return v


def load_model(model_dir: Path, device: str = "cpu", dtype: str = "auto", *, progress: bool = True):
    """The original model for statistics (eval mode), and its tokenizer (None without tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()

    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
    model = model.to(device).eval()
    tokenizer = None
    if any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


def calibration_batches(req: BuildRequest, tokenizer, vocab_size: int) -> list:
    tokenize = None
    pad_id = 0
    if tokenizer is not None:
        def tokenize(text: str) -> list[int]:
            return tokenizer(text, add_special_tokens=True)["input_ids"]

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        pad_id = int(pad) if pad is not None else 0
    return calib.make_batches(
        calib.documents(req.calibration),
        tokenize=tokenize,
        vocab_size=vocab_size,
        max_tokens=req.max_tokens,
        seq_len=req.seq_len,
        batch_size=req.batch_size,
        pad_id=pad_id,
    )


def _statistics_stage(v: ValidatedRequest, stages: _Stages):
    from moeproxy.proxy_builder.statistics import collect_statistics
    from moeproxy.proxy_builder.weight_search import search_view_weights

    req = v.request
    t = time.perf_counter()
    with stages.bar("load model", total=1) as bar:
        model, tokenizer = load_model(req.model_dir, req.device, req.dtype, progress=stages.enabled)
        bar.update(1)
    stages.times["load_s"] = time.perf_counter() - t

    t = time.perf_counter()
    batches = calibration_batches(req, tokenizer, int(v.config["vocab_size"]))
    heldout: list = []
    if req.view_weights == "auto":
        batches, heldout = calib.split_heldout(batches, req.heldout_fraction)
    tokens = sum(b.real_tokens for b in batches)
    with stages.bar("statistics", total=tokens, unit="tok") as bar:
        statistics = collect_statistics(
            model, batches, v.arch, v.moe_layers, weighted_prototypes=req.weighted_prototypes, progress=bar.update
        )
    stages.times["statistics_s"] = time.perf_counter() - t
    calib_info = {
        "source": req.calibration if isinstance(req.calibration, str) else "<python iterable>",
        "tokens": tokens,
        "sequences": sum(b.input_ids.shape[0] for b in batches),
        "heldout_tokens": sum(b.real_tokens for b in heldout),
        "max_tokens": req.max_tokens,
        "seq_len": req.seq_len,
        "tokens_per_s": tokens / max(stages.times["statistics_s"], 1e-9),
    }

    search = None
    if req.view_weights == "auto":
        t = time.perf_counter()
        options = SelectionOptions(representative=req.representative, seed=req.seed)
        from moeproxy.proxy_builder.methods import simplex_grid

        with stages.bar("view-weight search", total=len(simplex_grid(v.method.views))) as bar:
            search = search_view_weights(
                model, v.arch, v.method, statistics, v.moe_layers, v.num_experts, v.keep, heldout, options,
                group=v.group, progress=bar.update,
            )  # fmt: skip
        stages.times["weight_search_s"] = time.perf_counter() - t
    del model
    return statistics, search, calib_info


def _surgery_stage(v, selections, stages, statistics, options, search, calib_info, t0) -> Path:
    req = v.request
    req.out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{req.out_dir.name}.partial-", dir=req.out_dir.parent))
    try:
        t = time.perf_counter()
        total = sum(s.path.stat().st_size for s in v.checkpoint.shards)
        with stages.bar("surgery", total=total, unit="B", unit_scale=True) as bar:
            result = write_proxy_checkpoint(
                v.checkpoint, tmp, v.arch, {k: s.kept for k, s in selections.items()}, v.keep,
                group=v.group, progress=bar.update,
            )  # fmt: skip
        stages.times["surgery_s"] = time.perf_counter() - t
        stages.times["total_s"] = time.perf_counter() - t0
        report = build_report(v, selections, statistics, options, search, calib_info, result, stages.times, tmp)
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        _commit(tmp, req.out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return req.out_dir


def _commit(tmp: Path, out: Path) -> None:
    """Move the finished build into place (replacing an old one only now, with --overwrite)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def build_report(v, selections, statistics, options, search, calib_info, surgery, times, out_dir) -> dict[str, Any]:
    req = v.request
    layers: dict[str, Any] = {}
    for layer in sorted(selections):
        sel = selections[layer]
        stats = statistics.get(layer) if statistics else None
        layers[str(layer)] = {
            "kept_experts": list(sel.kept),
            "clusters": [list(c) for c in sel.clusters] if sel.clusters is not None else None,
            "medoids": list(sel.medoids) if sel.medoids is not None else None,
            "frequencies": stats.frequency.tolist() if stats is not None else None,
            "routing_mass_kept": stats.mass_kept(sel.kept) if stats is not None else None,
            "activations_kept": stats.activations_kept(sel.kept) if stats is not None else None,
        }
    for extra, source in surgery.extra_layers.items():
        layers[str(extra)] = {"kept_experts": list(selections[source].kept), "copied_from_layer": source}
    weights = None
    if v.method.views:
        weights = method_weights(v.method.views, options.view_weights)
        total = sum(weights.values())
        weights = {k: w / total for k, w in weights.items()}
    return {
        "format_version": REPORT_VERSION,
        "source_model": str(req.model_dir.resolve()),
        "architecture": v.arch.model_type,
        "method": v.method.name,
        "view_weights": weights,
        "view_weights_mode": "auto" if search else ("given" if req.view_weights else ("equal" if weights else None)),
        "view_weight_search": {"step": 0.25, "objective": "next-token KL(original || proxy)", "grid": search.grid}
        if search
        else None,
        "representative": req.representative if v.method.views else None,
        "seed": req.seed,
        "num_experts": v.num_experts,
        "keep": v.keep,
        "top_k": v.top_k,
        "moe_layers": list(v.moe_layers),
        "group_routing": _group_report(v.group),
        "config_changes": surgery.config_changes,
        "calibration": calib_info,
        "layers": layers,
        **plan_report(v.config, v.keep, v.checkpoint, surgery),
        "files": list(surgery.files) + [REPORT_NAME],
        "timing_s": {k.removesuffix("_s"): round(t, 4) for k, t in times.items()},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "device": req.device,
    }


def _group_report(group: GroupSpec | None) -> dict[str, Any] | None:
    if group is None:
        return None
    return {
        "policy": group.policy,
        "n_group": group.n_group,
        "topk_group": group.topk_group,
        "new_n_group": group.new_n_group,
        "new_topk_group": group.new_topk_group,
    }


def plan_report(config: Mapping[str, Any], keep: int, checkpoint: Checkpoint, surgery) -> dict[str, Any]:
    """Parameter counts and the accelerator-memory estimate, both from the planner (issue 9).

    The on-disk byte counts are facts of the two checkpoints, kept alongside.
    """
    from moeproxy.proxy_builder.plan import plan

    original_bytes = sum(t.nbytes for _, t in checkpoint.tensors())
    try:
        p = plan(dict(config), keep=keep)
    except ValueError as exc:  # the planner's assumptions do not fit this model: report, do not fail the build
        plan_dict, parameters, memory_ratio, devices = {"error": str(exc)}, None, None, None
    else:
        plan_dict = p.to_dict()
        o, q = p.original, p.proxy
        parameters = {
            "original": o.parameters.total,
            "proxy": q.parameters.total,
            "ratio": q.parameters.total / o.parameters.total,
            "by_component": {"original": plan_dict["original"]["parameters"], "proxy": plan_dict["proxy"]["parameters"]},
        }
        memory_ratio = q.memory_gb_total / o.memory_gb_total if o.memory_gb_total else None
        devices = {"original": o.devices, "proxy": q.devices}
    return {
        "parameters": parameters,
        "memory": {
            "accelerator_memory_ratio": memory_ratio,
            "devices": devices,
            "checkpoint_bytes": {"original": original_bytes, "proxy": surgery.bytes_written},
            "checkpoint_bytes_ratio": surgery.bytes_written / original_bytes if original_bytes else None,
            "plan": plan_dict,
        },
    }
