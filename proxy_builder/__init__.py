"""Proxy construction (SPEC section 2): routing statistics, the three distance
views and their fusion, frequency-weighted K-Medoids, representative selection,
checkpoint surgery, and the resource planner.

Installed as ``moeproxy.proxy_builder``.  The first stage: it imports no other
stage.  torch/transformers are imported only by the modules that need them
(:mod:`.statistics`, :mod:`.weight_search` and the model loading in
:mod:`.build`); the planner, distances, clustering, methods, calibration,
surgery, request validation (:mod:`.validation`) and the report (:mod:`.report`)
are torch-free.

Programmatic entry points (imported lazily from this package)::

    build_proxy(model_dir, out_dir, *, keep=None, keep_ratio=None, method="three_view",
                calibration=None, max_tokens=16384, ..., statistics=None) -> BuildResult
    collect_statistics(model, batches, arch, layers) -> dict[int, LayerStatistics]
    select_experts(method, statistics, layers, num_experts, keep, options) -> dict[int, LayerSelection]
    write_proxy_checkpoint(checkpoint, out_dir, arch, selections, keep) -> SurgeryResult
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "build_proxy": "moeproxy.proxy_builder.build",
    "BuildResult": "moeproxy.proxy_builder.build",
    "validate_request": "moeproxy.proxy_builder.validation",
    "BuildRequest": "moeproxy.proxy_builder.validation",
    "collect_statistics": "moeproxy.proxy_builder.statistics",
    "LayerStatistics": "moeproxy.proxy_builder.layer_stats",
    "select_experts": "moeproxy.proxy_builder.methods",
    "METHODS": "moeproxy.proxy_builder.methods",
    "write_proxy_checkpoint": "moeproxy.proxy_builder.surgery",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moeproxy.proxy_builder' has no attribute {name!r}")
