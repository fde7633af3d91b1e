"""Jobs created automatically through the real path: REST ingest -> live triage -> stored evaluation.

The library (tests/ui/conftest.py) has no fingerprint of ``actor_update_omission``: its runs get a
weak verdict, which is what starts a reproduction.  ``rollout_logp_precision`` is in the library
and matches strongly.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.tokens import repository as tokens
from moeproxy.signatures.synthetic import synthetic_run
from ui_helpers import ingest_body
from waiting import wait_for

from moeproxy.config import Settings

WEAK, STRONG = "actor_update_omission", "rollout_logp_precision"
MODEL = "/models/qwen3-moe-tiny"


@pytest.fixture
def live(fresh_database_url, fingerprint_library):
    """A client on the real app with live triage on (every poke evaluated at once) and its headers."""
    db = Database(fresh_database_url)
    settings = Settings(database_url=db.url, fingerprints=fingerprint_library, triage_interval_s=0)
    app = create_app(settings, database=db)
    with db.scope() as s:
        _row, token = tokens.create_token(s, "loop")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client, app.state.live_triage
    db.dispose()


def _post_run(client, name, *, model_uri=MODEL):
    body = {"name": name, "framework": "verl", **({"model_uri": model_uri} if model_uri else {})}
    return client.post("/api/v1/runs", json=body).json()["id"]


def _ingest(client, live, run_id, run, start, stop):
    before = live.evaluations
    response = client.post(f"/api/v1/runs/{run_id}/metrics", json=ingest_body(run, start=start, stop=stop))
    assert response.status_code == 200, response.text
    wait_for(lambda: live.evaluations > before and live.idle(), what=f"an evaluation of run {run_id}")


def _jobs(client, run_id):
    return client.get(f"/api/v1/jobs?run_id={run_id}").json()["jobs"]


def _top(client, run_id):
    return client.get(f"/api/v1/runs/{run_id}/triage").json()["candidates"][0]


def test_a_run_weak_for_two_evaluations_gets_one_job(live):
    client, triage = live
    run = synthetic_run(WEAK, steps=80, onset=30, seed=7)
    run_id = _post_run(client, "weak")
    _ingest(client, triage, run_id, run, 0, 40)
    assert _top(client, run_id)["strength"] == "weak"
    assert _jobs(client, run_id) == []  # one weak evaluation is not enough
    _ingest(client, triage, run_id, run, 40, 80)
    assert _top(client, run_id)["strength"] == "weak"
    [job] = _jobs(client, run_id)
    assert job["state"] == "queued" and job["trigger"] == "weak_twice" and job["model_uri"] == MODEL
    assert WEAK in job["classes"] and "healthy" not in job["classes"]
    ranked = {c["fault_class"] for c in client.get(f"/api/v1/runs/{run_id}/triage").json()["candidates"]}
    assert WEAK not in ranked  # the library has no fingerprint of it: a candidate all the same
    _ingest(client, triage, run_id, run, 70, 80)  # still weak: no second job
    assert [j["id"] for j in _jobs(client, run_id)] == [job["id"]]


def test_strong_short_and_unregistered_runs_get_no_job(live):
    client, triage = live
    strong = _post_run(client, "strong")
    short = _post_run(client, "short")
    no_model = _post_run(client, "no-model", model_uri=None)
    for run_id, run in (
        (strong, synthetic_run(STRONG, steps=80, onset=30, seed=8)),
        (short, synthetic_run(WEAK, steps=20, onset=10, seed=9)),  # under MOEPROXY_JOB_MIN_STEPS
        (no_model, synthetic_run(WEAK, steps=80, onset=30, seed=10)),
    ):
        stop = max(s["step"] for s in run.to_steps()) + 1
        _ingest(client, triage, run_id, run, 0, stop // 2)
        _ingest(client, triage, run_id, run, stop // 2, stop)
    assert _top(client, strong)["strength"] == "strong" and _top(client, short)["strength"] == "weak"
    assert client.get("/api/v1/jobs").json()["total"] == 0
    # Registering the model later: the next weak evaluation starts the job.
    client.patch(f"/api/v1/runs/{no_model}", json={"model_uri": MODEL})
    _ingest(client, triage, no_model, synthetic_run(WEAK, steps=80, onset=30, seed=10), 79, 80)
    assert [j["trigger"] for j in _jobs(client, no_model)] == ["weak_twice"]


def test_a_run_that_ends_weak_gets_a_job(live):
    client, triage = live
    run = synthetic_run(WEAK, steps=40, onset=20, seed=11)
    # Ended after its one weak evaluation: the status change starts the job.
    ended = _post_run(client, "ended-after")
    _ingest(client, triage, ended, run, 0, 40)
    assert _jobs(client, ended) == []
    assert client.patch(f"/api/v1/runs/{ended}", json={"status": "finished"}).status_code == 200
    assert [j["trigger"] for j in _jobs(client, ended)] == ["ended_weak"]
    # Ended before its last metrics were evaluated: that evaluation starts it.
    late = _post_run(client, "ended-before")
    client.patch(f"/api/v1/runs/{late}", json={"status": "failed"})
    assert _jobs(client, late) == []
    _ingest(client, triage, late, run, 0, 40)
    assert [j["trigger"] for j in _jobs(client, late)] == ["ended_weak"]


def test_automatic_jobs_respect_the_project_cap(live):
    client, triage = live
    ids = [_post_run(client, f"weak-{i}") for i in range(3)]
    for i, run_id in enumerate(ids):
        run = synthetic_run(WEAK, steps=60, onset=30, seed=20 + i)
        _ingest(client, triage, run_id, run, 0, 40)
        _ingest(client, triage, run_id, run, 40, 60)
    assert [len(_jobs(client, r)) for r in ids] == [1, 1, 0]  # MOEPROXY_JOB_MAX_OPEN_PER_PROJECT=2
    assert client.get(f"/api/v1/runs/{ids[2]}/triage").status_code == 200  # its evaluation was stored
