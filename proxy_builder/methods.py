"""Expert-selection methods, by name (SPEC section 2 and its baselines), and per-layer selection.

A method maps one layer's statistics and K to the kept experts (and, for the
clustering methods, the cluster each dropped expert was merged into).  The
clustering methods differ only in which distance views they fuse and whether
the K-Medoids objective is frequency-weighted:

=====================  ======================  ==========
name                   views                   objective
=====================  ======================  ==========
three_view (default)   router, coact, proto    weighted
three_view_unweighted  router, coact, proto    plain (the paper taken literally)
router_coact           router, coact           weighted
router_proto           router, proto           weighted
coact_proto            coact, proto            weighted
router / coact / proto one view                weighted
=====================  ======================  ==========

Baselines: ``frequency`` (the K most activated), ``random`` (seeded), ``first_k``.

With DeepSeek per-group retention a method runs inside each routing group with
K / n_group experts, so the kept set keeps the group structure.  Kept experts
are listed in ascending original id: that order is their new numbering, and it
keeps each group's experts contiguous as group routing requires.

Pure numpy (no torch).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from moeproxy.proxy_builder.architectures import GroupSpec
from moeproxy.proxy_builder.clustering import (
    REPRESENTATIVES,
    KMedoidsResult,
    select_representatives,
    unweighted_kmedoids,
    weighted_kmedoids,
)
from moeproxy.proxy_builder.distances import VIEW_ORDER, fuse_distances, view_distances
from moeproxy.proxy_builder.errors import InvalidPruneRequest
from moeproxy.proxy_builder.layer_stats import LayerStatistics

ViewWeights = Mapping[str, float]


@dataclass(frozen=True)
class LayerSelection:
    """The experts one layer keeps (original ids, ascending = new order) and how the rest were grouped."""

    kept: tuple[int, ...]
    # clusters[i]: original ids merged into kept[i] (None for the non-clustering baselines)
    clusters: tuple[tuple[int, ...], ...] | None = None
    medoids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SelectionOptions:
    view_weights: ViewWeights | None = None  # None: equal weights over the method's views
    representative: str = "most_frequent"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.representative not in REPRESENTATIVES:
            raise InvalidPruneRequest(
                f"unknown representative rule {self.representative!r}; choose one of {', '.join(REPRESENTATIVES)}"
            )


SelectFn = Callable[[LayerStatistics | None, int, int, SelectionOptions, Sequence[int]], LayerSelection]


@dataclass(frozen=True)
class Method:
    name: str
    select: SelectFn  # (stats or None, num_experts, k, options, rng key) -> selection in local ids
    needs_statistics: bool = True
    views: tuple[str, ...] = field(default=())
    description: str = ""


def method_weights(views: Sequence[str], weights: ViewWeights | None) -> dict[str, float]:
    """The fusion weights a method uses: ``weights`` restricted to its views (equal if None)."""
    if weights is None:
        return {v: 1.0 for v in views}
    unknown = set(weights) - set(VIEW_ORDER)
    if unknown:
        raise InvalidPruneRequest(f"unknown view(s) {', '.join(sorted(unknown))}; views: {', '.join(VIEW_ORDER)}")
    picked = {v: float(weights.get(v, 0.0)) for v in views}
    if any(w < 0 for w in picked.values()) or sum(picked.values()) <= 0:
        raise InvalidPruneRequest(
            f"view weights {dict(weights)} give the views {', '.join(views)} no positive weight"
        )
    return picked


def _clustering(views: tuple[str, ...], weighted: bool) -> SelectFn:
    def select(stats, num_experts, k, options, key) -> LayerSelection:
        dists = view_distances(stats, views)
        fused = fuse_distances(dists, method_weights(views, options.view_weights))
        if weighted:
            result: KMedoidsResult = weighted_kmedoids(fused, k, stats.frequency.astype(np.float64))
        else:
            result = unweighted_kmedoids(fused, k, seed=options.seed)
        reps = select_representatives(result, stats.frequency, options.representative)
        order = np.argsort(reps)
        clusters = result.clusters()
        return LayerSelection(
            kept=tuple(int(reps[i]) for i in order),
            clusters=tuple(tuple(clusters[i]) for i in order),
            medoids=tuple(int(result.medoids[i]) for i in order),
        )

    return select


def _frequency(stats, num_experts, k, options, key) -> LayerSelection:
    # Stable sort on -frequency: ties go to the lower id.
    top = np.argsort(-stats.frequency, kind="stable")[:k]
    return LayerSelection(kept=tuple(sorted(int(i) for i in top)))


def _random(stats, num_experts, k, options, key) -> LayerSelection:
    rng = np.random.default_rng([options.seed, *key])
    return LayerSelection(kept=tuple(sorted(int(i) for i in rng.choice(num_experts, size=k, replace=False))))


def _first_k(stats, num_experts, k, options, key) -> LayerSelection:
    return LayerSelection(kept=tuple(range(k)))


def _cluster_method(name: str, views: tuple[str, ...], weighted: bool = True) -> Method:
    kind = "frequency-weighted" if weighted else "unweighted"
    return Method(name, _clustering(views, weighted), views=views, description=f"{kind} K-Medoids on {'+'.join(views)}")


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        _cluster_method("three_view", ("router", "coact", "proto")),
        _cluster_method("three_view_unweighted", ("router", "coact", "proto"), weighted=False),
        _cluster_method("router_coact", ("router", "coact")),
        _cluster_method("router_proto", ("router", "proto")),
        _cluster_method("coact_proto", ("coact", "proto")),
        _cluster_method("router", ("router",)),
        _cluster_method("coact", ("coact",)),
        _cluster_method("proto", ("proto",)),
        Method("frequency", _frequency, description="the K most activated experts"),
        Method("random", _random, needs_statistics=False, description="K experts drawn with the seed"),
        Method("first_k", _first_k, needs_statistics=False, description="experts 0..K-1"),
    )
}
DEFAULT_METHOD = "three_view"


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise InvalidPruneRequest(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None


def select_layer(
    method: Method,
    stats: LayerStatistics | None,
    num_experts: int,
    keep: int,
    options: SelectionOptions,
    *,
    layer: int,
    group: GroupSpec | None = None,
) -> LayerSelection:
    """Select ``keep`` experts of one layer, inside each routing group under per-group retention."""
    if method.needs_statistics and stats is None:
        raise InvalidPruneRequest(f"method {method.name!r} needs calibration statistics")
    if group is None or group.policy != "per_group" or group.n_group == 1:
        return method.select(stats, num_experts, keep, options, (layer,))
    per_group = keep // group.n_group
    kept: list[int] = []
    clusters: list[tuple[int, ...]] = []
    medoids: list[int] = []
    for g, ids in enumerate(group.groups):
        sub = stats.subset(ids) if stats is not None else None
        local = method.select(sub, len(ids), per_group, options, (layer, g))
        kept.extend(ids[i] for i in local.kept)
        if local.clusters is not None:
            clusters.extend(tuple(ids[i] for i in c) for c in local.clusters)
            medoids.extend(ids[i] for i in local.medoids or ())
    return LayerSelection(
        kept=tuple(kept),
        clusters=tuple(clusters) if clusters else None,
        medoids=tuple(medoids) if medoids else None,
    )


def select_experts(
    method: Method | str,
    statistics: Mapping[int, LayerStatistics] | None,
    layers: Sequence[int],
    num_experts: int,
    keep: int,
    options: SelectionOptions | None = None,
    *,
    group: GroupSpec | None = None,
) -> dict[int, LayerSelection]:
    """Selections for every MoE layer; ``statistics`` may be None for methods that need none."""
    method = get_method(method) if isinstance(method, str) else method
    options = options or SelectionOptions()
    return {
        layer: select_layer(
            method,
            None if statistics is None else statistics[layer],
            num_experts,
            keep,
            options,
            layer=layer,
            group=group,
        )
        for layer in layers
    }


def parse_view_weights(text: str | None) -> dict[str, float] | str | None:
    """``"a,b,c"`` → {router: a, coact: b, proto: c}; ``"auto"`` stays ``"auto"``; None stays None."""
    if text is None or text == "auto":
        return text
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != len(VIEW_ORDER):
        raise InvalidPruneRequest(
            f"--view-weights takes {len(VIEW_ORDER)} numbers ({','.join(VIEW_ORDER)}) or 'auto', got {text!r}"
        )
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise InvalidPruneRequest(f"--view-weights must be numbers, got {text!r}") from None
    if any(v < 0 or not np.isfinite(v) for v in values) or sum(values) <= 0:
        raise InvalidPruneRequest(f"--view-weights must be finite, non-negative and not all zero, got {text!r}")
    return dict(zip(VIEW_ORDER, values, strict=True))


def simplex_grid(views: Sequence[str], step: float = 0.25) -> list[dict[str, float]]:
    """Every weight vector on the simplex over ``views`` with the given step, plus equal weights."""
    n = round(1 / step)
    if abs(n * step - 1) > 1e-9:
        raise ValueError("step must divide 1")
    points = []
    for combo in itertools.product(range(n + 1), repeat=len(views)):
        if sum(combo) == n:
            points.append({v: c / n for v, c in zip(views, combo, strict=True)})
    equal = {v: 1 / len(views) for v in views}
    if all(any(abs(p[v] - equal[v]) > 1e-9 for v in views) for p in points):
        points.append(equal)
    return points
