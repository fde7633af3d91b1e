"""K-Medoids on a precomputed distance matrix, and the representative of each cluster (numpy only).

The default objective is frequency-weighted, Σ_i f_i · D(i, medoid(i)) (issue 4:
the unweighted objective gives rarely used outlier experts clusters of their own,
and the most-frequent-expert rule then keeps those outliers).  The weighted
solver is PAM: a greedy weighted BUILD followed by steepest-descent SWAP, fully
vectorised (each SWAP round costs O(K·E²)) and deterministic (ties go to the
lowest index).  The unweighted variant is FasterPAM from the ``kmedoids``
package with a fixed seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class KMedoidsResult:
    medoids: tuple[int, ...]  # sorted
    labels: np.ndarray  # [E] index into medoids
    cost: float  # Σ_i w_i D(i, medoid(i)) with the weights used
    iterations: int

    def clusters(self) -> list[list[int]]:
        return [sorted(int(i) for i in np.flatnonzero(self.labels == c)) for c in range(len(self.medoids))]


def _check(distance: np.ndarray, k: int) -> np.ndarray:
    d = np.asarray(distance, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distance matrix must be square, got shape {d.shape}")
    if not 1 <= k <= d.shape[0]:
        raise ValueError(f"k must be in 1..{d.shape[0]}, got {k}")
    return d


def weighted_cost(distance: np.ndarray, weights: np.ndarray, medoids: Sequence[int]) -> float:
    d = np.asarray(distance, dtype=np.float64)
    return float((np.asarray(weights, dtype=np.float64) * d[:, list(medoids)].min(axis=1)).sum())


def _assign(d: np.ndarray, medoids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    sub = d[:, list(medoids)]
    labels = sub.argmin(axis=1)
    # A medoid always belongs to its own cluster, even when another medoid is at distance 0.
    for c, m in enumerate(medoids):
        labels[m] = c
    return labels, sub[np.arange(d.shape[0]), labels]


def weighted_kmedoids(
    distance: np.ndarray, k: int, weights: np.ndarray | None = None, *, max_iter: int = 200
) -> KMedoidsResult:
    """Minimise Σ_i w_i D(i, m(i)) over medoid sets of size ``k`` (weighted BUILD + SWAP).

    ``weights=None`` means unit weights.  If every weight is zero (no calibration
    token reached the layer) unit weights are used, so the result is still defined.
    """
    d = _check(distance, k)
    e = d.shape[0]
    w = np.ones(e) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (e,) or (w < 0).any():
        raise ValueError("weights must be a non-negative vector with one entry per expert")
    if w.sum() <= 0:
        w = np.ones(e)

    # BUILD: first medoid minimises the weighted total distance, then add the
    # point with the largest weighted gain.
    medoids = [int(np.argmin(w @ d))]
    nearest = d[:, medoids[0]].copy()
    while len(medoids) < k:
        gain = (w[:, None] * np.maximum(nearest[:, None] - d, 0.0)).sum(axis=0)
        gain[medoids] = -np.inf
        best = int(np.argmax(gain))
        medoids.append(best)
        nearest = np.minimum(nearest, d[:, best])

    # SWAP: take the best (medoid out, non-medoid in) exchange while it lowers the cost.
    iterations = 0
    current = weighted_cost(d, w, medoids)
    for iterations in range(1, max_iter + 1):
        sub = d[:, medoids]  # [E, K]
        order = np.argsort(sub, axis=1, kind="stable")
        d1 = sub[np.arange(e), order[:, 0]]
        d2 = sub[np.arange(e), order[:, 1]] if k > 1 else np.full(e, np.inf)
        near = order[:, 0]
        best_cost, best_swap = current, None
        for slot in range(k):
            # Distance of every point to the remaining medoids once `slot` is removed.
            without = np.where(near == slot, d2, d1)  # [E]
            cost = (w[:, None] * np.minimum(without[:, None], d)).sum(axis=0)  # [E] candidates
            cost[medoids] = np.inf
            h = int(np.argmin(cost))
            if cost[h] < best_cost - 1e-12 * max(1.0, abs(best_cost)):
                best_cost, best_swap = float(cost[h]), (slot, h)
        if best_swap is None:
            break
        medoids[best_swap[0]] = best_swap[1]
        current = best_cost
    medoids = sorted(medoids)
    labels, _ = _assign(d, medoids)
    return KMedoidsResult(tuple(medoids), labels, weighted_cost(d, w, medoids), iterations)


def unweighted_kmedoids(distance: np.ndarray, k: int, *, seed: int = 0, max_iter: int = 200) -> KMedoidsResult:
    """The paper's plain objective Σ_i D(i, m(i)), solved by FasterPAM (``kmedoids`` package)."""
    import kmedoids

    d = _check(distance, k)
    if k == d.shape[0]:
        medoids = list(range(k))
        iterations = 0
    else:
        res = kmedoids.fasterpam(d, k, max_iter=max_iter, init="build", random_state=seed, n_cpu=1)
        medoids = sorted(int(m) for m in res.medoids)
        iterations = int(res.n_iter)
    labels, _ = _assign(d, medoids)
    return KMedoidsResult(tuple(medoids), labels, weighted_cost(d, np.ones(d.shape[0]), medoids), iterations)


def _most_frequent(cluster: Sequence[int], medoid: int, frequency: np.ndarray) -> int:
    # Ties: the medoid if it is among the most frequent, else the lowest id.
    f = np.asarray(frequency)
    top = f[list(cluster)].max()
    tied = [i for i in cluster if f[i] == top]
    return medoid if medoid in tied else min(tied)


def _medoid(cluster: Sequence[int], medoid: int, frequency: np.ndarray) -> int:
    return medoid


#: How to pick the kept expert of a cluster: the paper keeps the most activated one.
REPRESENTATIVES: dict[str, Callable[[Sequence[int], int, np.ndarray], int]] = {
    "most_frequent": _most_frequent,
    "medoid": _medoid,
}


def select_representatives(result: KMedoidsResult, frequency: np.ndarray, rule: str = "most_frequent") -> list[int]:
    """One expert per cluster (cluster order follows the sorted medoids)."""
    try:
        pick = REPRESENTATIVES[rule]
    except KeyError:
        raise ValueError(f"unknown representative rule {rule!r}; known: {', '.join(REPRESENTATIVES)}") from None
    return [pick(cluster, m, frequency) for cluster, m in zip(result.clusters(), result.medoids, strict=True)]
