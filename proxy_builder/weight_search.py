"""``--view-weights auto``: choose the fusion weights by next-token KL on held-out data (needs torch).

For every point of a simplex grid over the method's views (steps of 0.25, plus
equal weights), the experts are selected, an in-memory proxy is made by slicing
the loaded model's stacked expert tensors and router rows, and
KL(original ‖ proxy) of the next-token distributions is measured on held-out
calibration batches (never used for the statistics).  Grid points that select the
same experts share one evaluation.  The lowest KL wins; ties go to the earlier
grid point.  The whole grid with its KLs goes into the build report.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from moeproxy.proxy_builder.architectures import Architecture, GroupSpec
from moeproxy.proxy_builder.layer_stats import Batch, LayerStatistics
from moeproxy.proxy_builder.methods import Method, SelectionOptions, select_experts, simplex_grid
from moeproxy.proxy_builder.statistics import next_token_kl


def in_memory_proxy(
    model: torch.nn.Module,
    arch: Architecture,
    selections: Mapping[int, Sequence[int]],
    keep: int,
    group: GroupSpec | None = None,
) -> torch.nn.Module:
    """The proxy as a live model, built from the loaded original (same dtype and device)."""
    config = copy.deepcopy(model.config)
    for key in arch.expert_count_keys:
        if hasattr(config, key):
            setattr(config, key, keep)
    if group is not None:
        for key, value in group.config_patch().items():
            setattr(config, key, value)
    prefix = re.escape(arch.runtime_moe_prefix).replace(re.escape("{layer}"), r"(?P<layer>\d+)")
    sliced = re.compile(prefix + r"\.(?:experts\.[^.]+|gate\.weight|gate\.bias|gate\.e_score_correction_bias)$")
    state = {}
    for name, tensor in model.state_dict().items():
        m = sliced.match(name)
        if m and int(m["layer"]) in selections:
            idx = torch.as_tensor(list(selections[int(m["layer"])]), device=tensor.device)
            tensor = tensor.index_select(0, idx)
        state[name] = tensor
    param = next(model.parameters())
    with torch.device(param.device):
        proxy = type(model)(config).to(param.dtype)
    proxy.load_state_dict(state, strict=True)
    return proxy.eval()


@dataclass(frozen=True)
class WeightSearchResult:
    best: dict[str, float]
    grid: list[dict]  # [{"weights": {...}, "kl": float}]


def search_view_weights(
    model: torch.nn.Module,
    arch: Architecture,
    method: Method,
    statistics: Mapping[int, LayerStatistics],
    layers: Sequence[int],
    num_experts: int,
    keep: int,
    heldout: Sequence[Batch],
    options: SelectionOptions,
    *,
    group: GroupSpec | None = None,
    step: float = 0.25,
    progress: Callable[[int], None] | None = None,
) -> WeightSearchResult:
    grid = simplex_grid(method.views, step)
    cache: dict[tuple, float] = {}
    rows = []
    for weights in grid:
        opts = SelectionOptions(view_weights=weights, representative=options.representative, seed=options.seed)
        sel = select_experts(method, statistics, layers, num_experts, keep, opts, group=group)
        signature = tuple((layer, sel[layer].kept) for layer in layers)
        if signature not in cache:
            proxy = in_memory_proxy(model, arch, {k: v.kept for k, v in sel.items()}, keep, group)
            cache[signature] = next_token_kl(model, proxy, heldout)
            del proxy
        rows.append({"weights": weights, "kl": cache[signature]})
        if progress is not None:
            progress(1)
    best = min(range(len(rows)), key=lambda i: (rows[i]["kl"], i))
    return WeightSearchResult(best=dict(rows[best]["weights"]), grid=rows)
