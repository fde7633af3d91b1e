"""Figure data for the run page: plain Plotly trace dicts built with numpy (no plotly.graph_objects,
whose validation costs more than the whole page budget at 5,000 steps x 20 metrics).

Per metric: the run's series (min/max-decimated to at most ``max_points`` so spikes survive),
non-finite points as markers on the plot's edge (NaN and ±inf are data, SPEC section 4), the
matched fingerprint's expected shape (dashed) and vertical lines at the detected change points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from moeproxy.signatures.canonical import SeriesBins

MAX_POINTS = 1000
MAX_NONFINITE_MARKERS = 300

# Metrics worth showing first when the evaluation names none (canonical names, SPEC section 4).
CORE_CANONICAL = (
    "reward_mean",
    "kl",
    "rollout_train_logp_diff",
    "grad_norm",
    "entropy",
    "clip_frac",
    "ppo_kl",
    "pg_loss",
    "response_length",
)
KEY_METRICS = 6


def decimate(
    steps: np.ndarray, values: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` finite points: the min and the max of each bucket of ``size``
    consecutive points (``size = ceil(n / (max_points // 2))``), in step order."""
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    n = values.size
    if n <= max_points:
        return steps, values
    size = -(-n // max(1, max_points // 2))
    buckets = -(-n // size)
    padded = np.full(buckets * size, np.inf)
    padded[:n] = values
    offsets = np.arange(buckets) * size
    lo = offsets + np.argmin(padded.reshape(buckets, size), axis=1)
    padded[n:] = -np.inf
    hi = offsets + np.argmax(padded.reshape(buckets, size), axis=1)
    keep = np.unique(np.concatenate([lo, hi]))
    return steps[keep], values[keep]


def binned_points(
    grid: np.ndarray, binned: SeriesBins
) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, list[int]]]]:
    """What to draw of a metric read binned (metrics.read_binned): per bin with a finite value its
    lowest and highest finite value at the bin's step (one point where they agree, as in a run
    read whole), and per kind of non-finite value its count and the steps of the bins that held one."""
    has = binned.finite_count > 0
    at, low, high = grid[binned.bins[has]], binned.lowest[has], binned.highest[has]
    two = low != high
    steps = np.concatenate([at, at[two]])
    values = np.concatenate([low, high[two]])
    order = np.argsort(steps, kind="stable")
    nonfinite = {
        kind: (int(counts.sum()), grid[binned.bins[counts > 0]].tolist())
        for kind, counts in (("NaN", binned.nan), ("+inf", binned.posinf), ("-inf", binned.neginf))
    }
    return steps[order], values[order], nonfinite


def nonfinite_points(steps: np.ndarray, values: np.ndarray) -> dict[str, list[int]]:
    """Steps where the value was NaN, +inf or -inf."""
    return {
        "NaN": steps[np.isnan(values)].tolist(),
        "+inf": steps[np.isposinf(values)].tolist(),
        "-inf": steps[np.isneginf(values)].tolist(),
    }


@dataclass
class MetricFigure:
    name: str
    canonical: str
    traces: list[dict[str, Any]] = field(default_factory=list)
    change_points: list[int] = field(default_factory=list)
    nonfinite: dict[str, int] = field(default_factory=dict)
    key: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "canonical": self.canonical,
            "traces": self.traces,
            "change_points": self.change_points,
            "nonfinite": self.nonfinite,
        }


_EDGE_Y = {"NaN": 1.02, "+inf": 1.06, "-inf": -0.04}  # marker rows in paper coordinates
_EDGE_SYMBOL = {"NaN": "x", "+inf": "triangle-up", "-inf": "triangle-down"}


def metric_figure(
    name: str,
    steps: np.ndarray,
    values: np.ndarray,
    *,
    canonical: str,
    expected: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    change_point: int | None = None,
    reproduction: tuple[str, Sequence[int], Sequence[float]] | None = None,
    nonfinite: Mapping[str, tuple[int, list[int]]] | None = None,
    max_points: int = MAX_POINTS,
) -> MetricFigure:
    """``expected``: fault class -> {"steps", "values"} of that class's expected shape for this metric.
    ``reproduction``: (legend, steps, values) of a job's reproduction of this metric on the proxy.
    ``nonfinite``: kind -> (count, steps) when ``values`` does not carry them (:func:`binned_points`)."""
    fig = MetricFigure(name=name, canonical=canonical)
    xs, ys = decimate(steps, values, max_points)
    fig.traces.append(
        {
            "type": "scattergl" if xs.size > 2000 else "scatter",
            "mode": "lines",
            "name": "run",
            "x": xs.tolist(),
            "y": ys.tolist(),
            "line": {"width": 1.5, "color": "#1f5fa8"},
        }
    )
    for i, (fault_class, shape) in enumerate((expected or {}).items()):
        fig.traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"expected: {fault_class}",
                "x": list(shape["steps"]),
                "y": list(shape["values"]),
                "line": {"dash": "dash" if i == 0 else "dot", "width": 2, "color": _OVERLAY_COLOURS[i % 3]},
            }
        )
    if reproduction is not None and len(reproduction[1]):
        label, r_steps, r_values = reproduction
        fig.traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "x": list(r_steps),
                "y": list(r_values),
                "line": {"width": 1.5, "color": "#7f8c8d"},
                "opacity": 0.85,
            }
        )
    if nonfinite is None:
        nonfinite = {kind: (len(at), at) for kind, at in nonfinite_points(steps, values).items()}
    for kind, (count, at) in nonfinite.items():
        if not at:
            continue
        fig.nonfinite[kind] = count
        shown = at[:MAX_NONFINITE_MARKERS]
        fig.traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{kind} ({count})",
                "x": shown,
                "y": [_EDGE_Y[kind]] * len(shown),
                "yaxis": "y2",
                "hovertemplate": f"step %{{x}}: {kind}<extra></extra>",
                "marker": {"symbol": _EDGE_SYMBOL[kind], "size": 7, "color": "#c0392b"},
            }
        )
    if change_point is not None:
        fig.change_points.append(int(change_point))
    return fig


_OVERLAY_COLOURS = ("#e67e22", "#8e44ad", "#16a085")


def order_metrics(
    names: Sequence[str],
    canonical_of: Mapping[str, str],
    *,
    overlay_metrics: Sequence[str] = (),
    evidence_metrics: Sequence[str] = (),
) -> list[str]:
    """Key metrics first: the top class's expected-shape metrics, then those its evidence names,
    then the core canonical ones, then the rest alphabetically."""
    rank: dict[str, tuple[int, int]] = {}
    core = {c: i for i, c in enumerate(CORE_CANONICAL)}
    for name in names:
        if name in overlay_metrics:
            rank[name] = (0, list(overlay_metrics).index(name))
        elif name in evidence_metrics:
            rank[name] = (1, list(evidence_metrics).index(name))
        elif canonical_of.get(name, name) in core:
            rank[name] = (2, core[canonical_of.get(name, name)])
        else:
            rank[name] = (3, 0)
    return sorted(names, key=lambda n: (rank[n], n))

