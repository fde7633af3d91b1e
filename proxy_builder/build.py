"""Build a proxy model end to end: validate → statistics → (weight search) → selection → surgery → report.

:func:`build_proxy` is the one programmatic entry point (the CLI ``moeproxy build``
is a thin wrapper).  This module holds the orchestration; the checks live in
:mod:`.validation` and the report in :mod:`.report`.  :func:`validate_request` runs
first and is cheap (config and safetensors headers only): every impossible request
fails there, before a model is loaded or a statistic collected, and nothing is
written.  The proxy is written into a temporary sibling directory that is renamed
into place only when complete, so a failed build never leaves a half-written
checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder import calibration as calib
from moeproxy.proxy_builder.layer_stats import LayerStatistics
from moeproxy.proxy_builder.methods import LayerSelection, SelectionOptions, select_experts
from moeproxy.proxy_builder.report import REPORT_NAME, build_report
from moeproxy.proxy_builder.surgery import write_proxy_checkpoint
from moeproxy.proxy_builder.validation import (
    TOKENIZER_FILES,
    BuildRequest,
    ValidatedRequest,
    validate_request,
    validate_with_statistics,
)

# Importable from here, where callers have always found it (tests/proxy_builder/test_plan.py checks
# the builder's K against the planner's through it).
from moeproxy.proxy_builder.validation import _resolve_keep  # noqa: F401


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
    v = validate_request(req) if statistics is None else validate_with_statistics(req, statistics)
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
    if any((model_dir / f).is_file() for f in TOKENIZER_FILES):
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
