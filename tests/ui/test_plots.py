"""Plot data: decimation against a naive reference, non-finite markers, metric ordering."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from moeproxy.service.ui.plots import decimate, metric_figure, nonfinite_points, order_metrics


def naive_bucket_extremes(values: np.ndarray, max_points: int) -> set[int]:
    size = math.ceil(values.size / (max_points // 2))
    keep = set()
    for start in range(0, values.size, size):
        seg = list(values[start : start + size])
        keep.add(start + seg.index(min(seg)))
        keep.add(start + seg.index(max(seg)))
    return keep


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), max_points=st.integers(4, 400), seed=st.integers(0, 2**16))
def test_decimate_keeps_each_buckets_min_and_max(n, max_points, seed):
    rng = np.random.default_rng(seed)
    steps = np.arange(n) * 3
    values = rng.standard_cauchy(n)
    xs, ys = decimate(steps, values, max_points)
    assert xs.size <= max(n, 0) and (n <= max_points or xs.size <= max_points)
    assert np.all(np.diff(xs) > 0)  # step order kept
    if n <= max_points:
        assert np.array_equal(ys, values)
    else:
        assert set((xs // 3).tolist()) == naive_bucket_extremes(values, max_points)
        assert ys.max() == values.max() and ys.min() == values.min()  # spikes survive


def test_nonfinite_values_become_markers_not_line_points():
    steps = np.arange(6)
    values = np.array([1.0, math.nan, 2.0, math.inf, -math.inf, 3.0])
    assert nonfinite_points(steps, values) == {"NaN": [1], "+inf": [3], "-inf": [4]}
    fig = metric_figure("actor/grad_norm", steps, values, canonical="grad_norm", change_point=3)
    line = fig.traces[0]
    assert line["x"] == [0, 2, 5] and line["y"] == [1.0, 2.0, 3.0]
    markers = {t["name"]: t["x"] for t in fig.traces[1:]}
    assert markers == {"NaN (1)": [1], "+inf (1)": [3], "-inf (1)": [4]}
    assert fig.nonfinite == {"NaN": 1, "+inf": 1, "-inf": 1} and fig.change_points == [3]


def test_expected_shape_is_an_overlay_trace():
    fig = metric_figure(
        "training/rollout_probs_diff_mean",
        np.arange(4),
        np.ones(4),
        canonical="rollout_train_logp_diff",
        expected={"rollout_logp_precision": {"steps": [1, 2], "values": [0.5, 0.7]}},
    )
    assert (
        fig.traces[1]["name"] == "expected: rollout_logp_precision"
        and fig.traces[1]["line"]["dash"] == "dash"
    )


def test_key_metrics_come_first():
    names = [
        "zzz",
        "actor/entropy",
        "critic/score/mean",
        "training/rollout_probs_diff_mean",
        "actor/pg_clipfrac",
    ]
    canonical = {
        "actor/entropy": "entropy",
        "critic/score/mean": "reward_mean",
        "training/rollout_probs_diff_mean": "rollout_train_logp_diff",
        "actor/pg_clipfrac": "clip_frac",
    }
    ordered = order_metrics(
        names, canonical, overlay_metrics=["actor/pg_clipfrac"], evidence_metrics=["actor/entropy"]
    )
    assert ordered == [
        "actor/pg_clipfrac",
        "actor/entropy",
        "critic/score/mean",
        "training/rollout_probs_diff_mean",
        "zzz",
    ]


def test_binned_points_draw_each_bins_extremes_and_count_nonfinite_points():
    from moeproxy.service.ui.plots import binned_points
    from moeproxy.signatures.canonical import MetricSeries, bin_series

    steps = np.arange(12, dtype=np.int64)
    values = np.array([1.0, 5.0, 3.0, np.nan, np.nan, 2.0, np.inf, 4.0, 4.0, -np.inf, np.nan, np.nan])
    grid = np.arange(0, 12, 3, dtype=np.int64)  # bins of 3 steps
    xs, ys, nonfinite = binned_points(grid, bin_series(MetricSeries(steps, values), grid, extremes=True))
    # bin 0: 1..5; bin 1: only 2.0 (one point); bin 2: 4.0 twice (one point); bin 3: no finite value
    assert xs.tolist() == [0, 0, 3, 6] and ys.tolist() == [1.0, 5.0, 2.0, 4.0]
    assert nonfinite == {"NaN": (4, [3, 9]), "+inf": (1, [6]), "-inf": (1, [9])}
    fig = metric_figure("m", xs, ys, canonical="m", nonfinite=nonfinite)
    assert fig.nonfinite == {"NaN": 4, "+inf": 1, "-inf": 1}
