"""A run longer than triage's grid is read binned by the database (metrics.read_binned), on SQLite
and PostgreSQL: what triage and the run page get must be what binning the whole run gives."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from moeproxy.signatures.canonical import MAX_GRID_POINTS, MetricSeries, RunMetrics, bin_run, canonicalise
from moeproxy.signatures.synthetic import synthetic_run
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES
from ui_helpers import ingest_body


def _post_chunks(ui_client, auth, run_id: int, run: RunMetrics, chunk: int = 1500) -> None:
    last = run.last_step or 0
    for start in range(0, last + 1, chunk):
        body = ingest_body(run, start=start, stop=start + chunk)
        response = ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth())
        assert response.status_code == 200, response.text


def _create(ui_client, auth, name: str) -> int:
    created = ui_client.post("/api/v1/runs", json={"name": name, "framework": "verl"}, headers=auth())
    assert created.status_code in (200, 201), created.text
    return created.json()["id"]


def _assert_same_bins(got, want) -> None:
    np.testing.assert_array_equal(got.grid, want.grid)
    assert set(got.series) == set(want.series)
    for name, w in want.series.items():
        g = got.series[name]
        for field in ("bins", "finite_count", "nan", "posinf", "neginf"):
            np.testing.assert_array_equal(getattr(g, field), getattr(w, field), err_msg=f"{name}.{field}")
        assert g.last_step == w.last_step
        # The database adds a bin's values in its own order: equal up to rounding.
        np.testing.assert_allclose(g.finite_sum, w.finite_sum, rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(g.lowest, w.lowest, err_msg=name)
        np.testing.assert_array_equal(g.highest, w.highest, err_msg=name)


def _messy_run(n: int, *, start: int = 0, every: int = 1) -> RunMetrics:
    """Metrics with NaN, +-inf, gaps, a late start and a bin with no finite value."""
    rng = np.random.default_rng(11)
    steps = np.arange(start, start + n * every, every, dtype=np.int64)
    noisy = rng.normal(size=n)
    noisy[rng.choice(n, 30, replace=False)] = np.nan
    noisy[rng.choice(n, 5, replace=False)] = np.inf
    noisy[rng.choice(n, 5, replace=False)] = -np.inf
    noisy[:12] = np.nan  # the first bins (at 8 points per bin and more) hold no finite value
    keep = rng.random(n) > 0.3
    late = steps >= steps[n // 3]
    return RunMetrics(
        {
            "actor/grad_norm": MetricSeries(steps, noisy),
            "actor/entropy": MetricSeries(steps[keep], rng.normal(size=int(keep.sum()))),
            "critic/score/mean": MetricSeries(steps[late], np.linspace(0, 1, int(late.sum()))),
        },
        framework="verl",
    )


@pytest.mark.parametrize(("start", "every"), [(0, 1), (7, 3)], ids=["contiguous", "stride-3-from-7"])
def test_the_database_bins_a_long_run_as_python_bins_it_whole(ui_client, auth, database, start, every):
    from moeproxy.service.metrics import repository

    assert 800 > repository.WHOLE_READ_FACTOR * 100  # the database's path
    run = _messy_run(800, start=start, every=every)
    run_id = _create(ui_client, auth, f"messy-{start}-{every}")
    _post_chunks(ui_client, auth, run_id, run)
    with database.scope() as s:
        in_database = repository.read_binned(s, run_id, max_points=100)
        arrays = repository.read_metric_arrays(s, run_id)
    whole = RunMetrics({m: MetricSeries(st, v) for m, (st, v) in arrays.items()})
    want = bin_run(whole, max_points=100, extremes=True)
    assert want.grid.size <= 100 and want.grid[1] - want.grid[0] == 8 * every  # binned, not read whole
    _assert_same_bins(in_database, want)


def test_a_short_run_is_read_whole_with_one_point_per_bin(ui_client, auth, database):
    from moeproxy.service.metrics import repository

    run = _messy_run(90)
    run_id = _create(ui_client, auth, "short")
    _post_chunks(ui_client, auth, run_id, run)
    with database.scope() as s:
        got = repository.read_binned(s, run_id)
    assert got.grid.size == 90 and all((b.finite_count + b.nan + b.posinf + b.neginf == 1).all() for b in got.series.values())
    _assert_same_bins(got, bin_run(run, extremes=True))


def test_triage_of_a_run_longer_than_its_grid_matches_triage_of_the_whole_run(
    ui_client, auth, fingerprint_library, monkeypatch
):
    from moeproxy.service.metrics import repository
    from moeproxy.service.triage.engine import SignatureEngine

    monkeypatch.setattr(repository, "WHOLE_READ_FACTOR", 1)  # binned by the database from 4,097 points
    steps = 2 * MAX_GRID_POINTS + 500  # 3 steps per bin
    run = synthetic_run("gradient_overflow", steps=steps, onset=steps // 2, seed=131)
    run_id = _create(ui_client, auth, "long-overflow")
    _post_chunks(ui_client, auth, run_id, run)

    body = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    whole = SignatureEngine(fingerprint_library).evaluate(
        bin_run(run), run_id=run_id, framework="verl", aliases=DEFAULT_ALIASES, now=datetime.now(UTC)
    )
    assert [c["fault_class"] for c in body["candidates"]] == [c.fault_class for c in whole.candidates]
    assert [c["score"] for c in body["candidates"]] == pytest.approx([c.score for c in whole.candidates], abs=1e-9)
    assert body["candidates"][0]["fault_class"] == "gradient_overflow"
    assert body["last_step"] == steps - 1
    assert canonicalise(run).n_steps == len(range(0, steps, 3))

    page = ui_client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and 'data-fault-class="gradient_overflow"' in page.text


def test_points_ingested_while_a_run_is_read_binned_stay_off_the_grid(ui_client, auth, database, monkeypatch):
    """Live triage reads a run while it is written: each statement of the read sees what is
    committed when it starts, so points (and metrics) that arrive after the run's extents were read
    must not land in bins past the grid (the first soak with binned reads failed on that)."""
    from moeproxy.service.metrics import repository
    from moeproxy.service.metrics.models import MetricName, MetricPoint
    from sqlalchemy import insert

    run = _messy_run(800)
    run_id = _create(ui_client, auth, "growing")
    _post_chunks(ui_client, auth, run_id, run)
    with database.scope() as s:
        want = bin_run(RunMetrics({m: MetricSeries(st, v) for m, (st, v) in repository.read_metric_arrays(s, run_id).items()}),
                       max_points=100, extremes=True)
    step_gcd = repository._step_gcd

    def ingest_meanwhile(session, *args):
        grad = session.scalar(select_id(MetricName, run_id, "actor/grad_norm"))
        new = session.scalar(insert(MetricName).values(run_id=run_id, name="late/metric").returning(MetricName.id))
        session.execute(insert(MetricPoint), [{"metric_id": grad, "step": 800 + k, "value": 1.0} for k in range(50)]
                        + [{"metric_id": new, "step": k, "value": 2.0} for k in range(900)])
        return step_gcd(session, *args)

    monkeypatch.setattr(repository, "_step_gcd", ingest_meanwhile)
    monkeypatch.setattr(repository, "WHOLE_READ_FACTOR", 1)
    with database.scope() as s:
        got = repository.read_binned(s, run_id, max_points=100)
        s.rollback()
    _assert_same_bins(got, want)


def select_id(model, run_id: int, name: str):
    from sqlalchemy import select

    return select(model.id).where(model.run_id == run_id, model.name == name)
