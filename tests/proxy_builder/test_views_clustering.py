"""Distance views, fusion, weighted K-Medoids (against exact enumeration) and the selection methods.

Torch-free: these modules must import and run on the light install.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
from moeproxy.proxy_builder.architectures import architecture_for, group_spec
from moeproxy.proxy_builder.clustering import (
    select_representatives,
    unweighted_kmedoids,
    weighted_cost,
    weighted_kmedoids,
)
from moeproxy.proxy_builder.distances import (
    VIEWS,
    coactivation_distance,
    fuse_distances,
    normalise,
    prototype_distance,
    router_distance,
)
from moeproxy.proxy_builder.errors import InvalidPruneRequest
from moeproxy.proxy_builder.layer_stats import LayerStatistics
from moeproxy.proxy_builder.methods import (
    METHODS,
    SelectionOptions,
    parse_view_weights,
    select_experts,
    simplex_grid,
)


def random_stats(seed: int, e: int = 8, h: int = 5, k: int = 2, tokens: int = 300) -> LayerStatistics:
    rng = np.random.default_rng(seed)
    popularity = rng.dirichlet(np.full(e, 0.5))
    onehot = np.zeros((tokens, e))
    for t in range(tokens):
        onehot[t, rng.choice(e, size=k, replace=False, p=popularity)] = 1
    x = rng.normal(size=(tokens, h))
    w = onehot * rng.random((tokens, e))
    return LayerStatistics(
        layer=0,
        tokens=tokens,
        frequency=onehot.sum(0).astype(np.int64),
        coactivation=(onehot.T @ onehot).astype(np.int64),
        prototype_sum=w.T @ x,
        prototype_weight=w.sum(0),
        routing_mass=w.sum(0),
        router_weight=rng.normal(size=(e, h)).astype(np.float32),
    )


def test_torch_free_import():
    code = (
        "import sys; import moeproxy.proxy_builder.distances, moeproxy.proxy_builder.clustering, "
        "moeproxy.proxy_builder.methods, moeproxy.proxy_builder.surgery, moeproxy.proxy_builder.calibration, "
        "moeproxy.proxy_builder.architectures; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- views ---------------------------------------------------------------------------------------


def test_router_and_prototype_distances_are_cosine():
    v = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]])
    d = router_distance(v)
    assert d[0, 1] == pytest.approx(1.0) and d[0, 2] == pytest.approx(2.0) and d[1, 1] == 0
    assert d[3, 0] == d[0, 3] == pytest.approx(1.0)  # a zero vector is at distance 1 from everyone
    np.testing.assert_array_equal(prototype_distance(v), d)


def test_coactivation_distance_matches_definition():
    s = random_stats(0)
    c = s.coactivation.astype(float)
    d = coactivation_distance(s.coactivation)
    for i, j in itertools.product(range(8), repeat=2):
        if i == j:
            assert d[i, j] == 0
        elif c[i, i] and c[j, j]:
            assert d[i, j] == pytest.approx(1 - c[i, j] / np.sqrt(c[i, i] * c[j, j]))
    never = np.zeros((3, 3), dtype=np.int64)
    never[0, 0] = never[1, 1] = never[0, 1] = never[1, 0] = 4
    d = coactivation_distance(never)
    assert d[0, 1] == 0 and d[0, 2] == 1 and d[2, 1] == 1


@pytest.mark.parametrize("view", list(VIEWS))
def test_views_are_symmetric_with_zero_diagonal(view):
    d = VIEWS[view](random_stats(3))
    np.testing.assert_allclose(d, d.T)
    assert (np.diag(d) == 0).all() and (d >= 0).all()


def test_normalise_and_fuse():
    d = np.array([[0, 2.0, 4.0], [2.0, 0, 3.0], [4.0, 3.0, 0]])
    n = normalise(d)
    assert n[0, 1] == 0 and n[0, 2] == 1 and n[1, 2] == pytest.approx(0.5) and (np.diag(n) == 0).all()
    assert (normalise(np.ones((3, 3)) - np.eye(3)) == 0).all()  # a constant view carries nothing
    f = fuse_distances({"router": n, "coact": np.zeros((3, 3))}, {"router": 3, "coact": 1})
    np.testing.assert_allclose(f, 0.75 * n)
    with pytest.raises(ValueError):
        fuse_distances({"router": n}, {"router": 0})


# --- K-Medoids -----------------------------------------------------------------------------------


def _enumerate(d, k, w):
    return min(
        (weighted_cost(d, w, m), m) for m in itertools.combinations(range(d.shape[0]), k)
    )


def _random_instance(seed, e):
    rng = np.random.default_rng(seed)
    pts = rng.normal(size=(e, 3))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    w = rng.integers(0, 50, size=e).astype(float)
    return d, w


@pytest.mark.parametrize("e,k", [(6, 2), (8, 3), (9, 4), (10, 5)])
def test_weighted_kmedoids_is_swap_optimal_and_matches_enumeration(e, k):
    """PAM is a local search: every result is swap-optimal, and on these seeded instances it is
    the exact optimum of all C(E, K) medoid sets (the enumeration is the reference)."""
    exact = 0
    for seed in range(15):
        d, w = _random_instance(seed, e)
        res = weighted_kmedoids(d, k, w)
        best_cost, _best = _enumerate(d, k, w)
        assert res.cost >= best_cost - 1e-9
        exact += res.cost == pytest.approx(best_cost)
        for out, inn in itertools.product(res.medoids, set(range(e)) - set(res.medoids)):
            swapped = [m for m in res.medoids if m != out] + [inn]
            assert weighted_cost(d, w, swapped) >= res.cost - 1e-9
    assert exact == 15


def test_weighted_kmedoids_planted_clusters_and_weights():
    """Frequency weighting: a heavy expert becomes a medoid, a rare outlier does not get its own cluster."""
    pts = np.array([[0.0], [0.1], [0.2], [5.0], [5.1], [5.2], [20.0]])
    d = np.abs(pts - pts.T)
    w = np.array([10, 100, 10, 10, 10, 100, 0.1])
    res = weighted_kmedoids(d, 2, w)
    assert res.medoids == (1, 5)
    plain = weighted_kmedoids(d, 3, None)
    assert 6 in plain.medoids  # unweighted: the outlier takes a cluster of its own
    assert 6 not in weighted_kmedoids(d, 3, w).medoids


def test_kmedoids_deterministic_and_labels():
    d, w = _random_instance(7, 12)
    a, b = weighted_kmedoids(d, 4, w), weighted_kmedoids(d, 4, w)
    assert a.medoids == b.medoids and (a.labels == b.labels).all()
    for c, m in enumerate(a.medoids):
        assert a.labels[m] == c
    assert sorted(i for cl in a.clusters() for i in cl) == list(range(12))
    u1, u2 = unweighted_kmedoids(d, 4, seed=3), unweighted_kmedoids(d, 4, seed=3)
    assert u1.medoids == u2.medoids
    ones = np.ones(12)
    for out, inn in itertools.product(u1.medoids, set(range(12)) - set(u1.medoids)):  # FasterPAM: swap-optimal
        assert weighted_cost(d, ones, [m for m in u1.medoids if m != out] + [inn]) >= u1.cost - 1e-9
    assert u1.cost >= _enumerate(d, 4, ones)[0] - 1e-9
    assert weighted_kmedoids(d, 12, w).medoids == tuple(range(12))
    assert weighted_kmedoids(d, 3, np.zeros(12)).medoids == weighted_kmedoids(d, 3, None).medoids


def test_representatives():
    d, _ = _random_instance(1, 8)
    res = weighted_kmedoids(d, 3, None)
    freq = np.arange(8)[::-1].copy()
    most = select_representatives(res, freq, "most_frequent")
    for rep, cluster in zip(most, res.clusters(), strict=True):
        assert rep in cluster and freq[rep] == max(freq[cluster])
    assert select_representatives(res, freq, "medoid") == list(res.medoids)


# --- methods -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_keeps_k_distinct_sorted(name):
    stats = {0: random_stats(0), 1: random_stats(1)}
    sel = select_experts(name, stats, [0, 1], 8, 3, SelectionOptions(seed=5))
    again = select_experts(name, stats, [0, 1], 8, 3, SelectionOptions(seed=5))
    for layer, s in sel.items():
        assert len(s.kept) == 3 and list(s.kept) == sorted(set(s.kept))
        assert s == again[layer]  # deterministic with a fixed seed
        if METHODS[name].views:
            assert len(s.clusters) == 3 and all(k in c for k, c in zip(s.kept, s.clusters, strict=True))


def test_per_group_selection_keeps_groups():
    cfg = {"model_type": "deepseek_v3", "n_routed_experts": 8, "n_group": 4, "topk_group": 2,
           "num_experts_per_tok": 2, "num_hidden_layers": 2, "first_k_dense_replace": 0}  # fmt: skip
    arch = architecture_for(cfg)
    assert group_spec(arch, cfg, 8, "per_group").groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    stats = {0: random_stats(2, e=16)}
    cfg16 = dict(cfg, n_routed_experts=16)
    group = group_spec(arch, cfg16, 8, "per_group")
    for name in METHODS:
        kept = select_experts(name, stats, [0], 16, 8, group=group)[0].kept
        assert [sum(g * 4 <= i < (g + 1) * 4 for i in kept) for g in range(4)] == [2, 2, 2, 2], name
    with pytest.raises(InvalidPruneRequest, match="Valid --keep values: 8, 12, 16"):
        group_spec(arch, cfg16, 4, "per_group")
    assert group_spec(arch, cfg16, 4, "flatten").config_patch() == {"n_group": 1, "topk_group": 1}


def test_view_weights_parsing_and_grid():
    assert parse_view_weights("1,0,2") == {"router": 1.0, "coact": 0.0, "proto": 2.0}
    assert parse_view_weights("auto") == "auto" and parse_view_weights(None) is None
    for bad in ("1,1", "a,b,c", "-1,1,1", "0,0,0", "nan,1,1"):
        with pytest.raises(InvalidPruneRequest):
            parse_view_weights(bad)
    grid = simplex_grid(("router", "coact", "proto"))
    assert len(grid) == 16  # 15 points of step 0.25 plus equal weights
    assert all(sum(p.values()) == pytest.approx(1) for p in grid)
    assert len(simplex_grid(("router", "coact"))) == 5  # (0.5, 0.5) is on the grid already


def test_weights_change_the_selection():
    stats = {0: random_stats(4, e=12)}
    router_only = select_experts("three_view", stats, [0], 12, 4, SelectionOptions(view_weights={"router": 1, "coact": 0, "proto": 0}))
    same = select_experts("router", stats, [0], 12, 4)
    assert router_only[0].kept == same[0].kept
