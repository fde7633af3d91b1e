"""Every route × a foreign project's credentials: 401 or 404, or a listing of the foreign project's
own data — never the owner's data, and no write to it (issue 16).

The matrix must name every route the app serves: a new route without a row fails here.
"""

from __future__ import annotations

import json

import pytest
from route_table import app_routes

MLFLOW = "/mlflow/api/2.0/mlflow"
SECRET = "owner-secret"  # every name the owner stores contains it; no foreign answer may


@pytest.fixture
def owner(client, auth):
    """The owner's data in every store: a REST run with metrics and a job, an alias, an MLflow experiment and run."""
    h = auth("owner")
    run = client.post(
        "/api/v1/runs", json={"name": f"{SECRET}-run", "config": {"k": SECRET}, "model_uri": f"/{SECRET}/model"}, headers=h
    ).json()
    job = client.post("/api/v1/jobs", json={"run_id": run["id"]}, headers=h).json()
    steps = [{"step": s, "values": {f"{SECRET}/loss": 1.0 / (s + 1)}} for s in range(5)]
    assert client.post(f"/api/v1/runs/{run['id']}/metrics", json={"steps": steps}, headers=h).status_code == 200
    alias = {"framework": "verl", "name": f"{SECRET}/alias", "canonical": "loss"}
    assert client.post("/api/v1/aliases", json=alias, headers=h).status_code in (200, 201)
    experiment = client.post(f"{MLFLOW}/experiments/create", json={"name": f"{SECRET}-exp"}, headers=h).json()
    created = client.post(
        f"{MLFLOW}/runs/create",
        json={"experiment_id": experiment["experiment_id"], "run_name": f"{SECRET}-mlflow"},
        headers=h,
    ).json()
    run_uuid = created["run"]["info"]["run_id"]
    client.post(f"{MLFLOW}/runs/log-metric", json={"run_id": run_uuid, "key": f"{SECRET}_m", "value": 1.0, "step": 0}, headers=h)
    return {"run_id": run["id"], "job_id": job["id"], "experiment_id": experiment["experiment_id"], "run_uuid": run_uuid, "headers": h}


def _matrix(o: dict) -> dict[tuple[str, str], dict]:
    """route -> the foreign request and what it may answer: "absent" (401/404), "listing" (200 of the
    foreign project's own data), "public" (the same for everyone)."""
    rid, uuid, exp = o["run_id"], o["run_uuid"], o["experiment_id"]
    run = f"/api/v1/runs/{rid}"
    m = MLFLOW
    return {
        ("GET", "/healthz"): {"url": "/healthz", "expect": "public"},
        ("GET", "/readyz"): {"url": "/readyz", "expect": "public"},
        ("GET", "/api/v1/whoami"): {"url": "/api/v1/whoami", "expect": "listing"},
        ("POST", "/api/v1/runs"): {"url": "/api/v1/runs", "json": {"name": "intruder-run"}, "expect": "listing"},
        ("GET", "/api/v1/runs"): {"url": "/api/v1/runs", "expect": "listing"},
        ("GET", "/api/v1/runs/{run_id}"): {"url": run, "expect": "absent"},
        ("PATCH", "/api/v1/runs/{run_id}"): {"url": run, "json": {"status": "failed"}, "expect": "absent"},
        ("DELETE", "/api/v1/runs/{run_id}"): {"url": run, "expect": "absent"},
        ("POST", "/api/v1/runs/{run_id}/metrics"): {
            "url": f"{run}/metrics", "json": {"steps": [{"step": 0, "values": {"x": 9.0}}]}, "expect": "absent"
        },
        ("GET", "/api/v1/runs/{run_id}/metrics"): {"url": f"{run}/metrics", "expect": "absent"},
        ("GET", "/api/v1/runs/{run_id}/metrics/names"): {"url": f"{run}/metrics/names", "expect": "absent"},
        ("GET", "/api/v1/runs/{run_id}/triage"): {"url": f"{run}/triage", "expect": "absent"},
        ("POST", "/api/v1/runs/{run_id}/triage"): {"url": f"{run}/triage", "expect": "absent"},
        ("GET", "/api/v1/runs/{run_id}/triage/history"): {"url": f"{run}/triage/history", "expect": "absent"},
        ("POST", "/api/v1/jobs"): {"url": "/api/v1/jobs", "json": {"run_id": rid}, "expect": "absent"},
        ("GET", "/api/v1/jobs"): {"url": "/api/v1/jobs", "expect": "listing"},
        ("GET", "/api/v1/jobs/{job_id}"): {"url": f"/api/v1/jobs/{o['job_id']}", "expect": "absent"},
        ("POST", "/api/v1/jobs/{job_id}/cancel"): {"url": f"/api/v1/jobs/{o['job_id']}/cancel", "expect": "absent"},
        ("GET", "/api/v1/aliases"): {"url": "/api/v1/aliases", "expect": "listing"},
        ("POST", "/api/v1/aliases"): {
            "url": "/api/v1/aliases", "json": {"framework": "verl", "name": "intruder/a", "canonical": "loss"},
            "expect": "listing",
        },
        ("GET", f"{m}/experiments/get-by-name"): {
            "url": f"{m}/experiments/get-by-name?experiment_name={SECRET}-exp", "expect": "absent",
            "echo": f"{SECRET}-exp",  # "no experiment named ..." repeats the asker's own words
        },
        ("GET", f"{m}/experiments/get"): {"url": f"{m}/experiments/get?experiment_id={exp}", "expect": "absent"},
        ("POST", f"{m}/experiments/create"): {
            "url": f"{m}/experiments/create", "json": {"name": "intruder-exp"}, "expect": "listing"
        },
        ("GET", f"{m}/experiments/search"): {"url": f"{m}/experiments/search", "expect": "listing"},
        ("POST", f"{m}/experiments/search"): {"url": f"{m}/experiments/search", "json": {}, "expect": "listing"},
        ("POST", f"{m}/runs/create"): {
            "url": f"{m}/runs/create", "json": {"experiment_id": exp, "run_name": "into-owner-exp"}, "expect": "absent"
        },
        ("GET", f"{m}/runs/get"): {"url": f"{m}/runs/get?run_id={uuid}", "expect": "absent"},
        ("POST", f"{m}/runs/search"): {"url": f"{m}/runs/search", "json": {"experiment_ids": [exp]}, "expect": "absent"},
        ("POST", f"{m}/runs/update"): {"url": f"{m}/runs/update", "json": {"run_id": uuid, "status": "FAILED"}, "expect": "absent"},
        ("POST", f"{m}/runs/delete"): {"url": f"{m}/runs/delete", "json": {"run_id": uuid}, "expect": "absent"},
        ("POST", f"{m}/runs/log-metric"): {
            "url": f"{m}/runs/log-metric", "json": {"run_id": uuid, "key": "x", "value": 1.0}, "expect": "absent"
        },
        ("POST", f"{m}/runs/log-parameter"): {
            "url": f"{m}/runs/log-parameter", "json": {"run_id": uuid, "key": "k", "value": "v"}, "expect": "absent"
        },
        ("POST", f"{m}/runs/set-tag"): {
            "url": f"{m}/runs/set-tag", "json": {"run_id": uuid, "key": "k", "value": "v"}, "expect": "absent"
        },
        ("POST", f"{m}/runs/delete-tag"): {
            "url": f"{m}/runs/delete-tag", "json": {"run_id": uuid, "key": "mlflow.runName"}, "expect": "absent"
        },
        ("POST", f"{m}/runs/log-batch"): {
            "url": f"{m}/runs/log-batch", "json": {"run_id": uuid, "metrics": [{"key": "x", "value": 1.0, "timestamp": 1, "step": 1}]},
            "expect": "absent",
        },
        ("GET", f"{m}/metrics/get-history"): {
            "url": f"{m}/metrics/get-history?run_id={uuid}&metric_key={SECRET}_m", "expect": "absent",
            "echo": f"{SECRET}_m",
        },
        # The pages, with the foreign project's page session.
        ("GET", "/static/{name}"): {"url": "/static/ui.css", "expect": "public", "page": True},
        ("GET", "/login"): {"url": "/login", "expect": "public", "page": True},
        ("POST", "/login"): {"url": "/login", "form": {"token": "wrong"}, "expect": "absent", "page": True},
        ("POST", "/logout"): {"url": "/logout", "expect": "public", "page": True, "last": True},
        ("GET", "/"): {"url": "/", "expect": "listing", "page": True},
        ("GET", "/runs/{run_id}"): {"url": f"/runs/{rid}", "expect": "absent", "page": True},
        ("POST", "/runs/{run_id}/evaluate"): {"url": f"/runs/{rid}/evaluate", "expect": "absent", "page": True},
        ("GET", "/runs/{run_id}/state"): {"url": f"/runs/{rid}/state", "expect": "absent", "page": True},
        ("GET", "/faults"): {"url": "/faults", "expect": "public", "page": True},
        ("GET", "/jobs"): {"url": "/jobs", "expect": "listing", "page": True},
        ("GET", "/jobs/{job_id}"): {"url": f"/jobs/{o['job_id']}", "expect": "absent", "page": True},
    }


def test_a_foreign_project_sees_and_changes_nothing_of_the_owner(client, auth, make_token, owner):
    matrix = _matrix(owner)
    assert set(matrix) == app_routes(), "every route needs a row in the isolation matrix"

    intruder_token = make_token("intruder")
    api = {"Authorization": f"Bearer {intruder_token}"}
    assert client.post("/login", data={"token": intruder_token}, follow_redirects=False).status_code == 303
    rows = sorted(matrix.items(), key=lambda item: item[1].get("last", False))  # log out at the end
    for (method, route), row in rows:
        reply = client.request(
            method,
            row["url"],
            headers=None if row.get("page") else api,
            json=row.get("json"),
            data=row.get("form"),
            follow_redirects=False,
        )
        where = f"{method} {route}: {reply.status_code} {reply.text[:300]}"
        assert reply.status_code < 500, where
        assert SECRET not in reply.text.replace(row.get("echo") or "\0", ""), where
        if row["expect"] == "absent":
            assert reply.status_code in (401, 404), where
        else:
            assert reply.status_code in (200, 201, 303), where

    # Nothing of the owner's changed: the run, its metrics, the MLflow run and its tags.
    h = owner["headers"]
    run = client.get(f"/api/v1/runs/{owner['run_id']}", headers=h).json()
    assert run["status"] == "running" and run["config"] == {"k": SECRET}
    jobs = client.get("/api/v1/jobs", headers=h).json()["jobs"]
    assert [(j["id"], j["state"], j["cancel_requested"]) for j in jobs] == [(owner["job_id"], "queued", False)]
    series = client.get(f"/api/v1/runs/{owner['run_id']}/metrics", headers=h).json()["metrics"]
    assert list(series) == [f"{SECRET}/loss"] and series[f"{SECRET}/loss"]["steps"] == [0, 1, 2, 3, 4]
    mlflow_run = client.get(f"{MLFLOW}/runs/get?run_id={owner['run_uuid']}", headers=h).json()["run"]
    assert mlflow_run["info"]["status"] == "RUNNING" and mlflow_run["info"]["lifecycle_stage"] == "active"
    assert {t["key"] for t in mlflow_run["data"].get("tags", [])} >= {"mlflow.runName"}
    assert not mlflow_run["data"].get("params")
    assert [m["key"] for m in mlflow_run["data"]["metrics"]] == [f"{SECRET}_m"]
    owner_experiments = json.dumps(client.get(f"{MLFLOW}/experiments/search", headers=h).json())
    assert "into-owner-exp" not in owner_experiments and "intruder" not in owner_experiments
