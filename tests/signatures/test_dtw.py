import numpy as np
import pytest
from moeproxy.signatures import dtw


@pytest.mark.parametrize("seed", range(5))
def test_fast_path_equals_naive_reference_with_a_band(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=30), rng.normal(size=30)
    for radius in (1, 3, 8):
        assert dtw.dtw_distance(a, b, radius=radius) == pytest.approx(dtw.dtw_reference(a, b, radius=radius))


@pytest.mark.parametrize(("n", "m"), [(20, 26), (26, 20)])
def test_fast_path_equals_naive_reference_on_unequal_lengths(n, m):
    rng = np.random.default_rng(n * m)
    a, b = rng.normal(size=n), rng.normal(size=m)
    assert dtw.dtw_distance(a, b, radius=3) == pytest.approx(dtw.dtw_reference(a, b, radius=3))
    assert dtw.dtw_distance(a, b) == pytest.approx(dtw.dtw_reference(a, b))


def test_wide_band_equals_full_dtw():
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=40), rng.normal(size=40)
    full = dtw.dtw_reference(a, b)
    assert dtw.dtw_distance(a, b, radius=40) == pytest.approx(full)
    assert dtw.dtw_distance(a, b) == pytest.approx(full)
    assert dtw.dtw_distance(a, b, radius=2) >= full  # a narrow band can only cost more


def test_one_to_many_equals_pairwise():
    rng = np.random.default_rng(3)
    q = rng.normal(size=25)
    refs = rng.normal(size=(6, 25))
    got = dtw.one_to_many(q, refs, radius=3)
    want = [dtw.dtw_reference(q, r, radius=3) for r in refs]
    assert got == pytest.approx(want)


def test_shifted_step_is_close_under_dtw_but_not_pointwise():
    a = np.r_[np.zeros(20), np.ones(20)]
    b = np.r_[np.zeros(22), np.ones(18)]
    assert dtw.dtw_distance(a, b, radius=4) == pytest.approx(0.0)
    assert np.linalg.norm(a - b) > 1


def test_znorm():
    z = dtw.znorm(np.array([1.0, 2.0, 3.0]))
    assert z.mean() == pytest.approx(0.0) and z.std() == pytest.approx(1.0)
    assert not dtw.znorm(np.full(5, 3.0)).any()
    assert dtw.is_warm()
