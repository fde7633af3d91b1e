"""Reading a run's metrics and putting them on a canonical footing.

Three steps, each a pure function:

1. *reading* (:class:`RunMetrics`): REST ingest bodies (``{"steps": [{"step", "values"}]}``),
   JSONL traces of the reproduction engine, or the service's column form
   (``{name: {"steps": [...], "values": [...]}}``). Values may be numbers, JSON ``NaN`` /
   ``Infinity`` literals or the non-finite spellings of :mod:`moeproxy.signatures.values`;
   a non-finite value is data, never dropped.
2. *renaming* framework names to canonical metrics with the alias table
   (:mod:`moeproxy.signatures.vocabulary`). When two logged names map to the same canonical metric,
   the one listed first in the alias table wins and the other keeps its own name.
3. *resampling* onto one step grid shared by every metric: gaps are filled by linear
   interpolation (and marked), non-finite values are filled the same way for the numeric channel
   but recorded in an explicit indicator series, because a NaN ``grad_norm`` is evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
from moeproxy.signatures.errors import InvalidRun
from moeproxy.signatures.settings import DEFAULT_SETTINGS, RunSettings
from moeproxy.signatures.values import format_value, parse_nonfinite
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, MetricAlias, alias_index, canonical_name

#: The most grid points a run is resampled to; longer runs are binned (mean of the finite values
#: in a bin, non-finite if any value in the bin was).
MAX_GRID_POINTS = 4096


def parse_value(value: Any) -> float | None:
    """A metric value as a float; ``None`` (JSON null) means "not logged at this step"."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        key = value.strip()  # a CSV cell or a hand-written file may pad its numbers
        nonfinite = parse_nonfinite(key)
        if nonfinite is not None:
            return nonfinite
        try:
            return float(key)
        except ValueError:
            raise InvalidRun(f"value {value!r} is not a number") from None
    raise InvalidRun(f"value {value!r} is not a number")


@dataclass(frozen=True)
class MetricSeries:
    """One logged metric: strictly increasing steps and their values (NaN/inf allowed)."""

    steps: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        if self.steps.shape != self.values.shape or self.steps.ndim != 1:
            raise InvalidRun("steps and values must be 1-D arrays of the same length")
        if self.steps.size > 1 and np.any(np.diff(self.steps) <= 0):
            raise InvalidRun("steps must be strictly increasing")

    @classmethod
    def from_points(cls, points: Mapping[int, float]) -> MetricSeries:
        steps = np.array(sorted(points), dtype=np.int64)
        return cls(steps, np.array([points[int(s)] for s in steps], dtype=np.float64))


@dataclass(frozen=True)
class RunMetrics:
    """A run's metrics under the names it logged them with."""

    series: Mapping[str, MetricSeries]
    framework: str | None = None
    name: str | None = None

    @property
    def last_step(self) -> int | None:
        ends = [int(s.steps[-1]) for s in self.series.values() if s.steps.size]
        return max(ends) if ends else None

    @classmethod
    def from_steps(cls, steps: Iterable[Mapping[str, Any]], *, framework: str | None = None,
                   name: str | None = None) -> RunMetrics:
        """From ``[{"step": int, "values": {name: number}}, ...]`` (REST body, JSONL trace lines).

        A step sent twice overwrites the earlier values (the service's idempotent ingest).
        """
        points: dict[str, dict[int, float]] = {}
        for i, item in enumerate(steps):
            if not isinstance(item, Mapping) or "step" not in item or "values" not in item:
                raise InvalidRun(f"step entry {i}: expected an object with 'step' and 'values'")
            step = item["step"]
            if isinstance(step, bool) or not isinstance(step, int | float) or step != int(step) or step < 0:
                raise InvalidRun(f"step entry {i}: step must be an integer >= 0, got {step!r}")
            values = item["values"]
            if not isinstance(values, Mapping):
                raise InvalidRun(f"step entry {i}: 'values' must be an object")
            for metric, raw in values.items():
                value = parse_value(raw)
                if value is not None:
                    points.setdefault(str(metric), {})[int(step)] = value
        return cls({m: MetricSeries.from_points(p) for m, p in points.items()}, framework, name)

    @classmethod
    def from_columns(cls, metrics: Mapping[str, Mapping[str, Sequence[Any]]], *,
                     framework: str | None = None, name: str | None = None) -> RunMetrics:
        """From the service's column form ``{name: {"steps": [...], "values": [...]}}``."""
        series: dict[str, MetricSeries] = {}
        for metric, column in metrics.items():
            steps, values = column.get("steps"), column.get("values")
            if steps is None or values is None or len(steps) != len(values):
                raise InvalidRun(f"metric {metric!r}: 'steps' and 'values' must be lists of one length")
            pts = {int(s): v for s, raw in zip(steps, values, strict=True)
                   if (v := parse_value(raw)) is not None}
            series[str(metric)] = MetricSeries.from_points(pts)
        return cls(series, framework, name)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Sequence[float]], *, steps: Sequence[int] | None = None,
                    framework: str | None = None, name: str | None = None) -> RunMetrics:
        """From equal-length value arrays on one step list (default 0..n-1); handy for tests."""
        series = {}
        for metric, values in arrays.items():
            v = np.asarray(values, dtype=np.float64)
            s = np.arange(v.size, dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
            series[metric] = MetricSeries(s, v)
        return cls(series, framework, name)

    def truncated(self, last_step: int) -> RunMetrics:
        """The run as it looked when ``last_step`` had just been logged (online triage)."""
        out = {}
        for m, s in self.series.items():
            keep = s.steps <= last_step
            if keep.any():
                out[m] = MetricSeries(s.steps[keep], s.values[keep])
        return RunMetrics(out, self.framework, self.name)

    def to_steps(self) -> list[dict[str, Any]]:
        """The REST/JSONL form, non-finite values as SPEC strings."""
        by_step: dict[int, dict[str, float | str]] = {}
        for m, s in self.series.items():
            for step, value in zip(s.steps.tolist(), s.values.tolist(), strict=True):
                by_step.setdefault(step, {})[m] = format_value(value)
        return [{"step": k, "values": by_step[k]} for k in sorted(by_step)]


def _one_document(text: str) -> bool:
    """The file is one JSON object (the REST ingest body), not JSONL (one object a line)."""
    stripped = text.strip()
    return stripped.startswith("{") and "\n{" not in stripped


def load_run(path: str | Path, *, framework: str | None = None) -> RunMetrics:
    """Read a run file: JSONL of ``{"step", "values"}`` lines, or a JSON object with ``steps``
    (the REST ingest body, optionally with ``framework``), or with ``metrics`` in column form.
    JSON ``NaN``/``Infinity`` literals are accepted (Python's json reads them)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InvalidRun(f"{p}: {exc.strerror or exc}") from None
    try:
        if _one_document(text):
            doc = json.loads(text)
            return _from_document(doc, framework, p.stem)
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise InvalidRun(f"{p}: not JSON or JSONL ({exc.msg} at line {exc.lineno})") from None
    if len(lines) == 1 and isinstance(lines[0], Mapping) and "step" not in lines[0]:
        return _from_document(lines[0], framework, p.stem)
    return RunMetrics.from_steps(lines, framework=framework, name=p.stem)


def load_config(path: str | Path) -> Mapping[str, Any] | None:
    """The ``config`` a run file carries (a JSON document with ``steps`` and ``config``, as
    ``POST /api/v1/runs`` takes it and ``benchmarks/trl_runs.py`` exports it); None for JSONL or a
    document without one. ``load_run`` has read the file already; an unreadable one is its error."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError:
        return None
    if not _one_document(text):
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    config = doc.get("config") if isinstance(doc, Mapping) else None
    return config if isinstance(config, Mapping) else None


def _from_document(doc: Any, framework: str | None, name: str) -> RunMetrics:
    if not isinstance(doc, Mapping):
        raise InvalidRun("expected a JSON object with 'steps' (or 'metrics')")
    fw = framework or doc.get("framework")
    nm = doc.get("name") or name
    if "steps" in doc:
        return RunMetrics.from_steps(doc["steps"], framework=fw, name=nm)
    if "metrics" in doc and isinstance(doc["metrics"], Mapping):
        return RunMetrics.from_columns(doc["metrics"], framework=fw, name=nm)
    if "step" in doc and "values" in doc:
        return RunMetrics.from_steps([doc], framework=fw, name=nm)
    raise InvalidRun("expected a JSON object with 'steps' (or 'metrics')")


@dataclass(frozen=True)
class CanonicalSeries:
    """One canonical metric on the run's grid.

    ``values`` is the numeric channel (finite everywhere: gaps and non-finite points are filled by
    linear interpolation between finite neighbours); ``observed`` says where a value was logged;
    ``nonfinite`` says where the logged value was NaN or +-inf — kept as its own signal.
    """

    name: str
    source: str  # the name the run logged it under
    values: np.ndarray
    observed: np.ndarray
    nonfinite: np.ndarray
    nan_count: int = 0
    posinf_count: int = 0
    neginf_count: int = 0

    @property
    def has_nonfinite(self) -> bool:
        return bool(self.nonfinite.any())

    def first_nonfinite_index(self) -> int | None:
        idx = np.flatnonzero(self.nonfinite)
        return int(idx[0]) if idx.size else None

    @property
    def finite(self) -> np.ndarray:
        """Where a finite value was logged (the points the whole-run rules read)."""
        return self.observed & ~self.nonfinite

    @property
    def finite_count(self) -> int:
        return int(self.finite.sum())


@dataclass(frozen=True)
class CanonicalRun:
    steps: np.ndarray  # the grid (int64)
    metrics: Mapping[str, CanonicalSeries]
    framework: str | None = None
    name: str | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)  # logged name -> canonical
    settings: RunSettings = DEFAULT_SETTINGS  # what the run's config says (settings.py)

    @property
    def n_steps(self) -> int:
        return int(self.steps.size)

    def first_nonfinite_step(self, metric: str) -> int | None:
        i = self.metrics[metric].first_nonfinite_index()
        return None if i is None else int(self.steps[i])


@dataclass(frozen=True)
class SeriesBins:
    """What resampling keeps of one series on a grid (its sufficient statistics): for each grid bin
    that holds a logged point, the sum and count of its finite values and its non-finite counts.

    A database computes these without sending the points (``GROUP BY`` the bin), so a run of any
    length reaches triage in at most ``MAX_GRID_POINTS`` rows per metric; :func:`bin_series` computes
    the same from the points.  ``lowest`` / ``highest`` (the extremes of each bin's finite values,
    NaN where it has none) are only for drawing and may be absent.
    """

    bins: np.ndarray  # grid indices of the bins that hold a point, increasing (int64)
    finite_sum: np.ndarray
    finite_count: np.ndarray  # int64
    nan: np.ndarray  # int64 counts per bin, likewise posinf and neginf
    posinf: np.ndarray
    neginf: np.ndarray
    last_step: int
    lowest: np.ndarray | None = None
    highest: np.ndarray | None = None

    @property
    def nonfinite(self) -> np.ndarray:
        return (self.nan + self.posinf + self.neginf) > 0


@dataclass(frozen=True)
class BinnedRun:
    """A run on its canonical grid, before renaming: logged name -> :class:`SeriesBins`."""

    grid: np.ndarray
    series: Mapping[str, SeriesBins]
    framework: str | None = None
    name: str | None = None

    @property
    def last_step(self) -> int | None:
        return max((b.last_step for b in self.series.values()), default=None)


def canonicalise(run: RunMetrics | BinnedRun, *, aliases: Iterable[MetricAlias] = DEFAULT_ALIASES,
                 framework: str | None = None, max_points: int = MAX_GRID_POINTS,
                 settings: RunSettings = DEFAULT_SETTINGS) -> CanonicalRun:
    """Rename to canonical metrics and resample onto one step grid (``run`` as points, binned here,
    or already binned, as the service reads a long run)."""
    binned = run if isinstance(run, BinnedRun) else bin_run(run, max_points=max_points)
    alias_list = list(aliases)
    fw = framework or binned.framework
    index = alias_index(alias_list, fw)
    # A name's first place among this framework's aliases: another framework that logs the same
    # name later in the table (MindSpeed-RL's actor/entropy) must not push it behind a name
    # listed after it for this one (verl's earlier actor/entropy_loss).
    priority: dict[str, int] = {}
    for i, a in enumerate(alias_list):
        if fw is None or a.framework in ("*", fw):
            priority.setdefault(a.name, i)
    chosen: dict[str, str] = {}  # canonical -> logged name
    for logged in sorted(binned.series, key=lambda n: (priority.get(n, len(priority)), n)):
        canon = canonical_name(logged, index)
        chosen.setdefault(canon if canon not in chosen else logged, logged)
    metrics = {c: fill(c, logged, binned.series[logged], binned.grid.size) for c, logged in chosen.items()}
    renamed = {logged: c for c, logged in chosen.items() if c != logged}
    return CanonicalRun(binned.grid, metrics, fw, binned.name, renamed, settings)


def bin_run(run: RunMetrics, *, max_points: int = MAX_GRID_POINTS, extremes: bool = False) -> BinnedRun:
    """Every logged (non-empty) series of ``run`` binned on the grid of :func:`step_grid`."""
    logged = {name: s for name, s in run.series.items() if s.steps.size}
    grid = step_grid([s.steps for s in logged.values()], max_points=max_points)
    return BinnedRun(grid, {n: bin_series(s, grid, extremes=extremes) for n, s in logged.items()},
                     run.framework, run.name)


def step_grid(step_lists: Sequence[np.ndarray], *, max_points: int = MAX_GRID_POINTS) -> np.ndarray:
    """A regular grid covering every logged step, at the finest common stride (gcd of gaps)."""
    nonempty = [s for s in step_lists if s.size]
    if not nonempty:
        return np.zeros(0, dtype=np.int64)
    lo = min(int(s[0]) for s in nonempty)
    hi = max(int(s[-1]) for s in nonempty)
    # Offsets of every series from the first step count too: steps 0,10,20 and 5,15 need stride 5.
    gaps = [np.diff(s - lo, prepend=0) for s in nonempty]
    stride = int(reduce(math.gcd, (int(g) for d in gaps for g in np.unique(d)), 0))
    return grid_over(lo, hi, stride, max_points=max_points)


def grid_over(lo: int, hi: int, stride: int, *, max_points: int = MAX_GRID_POINTS) -> np.ndarray:
    """The grid from ``lo`` to ``hi`` at ``stride`` (the gcd of every logged step's offset from
    ``lo``; 0 when only ``lo`` is logged), widened by a whole factor to keep ``max_points``."""
    stride = stride or 1
    n = (hi - lo) // stride + 1
    if n > max_points:
        stride *= math.ceil(n / max_points)
    return np.arange(lo, hi + 1, stride, dtype=np.int64)


def bin_series(series: MetricSeries, grid: np.ndarray, *, extremes: bool = False) -> SeriesBins:
    """The sufficient statistics of ``series`` on ``grid`` (the reference for the database's)."""
    n = grid.size
    stride = int(grid[1] - grid[0]) if n > 1 else 1
    bins = np.clip((series.steps - grid[0]) // stride, 0, n - 1).astype(np.int64)
    values = series.values
    finite = np.isfinite(values)
    held = np.flatnonzero(np.bincount(bins, minlength=n))
    sums = np.bincount(bins[finite], weights=values[finite], minlength=n)

    def count_where(mask: np.ndarray) -> np.ndarray:
        return np.bincount(bins[mask], minlength=n)[held]

    lowest = highest = None
    if extremes:
        low, high = np.full(n, np.inf), np.full(n, -np.inf)
        np.minimum.at(low, bins[finite], values[finite])
        np.maximum.at(high, bins[finite], values[finite])
        lowest = np.where(np.isfinite(low[held]), low[held], np.nan)
        highest = np.where(np.isfinite(high[held]), high[held], np.nan)
    return SeriesBins(
        held, sums[held], count_where(finite), count_where(np.isnan(values)), count_where(values == np.inf),
        count_where(values == -np.inf), int(series.steps[-1]), lowest, highest,
    )


def resample(canonical: str, logged: str, series: MetricSeries, grid: np.ndarray) -> CanonicalSeries:
    """Bin one series onto the grid (mean of finite values per bin), then fill gaps."""
    return fill(canonical, logged, bin_series(series, grid), grid.size)


def fill(canonical: str, logged: str, binned: SeriesBins, n: int) -> CanonicalSeries:
    """One binned metric as a canonical series on a grid of ``n`` points: the mean of each bin's
    finite values, the bins without one filled by linear interpolation."""
    sums, counts = np.zeros(n), np.zeros(n, dtype=np.int64)
    sums[binned.bins], counts[binned.bins] = binned.finite_sum, binned.finite_count
    observed, nonfinite = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    observed[binned.bins] = True
    nonfinite[binned.bins] = binned.nonfinite
    have = counts > 0
    values = np.full(n, np.nan)
    values[have] = sums[have] / counts[have]
    if have.any():
        idx = np.flatnonzero(have)
        values = np.interp(np.arange(n), idx, values[idx])  # holds the end values beyond the ends
    else:
        values = np.zeros(n)
    return CanonicalSeries(
        canonical, logged, values, observed, nonfinite,
        nan_count=int(binned.nan.sum()), posinf_count=int(binned.posinf.sum()),
        neginf_count=int(binned.neginf.sum()),
    )
