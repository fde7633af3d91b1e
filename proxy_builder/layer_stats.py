"""Routing statistics of one MoE layer, as plain numpy arrays (no torch).

Produced by :mod:`moeproxy.proxy_builder.statistics` (which needs torch) and
consumed by the torch-free distance views, clustering and selection methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LayerStatistics:
    """Calibration statistics of one MoE layer with E routed experts and hidden size H.

    ``frequency[i]``: tokens whose top-k set contains expert i.
    ``coactivation[i, j]``: tokens whose top-k set contains both i and j
    (the diagonal equals ``frequency``).
    ``prototype_sum[i]``: sum of router inputs of the tokens routed to i, each
    weighted by its routing weight if the collector was asked to;
    ``prototype_weight[i]`` is the matching denominator.
    ``routing_mass[i]``: sum of the routing weights given to i.
    ``router_weight``: the router matrix (E x H) as float32.
    """

    layer: int
    tokens: int
    frequency: np.ndarray  # [E] int64
    coactivation: np.ndarray  # [E, E] int64
    prototype_sum: np.ndarray  # [E, H] float64
    prototype_weight: np.ndarray  # [E] float64
    routing_mass: np.ndarray  # [E] float64
    router_weight: np.ndarray  # [E, H] float32

    def __post_init__(self) -> None:
        e = self.frequency.shape[0]
        if self.coactivation.shape != (e, e) or self.prototype_sum.shape[0] != e or self.router_weight.shape[0] != e:
            raise ValueError(f"layer {self.layer}: statistics arrays disagree on the number of experts ({e})")

    @property
    def num_experts(self) -> int:
        return int(self.frequency.shape[0])

    @property
    def prototypes(self) -> np.ndarray:
        """Mean (optionally routing-weighted) router input per expert; zero for experts never routed to."""
        denom = np.where(self.prototype_weight > 0, self.prototype_weight, 1.0)
        return self.prototype_sum / denom[:, None]

    def subset(self, experts: Sequence[int]) -> LayerStatistics:
        """Statistics restricted to ``experts`` (renumbered 0..len-1 in the given order)."""
        ids = np.asarray(experts, dtype=np.int64)
        return LayerStatistics(
            layer=self.layer,
            tokens=self.tokens,
            frequency=self.frequency[ids],
            coactivation=self.coactivation[np.ix_(ids, ids)],
            prototype_sum=self.prototype_sum[ids],
            prototype_weight=self.prototype_weight[ids],
            routing_mass=self.routing_mass[ids],
            router_weight=self.router_weight[ids],
        )

    def mass_kept(self, kept: Sequence[int]) -> float:
        total = float(self.routing_mass.sum())
        return float(self.routing_mass[list(kept)].sum() / total) if total > 0 else 0.0

    def activations_kept(self, kept: Sequence[int]) -> float:
        total = int(self.frequency.sum())
        return float(self.frequency[list(kept)].sum() / total) if total > 0 else 0.0


@dataclass(frozen=True)
class Batch:
    """One right-padded calibration batch."""

    input_ids: np.ndarray  # [B, S] int64
    attention_mask: np.ndarray  # [B, S] int64, 1 = real token

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())


_FIELDS = ("frequency", "coactivation", "prototype_sum", "prototype_weight", "routing_mass", "router_weight")


def save_statistics(stats: Mapping[int, LayerStatistics], path: Path | str) -> None:
    """One ``.npz`` with every layer (``L<idx>.<field>``), so selection can be rerun without the model."""
    arrays: dict[str, np.ndarray] = {}
    for layer, s in stats.items():
        arrays[f"L{layer}.tokens"] = np.asarray(s.tokens)
        for f in _FIELDS:
            arrays[f"L{layer}.{f}"] = getattr(s, f)
    np.savez_compressed(path, **arrays)


def load_statistics(path: Path | str) -> dict[int, LayerStatistics]:
    with np.load(path) as data:
        layers = sorted({int(k.split(".")[0][1:]) for k in data.files})
        return {
            layer: LayerStatistics(
                layer=layer,
                tokens=int(data[f"L{layer}.tokens"]),
                **{f: data[f"L{layer}.{f}"] for f in _FIELDS},
            )
            for layer in layers
        }
