import numpy as np
import pytest
from moeproxy.signatures.canonical import RunMetrics, canonicalise
from moeproxy.signatures.features import run_signature


def _ar(seed: int, n: int, phi: float = 0.6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=n)
    x = np.zeros(n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def _sig(arrays, **kw):
    return run_signature(canonicalise(RunMetrics.from_arrays(arrays, **kw)))


@pytest.mark.parametrize(("n", "onset"), [(60, 20), (100, 41), (400, 150), (2000, 1200)])
def test_step_change_is_found_at_its_step(n, onset):
    x = 0.01 + 0.001 * _ar(n, n)
    x[onset:] += 0.02
    m = _sig({"x": x}).metrics["x"]
    tol = max(1, n // 256)  # long runs are tested on block means
    assert abs(m.onset_step - onset) <= tol
    assert m.direction == 1 and m.ratio == pytest.approx(3.0, rel=0.15)


def test_onset_on_a_non_unit_step_grid():
    x = np.r_[np.zeros(30), np.full(30, 5.0)] + 0.1 * _ar(1, 60)
    m = _sig({"x": x}, steps=range(0, 600, 10)).metrics["x"]
    assert m.onset_step == 300


def test_jump_then_growth_onset_is_the_jump():
    n, onset = 80, 30
    x = 0.01 + 0.0005 * _ar(2, n)
    x[onset:] += 0.01 + 0.002 * np.arange(n - onset)
    m = _sig({"x": x}).metrics["x"]
    assert abs(m.onset_step - onset) <= 1
    assert m.direction == 1 and m.trend == 1


@pytest.mark.parametrize(("slope", "sign"), [(0.02, 1), (-0.02, -1)])
def test_trend_sign(slope, sign):
    n = 80
    x = 1.0 + slope * np.arange(n) + 0.05 * _ar(4, n)
    m = _sig({"x": x}).metrics["x"]
    assert m.trend == sign and m.direction == sign
    assert np.sign(m.trend_slope) == sign


def test_a_slow_significant_rise_drifts_without_a_gated_trend():
    # A small-batch GRPO reward: it rises steadily by about two noise widths over the run, far
    # below the effect-size gate of ``trend`` but beyond any doubt.
    n = 120
    rng = np.random.default_rng(7)
    x = 0.5 + (0.5 / (n - 1)) * np.arange(n) + 0.25 * rng.normal(size=n)
    m = _sig({"x": x}).metrics["x"]
    assert m.trend_p < 1e-3
    assert m.drift == 1 and m.trend == 0


def test_noise_does_not_drift():
    m = _sig({"x": 0.5 + 0.25 * np.random.default_rng(8).normal(size=120)}).metrics["x"]
    assert m.drift == 0


def test_falling_step():
    x = np.r_[np.full(30, 0.99), np.full(30, 0.9)] + 0.001 * _ar(5, 60)
    m = _sig({"x": x}).metrics["x"]
    assert m.direction == -1 and abs(m.onset_step - 30) <= 1


def test_noisy_healthy_run_does_not_light_up_twelve_metrics():
    # Twelve flat, strongly autocorrelated metrics: BH across metrics and HAC errors keep the
    # false changes down.
    arrays = {f"m{i}": 1.0 + 0.1 * _ar(100 + i, 200, phi=0.8) for i in range(12)}
    sig = _sig(arrays)
    changed = [m for m in sig.metrics.values() if m.direction != 0]
    assert len(changed) <= 1


def test_constant_metric_and_noiseless_jump():
    n = 40
    lr_flat = np.full(n, 1e-6)
    lr_jump = np.r_[np.full(15, 1e-6), np.full(n - 15, 1e-4)]
    sig = _sig({"flat": lr_flat, "jump": lr_jump})
    assert sig.metrics["flat"].direction == 0 and sig.metrics["flat"].onset_step is None
    assert sig.metrics["jump"].onset_step == 15 and sig.metrics["jump"].ratio == pytest.approx(100.0)


def test_nonfinite_events_are_reported():
    x = 1.0 + 0.1 * _ar(6, 40)
    x[25] = np.nan
    x[30:33] = np.inf
    m = _sig({"actor/grad_norm": x}, framework="verl").metrics["grad_norm"]
    assert m.first_nonfinite_step == 25 and m.nonfinite_count == 4
    assert (m.nan_count, m.posinf_count) == (1, 3)


def test_effect_trace_is_aligned_on_the_onset_and_padded_on_short_prefixes():
    x = np.r_[np.zeros(5), np.ones(20)] + 0.01 * _ar(7, 25)
    sig = _sig({"x": x})
    t = sig.effect_trace("x", 5, pre=8, post=10)
    assert t.size == 18
    assert abs(t[:8]).max() < abs(t[8:]).min()


def test_short_and_partial_runs_do_not_fail():
    for n in (1, 2, 5, 9):
        sig = _sig({"x": np.arange(float(n))})
        assert sig.metrics["x"].n_points == n


def test_a_jump_of_decades_in_a_scattered_positive_metric_is_an_onset():
    """A rollout/train probability gap jumps from ~1e-8 to ~1e-3 and then scatters over two
    decades: on a linear scale its post-onset spread swamps the jump; on a log scale it is the
    change of the run."""
    rng = np.random.default_rng(7)
    pre = np.abs(rng.normal(2e-8, 2e-8, size=12))
    post = 10 ** rng.uniform(-4.5, -2.0, size=16)
    sig = _sig({"x": np.concatenate([pre, post])})
    m = sig.metrics["x"]
    assert m.direction == 1 and m.onset_index == 12 and m.ratio > 1e3
    flat = _sig({"x": np.abs(rng.normal(2e-8, 2e-8, size=28))})  # noise over decades, no change
    assert flat.metrics["x"].direction == 0


def test_a_freeze_tolerates_float_round_off_but_not_real_variation():
    rng = np.random.default_rng(5)
    kl = rng.normal(0, 1e-3, size=30)
    kl[12:] = 0.0
    kl[[17, 22, 26]] = [1.2e-9, -2e-9, 1e-9]  # fp32 round-off of log-probs that no longer move
    assert _sig({"x": kl}).metrics["x"].freeze_index == 12
    healthy = rng.normal(0, 1e-3, size=30)
    assert _sig({"x": healthy}).metrics["x"].freeze_index is None


def test_a_metric_at_its_bound_that_ends_on_a_run_of_it_has_not_frozen():
    """critic/rewards/max sits at 1.0 most of the time on a saturated reward, with a few dips; the
    last steps at 1.0 are no freeze. ppo_kl at exactly 0 after moving every step before is one."""
    rng = np.random.default_rng(9)
    reward_max = np.ones(40)
    reward_max[[3, 9, 17, 25, 31]] = rng.uniform(0.5, 0.9, size=5)
    assert _sig({"x": reward_max}).metrics["x"].freeze_index is None
    kl = rng.normal(0, 1e-3, size=40)
    kl[31:] = 0.0
    assert _sig({"x": kl}).metrics["x"].freeze_index == 31


def test_a_log_located_metric_gets_its_trend_on_the_log_scale():
    """A gap that jumps by decades and then keeps doubling (stale rollout weights growing older)
    rises on a log scale; one that jumps and scatters around a level (operator noise) does not."""
    rng = np.random.default_rng(11)
    pre = np.abs(rng.normal(2e-8, 2e-8, size=10))
    growing = 10 ** (-4.0 + 0.12 * np.arange(20) + rng.normal(0, 0.25, size=20))
    level = 10 ** (-3.0 + rng.normal(0, 0.25, size=20))
    up = _sig({"x": np.concatenate([pre, growing])}).metrics["x"]
    flat = _sig({"x": np.concatenate([pre, level])}).metrics["x"]
    assert up.direction == 1 and up.trend == 1
    assert flat.direction == 1 and flat.trend == 0
