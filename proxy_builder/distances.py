"""The three distance views between the experts of one layer, and their fusion (SPEC section 2).

Pure numpy (no torch).  Every view returns a symmetric E x E matrix with a zero
diagonal; :func:`normalise` maps the off-diagonal entries to [0, 1] before
:func:`fuse_distances` combines them, so no view dominates by scale.

- router view: cosine distance between router rows w_i, w_j;
- co-activation view: 1 - C_ij / sqrt(f_i f_j), with C the co-activation counts
  and f_i = C_ii the activation counts (an expert never activated is at
  distance 1 from every other);
- prototype view: cosine distance between the mean router inputs of the tokens
  routed to each expert (a never-routed expert's prototype is zero: distance 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from moeproxy.proxy_builder.layer_stats import LayerStatistics


def _cosine_distance(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(v, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    unit = v / safe[:, None]
    sim = np.clip(unit @ unit.T, -1.0, 1.0)
    zero = norms == 0
    sim[zero, :] = 0.0
    sim[:, zero] = 0.0
    d = 1.0 - sim
    np.fill_diagonal(d, 0.0)
    return (d + d.T) / 2  # exact symmetry despite rounding


def router_distance(router_weight: np.ndarray) -> np.ndarray:
    """Cosine distance between router rows (router weight is E x H)."""
    return _cosine_distance(router_weight)


def coactivation_distance(coactivation: np.ndarray) -> np.ndarray:
    """1 - C_ij / sqrt(f_i f_j), the frequency-normalised co-activation similarity turned into a distance."""
    c = np.asarray(coactivation, dtype=np.float64)
    f = np.diag(c).copy()
    denom = np.sqrt(np.outer(f, f))
    sim = np.divide(c, denom, out=np.zeros_like(c), where=denom > 0)
    d = 1.0 - np.clip(sim, 0.0, 1.0)
    np.fill_diagonal(d, 0.0)
    return (d + d.T) / 2


def prototype_distance(prototypes: np.ndarray) -> np.ndarray:
    """Cosine distance between routed-context prototypes (E x H)."""
    return _cosine_distance(prototypes)


def normalise(distance: np.ndarray) -> np.ndarray:
    """Min-max scale the off-diagonal entries to [0, 1]; a constant view becomes all zeros.

    A view with no spread carries no information; zeros (rather than ones) keep
    it from adding a medoid-dependent constant to the weighted objective.
    """
    d = np.asarray(distance, dtype=np.float64)
    e = d.shape[0]
    if e < 2:
        return np.zeros_like(d)
    off = ~np.eye(e, dtype=bool)
    lo, hi = d[off].min(), d[off].max()
    out = np.zeros_like(d)
    if hi - lo > 1e-12:
        out[off] = (d[off] - lo) / (hi - lo)
    return out


ViewFn = Callable[[LayerStatistics], np.ndarray]

#: Registry of distance views by name (method names and --view-weights follow this order).
VIEWS: dict[str, ViewFn] = {
    "router": lambda s: router_distance(s.router_weight),
    "coact": lambda s: coactivation_distance(s.coactivation),
    "proto": lambda s: prototype_distance(s.prototypes),
}
VIEW_ORDER: tuple[str, ...] = tuple(VIEWS)


def view_distances(stats: LayerStatistics, views: tuple[str, ...] = VIEW_ORDER) -> dict[str, np.ndarray]:
    """Each requested view, normalised to [0, 1]."""
    return {name: normalise(VIEWS[name](stats)) for name in views}


def fuse_distances(distances: Mapping[str, np.ndarray], weights: Mapping[str, float]) -> np.ndarray:
    """D = Σ_v w_v d_v over the views in ``weights`` (weights rescaled to sum to 1, so D stays in [0, 1])."""
    total = float(sum(weights.values()))
    if total <= 0 or any(w < 0 for w in weights.values()):
        raise ValueError(f"view weights must be non-negative and not all zero, got {dict(weights)}")
    names = [n for n, w in weights.items() if w > 0]
    fused = sum(weights[n] / total * np.asarray(distances[n], dtype=np.float64) for n in names)
    return np.asarray(fused)
