"""The build report (``proxy_report.json``): what was kept, why, and what the proxy costs.

Written by :func:`moeproxy.proxy_builder.build.build_proxy` next to the proxy checkpoint; the
parameter counts and the accelerator-memory estimate come from the planner (issue 9).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moeproxy.proxy_builder.architectures import GroupSpec
from moeproxy.proxy_builder.checkpoint import Checkpoint
from moeproxy.proxy_builder.methods import method_weights
from moeproxy.proxy_builder.process_memory import peak_rss_mb

REPORT_NAME = "proxy_report.json"
REPORT_VERSION = 1


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
