"""Metric ingestion and reads over HTTP on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import random

import pytest


@pytest.fixture
def run(client, auth):
    return client.post("/api/v1/runs", json={"name": "run", "framework": "verl"}, headers=auth()).json()


def _post(client, auth, run_id, body, project="test-project"):
    if isinstance(body, (dict, list)):
        return client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth(project))
    return client.post(
        f"/api/v1/runs/{run_id}/metrics",
        content=body,
        headers={**auth(project), "Content-Type": "application/json"},
    )


def _read(client, auth, run_id, query=""):
    response = client.get(f"/api/v1/runs/{run_id}/metrics{query}", headers=auth())
    assert response.status_code == 200, response.text
    return response.json()["metrics"]


def _count_points(database) -> int:
    from moeproxy.service.metrics.models import MetricPoint
    from sqlalchemy import func, select

    with database.scope() as s:
        return s.scalar(select(func.count()).select_from(MetricPoint))


def test_round_trip_against_a_naive_reference(client, auth, run):
    rng = random.Random(7)
    names = [f"actor/m{i}" for i in range(7)]
    reference: dict[str, dict[int, float]] = {n: {} for n in names}
    for batch in range(4):
        steps = []
        for step in range(batch * 30, batch * 30 + 30):
            values = {n: rng.uniform(-5, 5) for n in rng.sample(names, rng.randint(1, len(names)))}
            for n, v in values.items():
                reference[n][step] = v
            steps.append({"step": step, "values": values})
        response = _post(client, auth, run["id"], {"steps": steps})
        assert response.status_code == 200
        assert response.json()["accepted"] == sum(len(s["values"]) for s in steps)
    got = _read(client, auth, run["id"])
    assert set(got) == {n for n in names if reference[n]}
    for n, series in got.items():
        assert series["steps"] == sorted(reference[n])
        assert series["values"] == [reference[n][s] for s in sorted(reference[n])]


def test_resend_is_idempotent_and_last_value_wins(client, auth, run, database):
    body = {"steps": [{"step": s, "values": {"a": float(s), "b": 1.0}} for s in range(50)]}
    assert _post(client, auth, run["id"], body).json() == {"accepted": 100}
    assert _post(client, auth, run["id"], body).json() == {"accepted": 100}
    assert _count_points(database) == 100
    # Overlapping re-send with new values: overwritten, still no duplicates.
    again = {"steps": [{"step": s, "values": {"a": -float(s)}} for s in range(40, 60)]}
    assert _post(client, auth, run["id"], again).status_code == 200
    assert _count_points(database) == 110
    got = _read(client, auth, run["id"])
    assert got["a"]["steps"] == list(range(60))
    assert got["a"]["values"] == [float(s) for s in range(40)] + [-float(s) for s in range(40, 60)]
    assert got["b"]["steps"] == list(range(50))


def test_mixed_new_and_existing_points_in_one_batch(client, auth, run, database):
    """The PostgreSQL fast path (COPY) falls back to the upsert when any point exists."""
    _post(client, auth, run["id"], {"steps": [{"step": 5, "values": {"a": 1.0}}]})
    _post(client, auth, run["id"], {"steps": [{"step": s, "values": {"a": 2.0, "c": 3.0}} for s in range(10)]})
    got = _read(client, auth, run["id"])
    assert got["a"]["values"] == [2.0] * 10 and got["c"]["steps"] == list(range(10))
    assert _count_points(database) == 20


def test_same_step_twice_in_one_request_merges_last_wins(client, auth, run):
    body = {"steps": [{"step": 3, "values": {"a": 1, "b": 2}}, {"step": 3, "values": {"a": 9}}]}
    assert _post(client, auth, run["id"], body).json() == {"accepted": 2}
    got = _read(client, auth, run["id"])
    assert got["a"] == {"steps": [3], "values": [9.0]} and got["b"] == {"steps": [3], "values": [2.0]}


def test_nonfinite_round_trip_literals_and_strings(client, auth, run):
    raw = (
        '{"steps": [{"step": 0, "values": {"nan": NaN, "inf": Infinity, "ninf": -Infinity, "x": 1e308}},'
        ' {"step": 1, "values": {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "x": -0.0}},'
        ' {"step": 2, "values": {"nan": 0.5, "inf": 1e400, "ninf": -1e400, "x": 5e-324}}]}'
    )
    response = _post(client, auth, run["id"], raw)
    assert response.status_code == 200, response.text
    got = _read(client, auth, run["id"])
    assert got["nan"]["values"] == ["NaN", "NaN", 0.5]
    assert got["inf"]["values"] == ["Infinity", "Infinity", "Infinity"]
    assert got["ninf"]["values"] == ["-Infinity", "-Infinity", "-Infinity"]
    assert got["x"]["values"] == [1e308, -0.0, 5e-324]
    # The response is strict JSON (no NaN literals).
    text = client.get(f"/api/v1/runs/{run['id']}/metrics", headers=auth()).text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c} in response"))


def test_nonfinite_values_come_back_as_floats_from_the_repository(client, auth, run, database):
    from moeproxy.service.metrics import repository

    _post(client, auth, run["id"], '{"steps": [{"step": 0, "values": {"a": NaN, "b": Infinity, "c": -Infinity}}]}')
    with database.scope() as s:
        arrays = repository.read_metric_arrays(s, run["id"])
    assert math.isnan(arrays["a"][1][0]) and arrays["b"][1][0] == math.inf and arrays["c"][1][0] == -math.inf
    assert arrays["a"][0].dtype.name == "int64" and arrays["a"][1].dtype.name == "float64"


def test_filters_names_and_after_step(client, auth, run):
    _post(client, auth, run["id"], {"steps": [{"step": s, "values": {"a/x": s, "b": s, "c": s}} for s in range(10)]})
    got = _read(client, auth, run["id"], "?names=a/x,c&after_step=6")
    assert set(got) == {"a/x", "c"}
    assert got["c"]["steps"] == [7, 8, 9]
    got = _read(client, auth, run["id"], "?names=b&names=c")
    assert set(got) == {"b", "c"}
    assert _read(client, auth, run["id"], "?names=unknown") == {}


@pytest.mark.parametrize(
    "body, fragment",
    [
        ('{"steps": [{"step": 0, "values": {"a": "abc"}}]}', "got the string"),
        ('{"steps": [{"step": 0, "values": {"a": true}}]}', "a boolean"),
        ('{"steps": [{"step": 0, "values": {"a": null}}]}', "null"),
        ('{"steps": [{"step": 0, "values": {"a": [1]}}]}', "an array"),
        ('{"steps": [{"step": 0, "values": {"a": {"v": 1}}}]}', "an object"),
        ('{"steps": [{"step": -1, "values": {"a": 1}}]}', "must be >= 0"),
        ('{"steps": [{"step": 1.5, "values": {"a": 1}}]}', "non-negative integer"),
        ('{"steps": [{"step": "3", "values": {"a": 1}}]}', "non-negative integer"),
        # The fast parser reads an integer past 64 bits as a float, the stdlib one as an int.
        ('{"steps": [{"step": 99999999999999999999, "values": {"a": 1}}]}', "64 bits|non-negative integer"),
        ('{"steps": [{"step": 0, "values": {"": 1}}]}', "must not be empty"),
        ('{"steps": [{"step": 0, "values": {"   ": 1}}]}', "must not be empty"),
        ('{"steps": [{"step": 0, "values": {"' + "x" * 513 + '": 1}}]}', "longer than 512"),
        ('{"steps": [{"step": 0, "values": [1, 2]}]}', "expected an object"),
        ('{"steps": [{"step": 0}]}', "missing field"),
        ('{"steps": [{"step": 0, "values": {}, "extra": 1}]}', "unknown field"),
        ('{"steps": [5]}', "expected an object"),
        ('{"steps": {}}', "expected an array"),
        ('{"points": []}', "body must be"),
        ('{"steps": [], "extra": 1}', "unknown field"),
        ("[]", "body must be"),
        ('{"steps": [', "not valid JSON"),
        (b'\xff\xfe{"steps": []}', "not"),
        ('{"steps": [{"step": 0, "values": {"a": 1}}, {"step": 1, "values": {"a": "oops"}}]}', "steps[1]"),
    ],
)
def test_bad_input_is_422_and_leaves_data_untouched(client, auth, run, database, body, fragment):
    _post(client, auth, run["id"], {"steps": [{"step": 0, "values": {"a": 42.0}}]})
    response = _post(client, auth, run["id"], body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and any(f in detail for f in fragment.split("|")), detail
    assert _read(client, auth, run["id"]) == {"a": {"steps": [0], "values": [42.0]}}
    assert _count_points(database) == 1


def test_unknown_run_is_404(client, auth):
    response = _post(client, auth, 424242, {"steps": [{"step": 0, "values": {"a": 1}}]})
    assert response.status_code == 404 and response.json()["detail"] == "run 424242 not found"


def test_wrong_content_type_is_415(client, auth, run):
    response = client.post(
        f"/api/v1/runs/{run['id']}/metrics", content=b"step=1", headers={**auth(), "Content-Type": "text/plain"}
    )
    assert response.status_code == 415 and "application/json" in response.json()["detail"]


def test_too_many_steps_is_413(client, auth, run, database):
    body = {"steps": [{"step": s, "values": {}} for s in range(10_001)]}
    response = _post(client, auth, run["id"], body)
    assert response.status_code == 413
    assert "10,000" in response.json()["detail"]
    ok = {"steps": [{"step": s, "values": {"a": 1}} for s in range(10_000)]}
    assert _post(client, auth, run["id"], ok).json() == {"accepted": 10_000}


def test_too_many_points_is_413(client, auth, run, database, monkeypatch):
    from moeproxy.service.metrics import codec

    assert codec.MAX_POINTS_PER_REQUEST == 1_000_000  # SPEC section 5
    monkeypatch.setattr(codec, "MAX_POINTS_PER_REQUEST", 100)
    body = {"steps": [{"step": s, "values": {f"m{i}": i for i in range(11)}} for s in range(10)]}
    response = _post(client, auth, run["id"], body)
    assert response.status_code == 413 and "100" in response.json()["detail"]
    assert _count_points(database) == 0


def test_oversize_body_is_413_declared_and_streamed(client, auth, run, database, monkeypatch):
    from moeproxy.service.metrics import codec

    monkeypatch.setattr(codec, "MAX_BODY_BYTES", 1000)
    body = json.dumps({"steps": [{"step": s, "values": {"a": s}} for s in range(100)]}).encode()
    assert len(body) > 1000
    declared = _post(client, auth, run["id"], body)
    assert declared.status_code == 413 and "limit" in declared.json()["detail"]

    def chunks():  # no Content-Length: the guard must count while reading
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    streamed = client.post(
        f"/api/v1/runs/{run['id']}/metrics", content=chunks(), headers={**auth(), "Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert _count_points(database) == 0


def test_metric_names_with_canonical(client, auth, run):
    _post(client, auth, run["id"], {"steps": [{"step": 0, "values": {"actor/ppo_kl": 1, "critic/score/mean": 2, "custom/x": 3}}]})
    names = client.get(f"/api/v1/runs/{run['id']}/metrics/names", headers=auth()).json()["names"]
    assert {n["name"]: n["canonical"] for n in names} == {
        "actor/ppo_kl": "ppo_kl",
        "critic/score/mean": "reward_mean",
        "custom/x": "custom/x",
    }
    assert {n["name"]: (n["points"], n["last_step"]) for n in names} == {
        "actor/ppo_kl": (1, 0), "critic/score/mean": (1, 0), "custom/x": (1, 0)}
    _post(client, auth, run["id"], {"steps": [{"step": 5, "values": {"custom/x": 4}}, {"step": 0, "values": {"custom/x": 5}}]})
    names = client.get(f"/api/v1/runs/{run['id']}/metrics/names", headers=auth()).json()["names"]
    assert {n["name"]: (n["points"], n["last_step"]) for n in names}["custom/x"] == (2, 5)  # step 0 overwritten


def test_ingest_event_fires_after_commit_only(client, auth, run):
    from moeproxy.service import events

    seen: list[events.MetricsIngested] = []
    callback = events.on_metrics_ingested(seen.append)
    try:
        _post(client, auth, run["id"], {"steps": [{"step": s, "values": {"a": 1, "b": 2}} for s in (4, 2, 9)]})
        _post(client, auth, run["id"], {"steps": [{"step": -1, "values": {"a": 1}}]})  # rejected: no event
        events.drain()
    finally:
        events.remove_callback(callback)
    assert len(seen) == 1
    event = seen[0]
    assert (event.run_id, event.first_step, event.last_step, event.points) == (run["id"], 2, 9, 6)
    assert set(event.names) == {"a", "b"}


def test_failing_event_callback_does_not_break_ingest(client, auth, run):
    from moeproxy.service import events

    def broken(_event):
        raise RuntimeError("subscriber bug")

    events.on_metrics_ingested(broken)
    try:
        response = _post(client, auth, run["id"], {"steps": [{"step": 0, "values": {"a": 1}}]})
        events.drain()
    finally:
        events.remove_callback(broken)
    assert response.status_code == 200


def test_numpy_copy_stream_matches_psycopg_write_row(backend, engine):
    """The hand-built binary COPY stream against psycopg's own per-row writer (random rows)."""
    if backend != "postgres":
        pytest.skip("binary COPY is the PostgreSQL path")
    from moeproxy.service.metrics.repository import copy_payload

    rng = random.Random(3)
    n = 500
    ids = [rng.randint(1, 2**31 - 1) for _ in range(n)]
    steps = [rng.randint(0, 2**63 - 1) for _ in range(n)]
    values = [rng.choice([rng.uniform(-1e6, 1e6), math.nan, math.inf, -math.inf, -0.0, 5e-324]) for _ in range(n)]
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("CREATE TEMP TABLE fast (i int4, s int8, v float8); CREATE TEMP TABLE naive (i int4, s int8, v float8)")
        with cur.copy("COPY fast FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(copy_payload(ids, steps, values))
        with cur.copy("COPY naive FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "int8", "float8"])
            for row in zip(ids, steps, values):
                copy.write_row(row)
        cur.execute("SELECT i, s, v::text FROM fast ORDER BY i, s")
        fast = cur.fetchall()
        cur.execute("SELECT i, s, v::text FROM naive ORDER BY i, s")
        assert fast == cur.fetchall() and len(fast) == n
    finally:
        raw.rollback()
        raw.close()


def test_fast_json_decoding_matches_the_stdlib_parser():
    """decode_json (orjson with a stdlib fallback) against json.loads on random ingest bodies."""
    from moeproxy.service.metrics.codec import decode_json

    rng = random.Random(11)
    specials = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-0.0", "5e-324", "12345678901234567"]
    for _ in range(200):
        parts = []
        for step in range(rng.randint(0, 5)):
            vals = ", ".join(
                f'"m{i}": {rng.choice(specials) if rng.random() < 0.2 else repr(rng.uniform(-1e9, 1e9))}'
                for i in range(rng.randint(0, 4))
            )
            parts.append(f'{{"step": {step}, "values": {{{vals}}}}}')
        raw = ('{"steps": [' + ", ".join(parts) + "]}").encode()
        fast, slow = decode_json(raw), json.loads(raw)
        assert json.dumps(fast, sort_keys=True) == json.dumps(slow, sort_keys=True)
