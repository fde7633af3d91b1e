"""Signatures computable from one run alone (production runs have no healthy twin).

For every canonical metric of a run:

- **onset**: candidate change points from ruptures ``KernelCPD`` (linear kernel, a fixed small number
  of breakpoints: the C implementation, never Pelt on the hot path, SPEC section 8); the earliest
  candidate whose *level shift or change of slope beyond a linear trend* is significant becomes the
  metric's onset. Significance is a Wald test of ``y = a + c·t + δ·1[t≥b] + γ·(t−b)₊`` with
  Newey–West (HAC) errors, because training metrics are strongly autocorrelated and plain OLS errors
  would call every wobble significant.
- **baseline**: the pre-onset segment (median level, robust scale); without an onset, the first fifth
  of the run.
- **direction**: sign of the post-onset level against the baseline; without an onset, the sign of the
  trend (Theil–Sen slope, significance by OLS with HAC errors).
- **level shift**: the post/pre ratio of medians ("jumped ×12") and the shift in baseline-scale units.
- **post-onset trend**: Theil–Sen slope of the post-onset segment and its sign ("rising from step 43").
- **non-finite events**: first non-finite step and counts (NaN, +inf, -inf), kept as their own signal.

Benjamini–Hochberg (statsmodels ``multipletests``) runs across the metrics of a run, one family for
onsets and one for trends, so that a noisy healthy run with a dozen metrics does not light up a dozen
"significant" changes.

Statistical tests run on block means of at most ``max_test_points`` points: it keeps a 2,000-step run
cheap, and averaging blocks also shortens the autocorrelation the HAC errors must absorb.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from moeproxy.signatures.canonical import CanonicalRun, CanonicalSeries
from scipy import stats

Sign = int  # +1, -1 or 0


@dataclass(frozen=True)
class SignatureParams:
    """Knobs of the per-run signature extraction (the defaults are the calibrated ones)."""

    alpha: float = 0.05  # Benjamini–Hochberg false-discovery rate across a run's metrics
    min_effect: float = 3.0  # a change must also be this many baseline-noise units large
    max_test_points: int = 256
    n_candidates: int = 3  # change-point candidates per metric
    prominence: float = 0.3  # an earlier change must be this share of the largest one
    min_segment: int = 3  # points on each side of an onset
    baseline_fraction: float = 0.2  # baseline window of a metric without an onset
    trace_pre: int = 8  # effect-trace points before the onset
    trace_post: int = 32  # effect-trace points after the onset

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError("alpha must lie in (0, 1)")
        if self.min_segment < 2 or self.n_candidates < 1 or self.max_test_points < 16:
            raise ValueError("min_segment >= 2, n_candidates >= 1, max_test_points >= 16")


DEFAULT_PARAMS = SignatureParams()


@dataclass(frozen=True)
class MetricSignature:
    name: str
    source: str
    n_points: int
    onset_index: int | None  # index into the run's grid
    onset_step: int | None
    onset_p: float  # BH-adjusted
    direction: Sign
    effect_z: float  # post - pre median shift in baseline-scale units
    ratio: float | None  # post/pre median ratio when both share a sign and pre is not ~0
    baseline_level: float
    baseline_scale: float
    post_level: float
    trend: Sign  # post-onset (or whole-run) trend sign, significant after BH
    trend_slope: float  # Theil–Sen slope per grid point of that segment (log10 units when located on a log scale)
    trend_p: float
    first_nonfinite_step: int | None
    nonfinite_count: int
    nan_count: int
    posinf_count: int
    neginf_count: int
    freeze_index: int | None = None  # from here to the end the metric is constant (and was not before)
    freeze_step: int | None = None
    freeze_value: float | None = None
    #: Sign of a significant trend however small against the noise: a small-batch GRPO run's reward
    #: rises steadily (p ~ 1e-6) but by only ~2 noise widths over 120 steps, below ``min_effect``,
    #: so its ``trend`` is 0 although the run plainly learns.
    drift: Sign = 0

    @property
    def event_index(self) -> int | None:
        """Where the metric's behaviour changes: its onset, else where it froze (ppo_kl stuck at
        exactly 0 once updates stop moves no median, so it has no change point)."""
        return self.onset_index if self.onset_index is not None else self.freeze_index

    @property
    def changed(self) -> bool:
        return self.direction != 0

    @property
    def has_nonfinite(self) -> bool:
        return self.nonfinite_count > 0

    @property
    def frozen(self) -> bool:
        """It moved, then stopped moving for good (``freeze_index``)."""
        return self.freeze_index is not None

    @property
    def flat_baseline(self) -> bool:
        """Its baseline did not move at all (its scale is the floor): a shift away from it has no
        size in noise units (TRL's clipped ratio at exactly 0 until completions start to hit the cap)."""
        return self.baseline_scale <= _scale_floor(self.baseline_level) * (1.0 + 1e-9)


@dataclass(frozen=True)
class RunSignature:
    run: CanonicalRun
    metrics: Mapping[str, MetricSignature]
    params: SignatureParams = field(default=DEFAULT_PARAMS)

    @property
    def steps(self) -> np.ndarray:
        return self.run.steps

    def onset_of(self, names) -> int | None:
        """Earliest onset index among ``names`` (the class onset used to align effect traces)."""
        idx = [self.metrics[n].event_index for n in names
               if n in self.metrics and self.metrics[n].event_index is not None]
        return min(idx) if idx else None

    def effect_trace(self, name: str, align_index: int, *, pre: int | None = None,
                     post: int | None = None) -> np.ndarray:
        """The metric around ``align_index`` in baseline units, ``pre`` points before it and up to
        ``post`` points from it (shorter on a partial run). Non-finite points count as a large
        excursion in the direction the fingerprint would see (the numeric channel is filled)."""
        p = self.params
        pre = p.trace_pre if pre is None else pre
        post = p.trace_post if post is None else post
        # Matching asks for the same (metric, onset) once per fingerprint: cache on the instance.
        cache = self.__dict__.setdefault("_traces", {})
        key = (name, align_index, pre, post)
        if key not in cache:
            cache[key] = self._effect_trace(name, align_index, pre, post)
        return cache[key]

    def volatility(self, name: str, align_index: int) -> float | None:
        """log10 of the post/pre robust spread around ``align_index`` (clipped to ±3): a metric
        that freezes (ppo_kl exactly 0 once updates stop) or starts to spike changes its spread
        without moving its median."""
        p = self.params
        x = self.run.metrics[name].values
        pre = x[max(0, align_index - p.trace_pre):align_index]
        post = x[align_index:align_index + p.trace_post]
        if pre.size < 3 or post.size < 3:
            return None
        floor = _scale_floor(float(np.median(pre)))
        ratio = (_robust_scale(post) + floor) / (_robust_scale(pre) + floor)
        return float(np.clip(np.log10(ratio), -3.0, 3.0))

    def _effect_trace(self, name: str, align_index: int, pre: int, post: int) -> np.ndarray:
        series = self.run.metrics[name]
        sig = self.metrics[name]
        lo = max(0, align_index - pre)
        seg = series.values[lo: align_index + post]
        base = series.values[lo:align_index] if align_index > lo else series.values[:1]
        level = float(np.median(base))
        scale = max(sig.baseline_scale, _scale_floor(level))
        out = (seg - level) / scale
        if lo > align_index - pre:  # left-pad with the first value so index pre is the onset
            out = np.concatenate([np.full(pre - (align_index - lo), out[0] if out.size else 0.0), out])
        return out


def run_signature(run: CanonicalRun, params: SignatureParams = DEFAULT_PARAMS) -> RunSignature:
    """Per-metric signatures of a canonical run, with BH across its metrics."""
    raw = {name: _analyse(series, params) for name, series in run.metrics.items()}
    names = list(raw)
    onset_p = _bh([raw[n].onset_p_raw for n in names], params.alpha)
    trend_p = _bh([raw[n].trend_p_raw for n in names], params.alpha)
    out: dict[str, MetricSignature] = {}
    for n, po, pt in zip(names, onset_p, trend_p, strict=True):
        out[n] = _finalise(run, run.metrics[n], raw[n], po, pt, params)
    return RunSignature(run, out, params)


# ---------------------------------------------------------------------------------------------
# internals


@dataclass
class _Raw:
    onset_index: int | None
    onset_p_raw: float
    effect_z: float
    pre_level: float
    post_level: float
    scale: float
    trend_slope: float
    trend_p_raw: float
    trend_effect: float  # |slope * length| / noise


def _scale_floor(level: float) -> float:
    # A flat metric (lr, a constant loss) has zero noise; the floor keeps ratios finite and makes
    # a change of 1e-6 relative to the level count as noise.
    return 1e-6 * abs(level) + 1e-12


def _robust_scale(x: np.ndarray) -> float:
    if x.size < 2:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def noise_scale(y: np.ndarray) -> float:
    """Point-to-point noise from first differences (robust to trends and level shifts)."""
    if y.size < 3:
        return 0.0
    return _robust_scale(np.diff(y)) / math.sqrt(2.0)


def _block_means(y: np.ndarray, max_points: int) -> tuple[np.ndarray, int]:
    block = max(1, math.ceil(y.size / max_points))
    if block == 1:
        return y, 1
    n = (y.size // block) * block
    head = y[:n].reshape(-1, block).mean(axis=1)
    if n < y.size:
        head = np.append(head, y[n:].mean())
    return head, block


def _hac_lags(n: int) -> int:
    # Newey–West's rule of thumb.
    return max(1, math.floor(4 * (n / 100.0) ** (2.0 / 9.0)))


def _ols_hac(y: np.ndarray, X: np.ndarray, cols: list[int]) -> tuple[float, np.ndarray]:
    """p-value of the joint Wald test that the coefficients ``cols`` are 0 (HAC covariance)."""
    import statsmodels.api as sm

    tss = float(((y - y.mean()) ** 2).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sm.OLS(y, X).fit(cov_type="HAC", cov_kwds={"maxlags": _hac_lags(y.size)})
        beta = np.asarray(res.params)
        ssr = float(res.ssr)
        if tss <= 0 or ssr <= 1e-20 * max(tss, 1e-300):
            # An exact fit: noiseless data (a constant lr that jumps). Any non-zero effect is real.
            nz = np.any(np.abs(beta[cols]) > 1e-12 * (np.abs(beta).max() + 1e-300))
            return (0.0 if nz else 1.0), beta
        cov = np.asarray(res.cov_params())[np.ix_(cols, cols)]
    b = beta[cols]
    try:
        stat = float(b @ np.linalg.solve(cov, b))
    except np.linalg.LinAlgError:
        return 1.0, beta
    if not np.isfinite(stat):
        return 1.0, beta
    return float(stats.chi2.sf(stat, df=len(cols))), beta


def _change_candidates(y: np.ndarray, params: SignatureParams) -> list[int]:
    import ruptures as rpt
    from ruptures.exceptions import BadSegmentationParameters

    n = y.size
    min_size = max(params.min_segment, n // 32)
    n_bkps = min(params.n_candidates, n // min_size - 1)
    if n_bkps < 1:
        return []
    try:
        bkps = rpt.KernelCPD(kernel="linear", min_size=min_size, jump=1).fit(y).predict(n_bkps=n_bkps)
    except BadSegmentationParameters:  # a series too short for that many breakpoints
        return []
    return sorted(int(b) for b in bkps if params.min_segment <= b <= n - params.min_segment)


def _onset_test(y: np.ndarray, b: int) -> float:
    n = y.size
    t = np.arange(n, dtype=np.float64) / n
    step = (np.arange(n) >= b).astype(np.float64)
    hinge = np.maximum(0.0, t - b / n)
    X = np.column_stack([np.ones(n), t, step, hinge])
    p, _ = _ols_hac(y, X, [2, 3])
    return p


def _refine_onset(y: np.ndarray, b: int, params: SignatureParams) -> int:
    """Move a candidate to where a step-plus-hinge model fits best. KernelCPD looks for changes of
    mean, so on a ramp ("jumps and grows") it lands inside the ramp, after the real onset."""
    n = y.size
    lo = max(params.min_segment, b - max(4, n // 6))
    hi = min(n - params.min_segment, b + 2)
    t = np.arange(n, dtype=np.float64) / n
    best, best_ssr = b, math.inf
    for c in range(lo, hi + 1):
        X = np.column_stack([np.ones(n), t, (np.arange(n) >= c), np.maximum(0.0, t - c / n)])
        _, ssr, *_ = np.linalg.lstsq(X, y, rcond=None)
        value = float(ssr[0]) if ssr.size else 0.0
        if value < best_ssr - 1e-12 * abs(best_ssr if math.isfinite(best_ssr) else 0):
            best, best_ssr = c, value
    return best


def _theil_sen(y: np.ndarray, max_points: int = 96) -> float:
    """Theil–Sen slope per point: the median of all pairwise slopes (on at most ``max_points``
    block means; the estimator is robust and the blocks change the slope only by their width)."""
    z, block = _block_means(y, max_points)
    i, j = np.triu_indices(z.size, k=1)
    return float(np.median((z[j] - z[i]) / (j - i))) / block


def _trend_test(y: np.ndarray) -> tuple[float, float, float]:
    """(Theil–Sen slope per point, HAC p-value of the OLS slope, |total change| / noise)."""
    n = y.size
    if n < 4 or np.ptp(y) == 0:
        return 0.0, 1.0, 0.0
    slope = _theil_sen(y)
    t = np.arange(n, dtype=np.float64)
    X = np.column_stack([np.ones(n), t / n])
    p, beta = _ols_hac(y, X, [1])
    resid = y - X @ beta
    noise = max(float(resid.std()), _scale_floor(float(np.median(y))))
    return slope, p, abs(slope * (n - 1)) / noise


def _find_onset(y: np.ndarray, params: SignatureParams) -> tuple[int | None, float]:
    """The onset (index into ``y``) and its raw p-value, or (None, 1.0)."""
    n = y.size
    onset, onset_p = None, 1.0
    if n >= 2 * params.min_segment + 2 and np.ptp(y) > 0:
        noise = noise_scale(y)
        cands = _change_candidates(y, params)
        bounds = [0, *cands, n]
        tested: list[tuple[int, float, float]] = []  # (candidate, p, standardised shift)
        for k, b in enumerate(cands, start=1):
            # Each candidate is tested inside the segment between its neighbours, as binary
            # segmentation does: over the whole run an early candidate would look significant
            # because of a later change.
            lo, hi = bounds[k - 1], bounds[k + 1]
            if b - lo < params.min_segment or hi - b < params.min_segment:
                continue
            pre, post = y[lo:b], y[b:hi]
            shift = abs(float(np.median(post) - np.median(pre)))
            scale = max(_robust_scale(pre), noise, _scale_floor(float(np.median(pre))))
            z = shift / scale
            if z >= params.min_effect:
                tested.append((b, _onset_test(y[lo:hi], b - lo), z))
        significant = [c for c in tested if c[1] < params.alpha]
        if significant:
            # The most prominent change sets the scale; an earlier one is the onset only if it is
            # a sizeable part of it ("jumps, then grows"), not a wobble of the noise before it.
            z_max = max(c[2] for c in significant)
            first = next(c for c in significant if c[2] >= params.prominence * z_max)
            onset, onset_p = first[0], first[1]
        elif tested:
            onset, onset_p = min(tested, key=lambda c: c[1])[:2]
    if onset is not None:
        onset = _refine_onset(y, onset, params)
    return onset, onset_p


#: A non-negative metric whose level moves by at least this many decades is tested on a log
#: scale when the linear test finds no onset; from LOG_PREFERRED_DECADES on, the log-scale onset
#: is used even when the linear test found one (a ×100 change is multiplicative: on a linear
#: scale the onset lands on the largest post-onset excursion, not on the jump).
LOG_MIN_DECADES = 1.0
LOG_PREFERRED_DECADES = 2.0


def _log_values(y: np.ndarray) -> np.ndarray | None:
    """log10 of a non-negative, finite series (zeros at its smallest positive value), else None."""
    if y.size == 0 or not np.all(np.isfinite(y)) or np.any(y < 0):
        return None
    positive = y[y > 0]
    if positive.size == 0 or 2 * positive.size < y.size:
        return None
    return np.log10(np.maximum(y, positive.min()))


def _analyse(series: CanonicalSeries, params: SignatureParams) -> _Raw:
    x = series.values
    y, block = _block_means(x, params.max_test_points)
    onset, onset_p = _find_onset(y, params)
    raw = _levels(x, y, block, onset, onset_p, params)
    linear_weak = onset is None or abs(raw.effect_z) < params.min_effect
    # A rollout/train probability gap that jumps from 1e-8 to 1e-3 and then scatters over two
    # decades: on a linear scale the post-onset spread is the noise and the jump is "1 sigma";
    # on a log scale it is five decades over a spread of a fraction of one.
    wanted = LOG_MIN_DECADES if linear_weak else LOG_PREFERRED_DECADES
    ly = _log_values(y)
    # A shift of medians cannot exceed the series' own range: most metrics never span a decade, and
    # skipping them keeps the second change-point search off the triage hot path.
    if ly is not None and np.ptp(ly) >= wanted:
        lon, lp = _find_onset(ly, params)
        if lon is not None:
            shift = float(np.median(ly[lon:]) - np.median(ly[:lon]))
            log_z = shift / max(_robust_scale(ly[:lon]), noise_scale(ly), 1e-6)
            if abs(shift) >= wanted and abs(log_z) >= params.min_effect:
                raw = _levels(x, y, block, lon, lp, params, effect_z=log_z, trend_of=ly)
    return raw


def _levels(x: np.ndarray, y: np.ndarray, block: int, onset: int | None, onset_p: float,
            params: SignatureParams, effect_z: float | None = None, trend_of: np.ndarray | None = None) -> _Raw:
    """Baseline/post levels, the standardised effect and the post-onset trend for an onset (an
    index into the block means ``y``; None: the first ``baseline_fraction`` is the baseline).
    ``trend_of``: the series the trend is tested on (the log values when the onset was located on a
    log scale: a gap that doubles with the age of stale weights grows on that scale, while its
    linear trend drowns in the scatter)."""
    if onset is not None:
        ob = onset * block
        pre_x = x[:ob]
        post_x = x[ob:]
    else:
        nb = max(params.min_segment, round(params.baseline_fraction * x.size))
        pre_x = x[:nb]
        post_x = x[nb:] if x.size > nb else x[-1:]
    pre_level = float(np.median(pre_x))
    post_level = float(np.median(post_x))
    scale = max(_robust_scale(pre_x), noise_scale(pre_x), noise_scale(y), _scale_floor(pre_level))
    if effect_z is None:
        effect_z = (post_level - pre_level) / scale
    t = y if trend_of is None else trend_of
    seg = t[onset:] if onset is not None else t
    slope, tp, teff = _trend_test(seg)
    return _Raw(None if onset is None else onset * block, onset_p, effect_z, pre_level, post_level,
                scale, slope / block, tp, teff)


def _bh(pvalues: list[float], alpha: float) -> list[float]:
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    p = np.clip(np.nan_to_num(np.asarray(pvalues, dtype=np.float64), nan=1.0), 0.0, 1.0)
    return multipletests(p, alpha=alpha, method="fdr_bh")[1].tolist()


def _sign(v: float) -> Sign:
    return 1 if v > 0 else (-1 if v < 0 else 0)


def _finalise(run: CanonicalRun, series: CanonicalSeries, r: _Raw, onset_p: float, trend_p: float,
              params: SignatureParams) -> MetricSignature:
    onset_ok = r.onset_index is not None and onset_p < params.alpha
    drift = _sign(r.trend_slope) if trend_p < params.alpha else 0
    trend = drift if r.trend_effect >= params.min_effect else 0
    if onset_ok:
        direction = _sign(r.effect_z) if abs(r.effect_z) >= params.min_effect else 0
        onset_index = r.onset_index
    else:
        onset_index = None
        # No onset: the change is the trend over the whole run vs its first fifth.
        direction = trend if abs(r.effect_z) >= params.min_effect else 0
    ratio = None
    if abs(r.pre_level) > 1e-12 and r.pre_level * r.post_level > 0:
        ratio = r.post_level / r.pre_level
    first_nf = series.first_nonfinite_index()
    freeze = _freeze_index(series.values, params.min_segment)
    return MetricSignature(
        name=series.name,
        source=series.source,
        n_points=int(series.values.size),
        onset_index=onset_index,
        onset_step=None if onset_index is None else int(run.steps[onset_index]),
        onset_p=float(onset_p),
        direction=direction,
        effect_z=float(r.effect_z),
        ratio=None if ratio is None else float(ratio),
        baseline_level=r.pre_level,
        baseline_scale=r.scale,
        post_level=r.post_level,
        trend=trend,
        trend_slope=float(r.trend_slope),
        trend_p=float(trend_p),
        first_nonfinite_step=None if first_nf is None else int(run.steps[first_nf]),
        nonfinite_count=int(series.nonfinite.sum()),
        nan_count=series.nan_count,
        posinf_count=series.posinf_count,
        neginf_count=series.neginf_count,
        freeze_index=freeze,
        freeze_step=None if freeze is None else int(run.steps[freeze]),
        freeze_value=None if freeze is None else float(series.values[-1]),
        drift=drift,
    )


def _freeze_index(x: np.ndarray, min_segment: int) -> int | None:
    """First index from which the series is constant to the end (at least ``min_segment`` points),
    when it varied before it."""
    n = x.size
    if n < 2 * min_segment or not np.all(np.isfinite(x)):
        return None
    # "Constant" up to float rounding at the run's own scale: a ppo_kl of ~1e-4 that collapses to 0
    # when the optimizer stops stepping still shows ±1e-9 from fp32 log-prob round-off.
    tol = FREEZE_TOLERANCE * (float(np.abs(x).max()) + 1e-30)
    ref = float(np.median(x[-min_segment:]))
    off = np.abs(x - ref) > tol
    moving = np.flatnonzero(off)
    if moving.size == 0:
        return None  # constant from the start: nothing froze
    i = int(moving[-1]) + 1
    if n - i < min_segment or i < min_segment:
        return None
    # A metric that sits at a bound most of the time (critic/rewards/max at 1.0, pg_clipfrac at
    # 0 on a saturated reward) and happens to end on a run of it has not stopped moving: a
    # freeze is a value the metric rarely took before, as ppo_kl at exactly 0 once updates stop.
    if np.mean(np.abs(x[:i] - ref) <= tol) > FREEZE_MAX_PRIOR_SHARE:
        return None
    return i


#: Relative tolerance (to the largest |value| of the run) within which a frozen metric is constant.
FREEZE_TOLERANCE = 1e-5
#: Largest share of the points before a freeze that may already sit at the frozen value.
FREEZE_MAX_PRIOR_SHARE = 1.0 / 3.0
