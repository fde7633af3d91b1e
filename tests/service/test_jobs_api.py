"""The jobs API over HTTP on SQLite and PostgreSQL: model_uri on runs, create with its refusals,
list and page, read, cancel; and migration 0007 down and up again."""

from __future__ import annotations

import pytest
from moeproxy.reproduction.catalogue import FAULT_CLASSES


def _run(client, h, name="r", model_uri="/models/qwen3-30b-a3b"):
    body = {"name": name} if model_uri is None else {"name": name, "model_uri": model_uri}
    response = client.post("/api/v1/runs", json=body, headers=h)
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_runs_take_a_model_uri_at_creation_and_later(client, auth):
    h = auth()
    run = _run(client, h, "with-uri")
    assert run["model_uri"] == "/models/qwen3-30b-a3b"
    bare = _run(client, h, "bare", model_uri=None)
    assert bare["model_uri"] is None
    resumed = client.post("/api/v1/runs", json={"name": "bare", "model_uri": "s3://ckpt/step-100"}, headers=h)
    assert resumed.status_code == 200 and resumed.json()["model_uri"] == "s3://ckpt/step-100"  # filled in
    patched = client.patch(f"/api/v1/runs/{bare['id']}", json={"model_uri": "s3://ckpt/step-200"}, headers=h)
    assert patched.status_code == 200 and patched.json()["model_uri"] == "s3://ckpt/step-200"
    listed = client.get("/api/v1/runs", headers=h).json()["runs"]
    assert {r["name"]: r["model_uri"] for r in listed}["bare"] == "s3://ckpt/step-200"
    for bad in ("", "x" * 5000, "a\x00b"):
        response = client.patch(f"/api/v1/runs/{bare['id']}", json={"model_uri": bad}, headers=h)
        assert response.status_code == 422 and response.json()["detail"], bad


def test_create_job_with_defaults_and_read_it(client, auth, app):
    h = auth()
    run = _run(client, h)
    response = client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h)
    assert response.status_code == 201, response.text
    job = response.json()
    settings = app.state.settings
    assert job["state"] == "queued" and job["run_id"] == run["id"] and job["trigger"] == "manual"
    assert job["model_uri"] == "/models/qwen3-30b-a3b"
    assert job["classes"] == [c for c in FAULT_CLASSES if c != "healthy"]
    assert job["steps"] == settings.job_steps and job["seeds"] == settings.job_seeds
    assert job["keep_ratio"] == settings.job_keep_ratio and job["method"] == settings.job_method
    assert job["attempts"] == 0 and job["worker_id"] is None and job["cancel_requested"] is False
    assert job["started_at"] is None and job["finished_at"] is None and job["error"] is None
    got = client.get(f"/api/v1/jobs/{job['id']}", headers=h)
    assert got.status_code == 200 and got.json() == job


def test_create_job_with_its_own_spec(client, auth):
    h = auth()
    run = _run(client, h)
    body = {"run_id": run["id"], "classes": ["routing_mismatch", "router_corruption", "routing_mismatch"],
            "steps": 40, "seeds": [3, 4], "keep_ratio": 0.5, "method": "frequency"}
    job = client.post("/api/v1/jobs", json=body, headers=h).json()
    assert job["classes"] == ["routing_mismatch", "router_corruption"]
    assert (job["steps"], job["seeds"], job["keep_ratio"], job["method"]) == (40, [3, 4], 0.5, "frequency")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"classes": ["no_such_fault"]}, "unknown fault classes 'no_such_fault'"),
        ({"classes": []}, ""),
        ({"steps": 0}, ""),
        ({"steps": "many"}, ""),
        ({"classes": ["healthy", "routing_mismatch"]}, "reproduced as every fault's twin"),
        ({"seeds": []}, ""),
        ({"seeds": [1]}, ""),
        ({"seeds": [3, 3]}, "at least two different seeds"),
        ({"seeds": [-1, 0]}, ""),
        ({"keep_ratio": 0}, ""),
        ({"keep_ratio": 1.5}, ""),
        ({"method": "magic"}, "unknown method 'magic'"),
        ({"surprise": 1}, ""),
    ],
)
def test_bad_job_bodies_are_422_with_detail(client, auth, body, needle):
    h = auth()
    run = _run(client, h)
    response = client.post("/api/v1/jobs", json={"run_id": run["id"], **body}, headers=h)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail and needle in str(detail)
    assert client.get("/api/v1/jobs", headers=h).json()["total"] == 0


def test_job_refusals_name_the_reason(client, auth):
    h = auth()
    missing = client.post("/api/v1/jobs", json={"run_id": 987654}, headers=h)
    assert missing.status_code == 404 and missing.json() == {"detail": "run 987654 not found"}
    theirs = _run(client, auth("other-project"), "theirs")
    cross = client.post("/api/v1/jobs", json={"run_id": theirs["id"]}, headers=h)
    assert cross.status_code == 404 and cross.json() == {"detail": f"run {theirs['id']} not found"}
    bare = _run(client, h, "bare", model_uri=None)
    no_model = client.post("/api/v1/jobs", json={"run_id": bare["id"]}, headers=h)
    assert no_model.status_code == 409 and "has no model_uri" in no_model.json()["detail"]

    run = _run(client, h, "weak")
    first = client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h).json()
    again = client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h)
    assert again.status_code == 409 and f"job {first['id']} is already open" in again.json()["detail"]
    # Another model for the same run is another job.
    client.patch(f"/api/v1/runs/{run['id']}", json={"model_uri": "/models/other"}, headers=h)
    assert client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h).status_code == 201
    # Two open jobs: the project's cap (MOEPROXY_JOB_MAX_OPEN_PER_PROJECT, 2 by default).
    third = _run(client, h, "third")
    capped = client.post("/api/v1/jobs", json={"run_id": third["id"]}, headers=h)
    assert capped.status_code == 409 and "2 open jobs" in capped.json()["detail"]
    # Other projects have caps of their own; a cancelled job no longer counts.
    assert client.post("/api/v1/jobs", json={"run_id": theirs["id"]}, headers=auth("other-project")).status_code == 201
    assert client.post(f"/api/v1/jobs/{first['id']}/cancel", headers=h).json()["state"] == "cancelled"
    assert client.post("/api/v1/jobs", json={"run_id": third["id"]}, headers=h).status_code == 201


def test_the_cap_is_a_setting(database, make_token):
    from fastapi.testclient import TestClient
    from moeproxy.service.app import create_app

    from moeproxy.config import Settings

    app = create_app(Settings(database_url="sqlite://", job_max_open_per_project=3), database=database)
    h = {"Authorization": f"Bearer {make_token('capped')}"}
    with TestClient(app) as client:
        codes = [
            client.post("/api/v1/jobs", json={"run_id": _run(client, h, f"r{i}")["id"]}, headers=h).status_code
            for i in range(4)
        ]
    assert codes == [201, 201, 201, 409]


def test_the_cap_comes_from_the_environment(monkeypatch):
    from moeproxy.config import Settings

    monkeypatch.setenv("MOEPROXY_JOB_MAX_OPEN_PER_PROJECT", "5")
    monkeypatch.setenv("MOEPROXY_JOB_SEEDS", "[7, 8, 9]")
    settings = Settings()
    assert settings.job_max_open_per_project == 5 and settings.job_seeds == [7, 8, 9]


def test_the_deployments_engine_options_go_under_the_requests_and_are_stored(database, make_token, monkeypatch):
    import pydantic
    from fastapi.testclient import TestClient
    from moeproxy.service.app import create_app

    from moeproxy.config import Settings

    monkeypatch.setenv("MOEPROXY_JOB_ENGINE", '{"prompts_per_step": 8, "lr": 2e-5}')
    monkeypatch.setenv("MOEPROXY_JOB_DEVICE", "npu:0")
    monkeypatch.setenv("MOEPROXY_RAY_ACCELERATOR", "NPU")
    settings = Settings(database_url="sqlite://")
    assert (settings.job_device, settings.ray_accelerator) == ("npu:0", "NPU")
    h = {"Authorization": f"Bearer {make_token('engine-defaults')}"}
    with TestClient(create_app(settings, database=database)) as client:
        own = client.post("/api/v1/jobs", json={"run_id": _run(client, h, "own")["id"], "engine": {"lr": 1e-4}},
                          headers=h).json()
        plain = client.post("/api/v1/jobs", json={"run_id": _run(client, h, "plain")["id"]}, headers=h).json()
    assert own["grid"]["engine"] == {"prompts_per_step": 8, "lr": 1e-4}
    assert plain["grid"]["engine"] == {"prompts_per_step": 8, "lr": 2e-5}
    with pytest.raises(pydantic.ValidationError, match="job_device"):
        Settings(job_device="tpu")


def test_list_newest_first_paged_and_filtered(client, auth, database):
    from moeproxy.service.jobs.models import ReproductionJob

    h = auth()
    runs = [_run(client, h, f"run-{i}") for i in range(5)]
    ids = []
    for run in runs:
        job = client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h).json()
        ids.append(job["id"])
        client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=h)  # under the cap for the next one
    with database.scope() as s:  # one of them queued again, as if created after its cancel
        s.get(ReproductionJob, ids[2]).state = "queued"
    page = client.get("/api/v1/jobs?limit=2", headers=h).json()
    assert page["total"] == 5 and page["limit"] == 2 and page["offset"] == 0
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2]
    rest = client.get("/api/v1/jobs?limit=10&offset=2", headers=h).json()
    assert [j["id"] for j in rest["jobs"]] == ids[::-1][2:]
    by_run = client.get(f"/api/v1/jobs?run_id={runs[1]['id']}", headers=h).json()
    assert [j["id"] for j in by_run["jobs"]] == [ids[1]] and by_run["total"] == 1
    queued = client.get("/api/v1/jobs?state=queued", headers=h).json()
    assert [j["id"] for j in queued["jobs"]] == [ids[2]]
    both = client.get(f"/api/v1/jobs?state=cancelled&run_id={runs[2]['id']}", headers=h).json()
    assert both["jobs"] == [] and both["total"] == 0
    assert client.get("/api/v1/jobs", headers=auth("someone-else")).json() == {
        "jobs": [], "total": 0, "limit": 50, "offset": 0
    }
    for query in ("limit=0", "limit=501", "offset=-1", "state=exploded", "run_id=0"):
        response = client.get(f"/api/v1/jobs?{query}", headers=h)
        assert response.status_code == 422 and response.json()["detail"], query
    unknown_run = client.get("/api/v1/jobs?run_id=987654", headers=h)
    assert unknown_run.status_code == 404 and unknown_run.json() == {"detail": "run 987654 not found"}


def test_jobs_of_another_project_are_404(client, auth):
    h = auth()
    job = client.post("/api/v1/jobs", json={"run_id": _run(client, h)["id"]}, headers=h).json()
    other = auth("intruder")
    for method, path in (("GET", f"/api/v1/jobs/{job['id']}"), ("POST", f"/api/v1/jobs/{job['id']}/cancel")):
        response = client.request(method, path, headers=other)
        assert response.status_code == 404 and response.json() == {"detail": f"job {job['id']} not found"}
    assert client.get("/api/v1/jobs/987654", headers=h).json() == {"detail": "job 987654 not found"}
    assert client.get(f"/api/v1/jobs/{2**40}", headers=h).status_code == 404
    assert client.get(f"/api/v1/jobs/{job['id']}", headers=h).json()["state"] == "queued"  # untouched


def test_cancel_queued_running_and_finished(client, auth, database):
    from moeproxy.service.jobs import queue

    h = auth()
    queued = client.post("/api/v1/jobs", json={"run_id": _run(client, h, "a")["id"]}, headers=h).json()
    cancelled = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=h)
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled" and cancelled.json()["finished_at"] is not None
    finished = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=h)
    assert finished.status_code == 409 and "already finished (cancelled)" in finished.json()["detail"]

    running = client.post("/api/v1/jobs", json={"run_id": _run(client, h, "b")["id"]}, headers=h).json()
    with database.scope() as s:
        lease, spec = queue.claim(s, "w1", 60, max_attempts=3)
    assert spec.id == running["id"]
    asked = client.post(f"/api/v1/jobs/{running['id']}/cancel", headers=h).json()
    assert asked["state"] == "running" and asked["cancel_requested"] is True and asked["worker_id"] == "w1"
    with database.scope() as s:
        beat, lease = queue.heartbeat(s, lease, 60)
    assert beat.held and beat.cancel_requested
    with database.scope() as s:
        assert queue.mark_cancelled(s, lease)
    after = client.get(f"/api/v1/jobs/{running['id']}", headers=h).json()
    assert after["state"] == "cancelled" and after["worker_id"] is None


def test_a_job_cancelled_while_it_ran_ends_cancelled_with_its_result(client, auth, database):
    from moeproxy.service.jobs import queue
    from moeproxy.service.jobs.spec import JobOutcome

    h = auth()
    job = client.post("/api/v1/jobs", json={"run_id": _run(client, h)["id"]}, headers=h).json()
    with database.scope() as s:
        lease, _spec = queue.claim(s, "w1", 60, max_attempts=3)
    client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=h)
    with database.scope() as s:  # the executor finished without looking
        assert queue.complete(s, lease, JobOutcome(result={"library_version": 2})) == "cancelled"
    after = client.get(f"/api/v1/jobs/{job['id']}", headers=h).json()
    assert after["state"] == "cancelled" and after["result"] == {"library_version": 2}


def test_cancelling_a_job_whose_worker_is_gone_cancels_it_at_once(client, auth, database):
    from datetime import timedelta

    from moeproxy.service.db import utcnow
    from moeproxy.service.jobs import queue

    h = auth()
    job = client.post("/api/v1/jobs", json={"run_id": _run(client, h)["id"]}, headers=h).json()
    with database.scope() as s:
        queue.claim(s, "gone", 5, max_attempts=3, now=utcnow() - timedelta(seconds=60))
    response = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=h).json()
    assert response["state"] == "cancelled" and response["worker_id"] is None
    assert "worker gone had stopped heartbeating" in response["error"]


def test_openapi_documents_the_jobs_api(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/cancel"} <= set(paths)
    assert "409" in paths["/api/v1/jobs"]["post"]["responses"]


def test_migration_0007_goes_down_and_up_keeping_runs_and_metrics(fresh_database_url):
    """Downgrading drops the jobs table and runs.model_uri but nothing else (SQLite's batch copy of
    runs would cascade into metrics: 0007 uses the native DROP COLUMN)."""
    from moeproxy.service.db import Database, make_engine
    from moeproxy.service.metrics import repository as metrics
    from moeproxy.service.metrics.codec import parse_ingest_body
    from moeproxy.service.runs.models import Run
    from moeproxy.service.tokens import repository as tokens
    from sqlalchemy import inspect, text

    from moeproxy import migrations

    db = Database(fresh_database_url)
    try:
        with db.scope() as s:
            project = tokens.get_or_create_project(s, "migrating")
            run = Run(project_id=project.id, name="kept", model_uri="/m")
            s.add(run)
            s.flush()
            metrics.ingest(s, run, parse_ingest_body(b'{"steps": [{"step": 0, "values": {"kl": 0.5}}]}'))
            run_id = run.id
    finally:
        db.dispose()
    migrations.downgrade(fresh_database_url, "0006")
    engine = make_engine(fresh_database_url)
    try:
        inspector = inspect(engine)
        assert "reproduction_jobs" not in inspector.get_table_names()
        assert "model_uri" not in {c["name"] for c in inspector.get_columns("runs")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM metric_points")).scalar() == 1
            assert conn.execute(text("SELECT name FROM runs WHERE id = :i"), {"i": run_id}).scalar() == "kept"
    finally:
        engine.dispose()
    assert migrations.current_revision(fresh_database_url) == "0006"
    migrations.upgrade(fresh_database_url)
    assert migrations.current_revision(fresh_database_url) == migrations.head_revision() == "0011"
    engine = make_engine(fresh_database_url)
    try:
        assert "reproduction_jobs" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
