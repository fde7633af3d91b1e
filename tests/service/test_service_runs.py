"""Runs API over HTTP on SQLite and PostgreSQL: create/resume, list, get, patch, delete, auth."""

from __future__ import annotations


def test_create_then_same_name_resumes(client, auth):
    h = auth()
    first = client.post("/api/v1/runs", json={"name": "grpo-1", "framework": "verl", "tags": ["a"]}, headers=h)
    assert first.status_code == 201
    body = first.json()
    assert body["name"] == "grpo-1" and body["framework"] == "verl" and body["status"] == "running"
    assert body["created_at"].endswith("Z") or "+00:00" in body["created_at"]
    again = client.post("/api/v1/runs", json={"name": "grpo-1", "model": "Qwen3-30B-A3B"}, headers=h)
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    assert again.json()["model"] == "Qwen3-30B-A3B"  # a missing field is filled in
    assert again.json()["tags"] == ["a"]  # kept


def test_resume_sets_status_back_to_running(client, auth):
    h = auth()
    run = client.post("/api/v1/runs", json={"name": "r"}, headers=h).json()
    assert client.patch(f"/api/v1/runs/{run['id']}", json={"status": "crashed"}, headers=h).json()["status"] == "crashed"
    assert client.post("/api/v1/runs", json={"name": "r"}, headers=h).json()["status"] == "running"


def test_list_newest_first_with_pagination(client, auth):
    h = auth()
    ids = [client.post("/api/v1/runs", json={"name": f"run-{i}"}, headers=h).json()["id"] for i in range(5)]
    page = client.get("/api/v1/runs?limit=2", headers=h).json()
    assert page["total"] == 5 and page["limit"] == 2 and page["offset"] == 0
    assert [r["id"] for r in page["runs"]] == ids[::-1][:2]
    rest = client.get("/api/v1/runs?limit=10&offset=2", headers=h).json()
    assert [r["id"] for r in rest["runs"]] == ids[::-1][2:]
    assert client.get("/api/v1/runs?limit=0", headers=h).status_code == 422
    assert client.get("/api/v1/runs?offset=-1", headers=h).status_code == 422


def test_get_and_patch(client, auth):
    h = auth()
    run = client.post("/api/v1/runs", json={"name": "r", "config": {"lr": 1e-6}}, headers=h).json()
    got = client.get(f"/api/v1/runs/{run['id']}", headers=h).json()
    assert got["config"] == {"lr": 1e-6}
    patched = client.patch(f"/api/v1/runs/{run['id']}", json={"status": "finished", "tags": ["x", "y"]}, headers=h)
    assert patched.status_code == 200
    assert patched.json()["status"] == "finished" and patched.json()["tags"] == ["x", "y"]
    bad = client.patch(f"/api/v1/runs/{run['id']}", json={"status": "exploded"}, headers=h)
    assert bad.status_code == 422 and "detail" in bad.json()
    assert client.patch(f"/api/v1/runs/{run['id']}", json={"nope": 1}, headers=h).status_code == 422


def test_bad_run_bodies_are_422_with_detail(client, auth):
    h = auth()
    for body in ({}, {"name": ""}, {"name": "   "}, {"name": 5}, {"name": "x", "tags": "notalist"}, {"name": "x", "config": []}):
        response = client.post("/api/v1/runs", json=body, headers=h)
        assert response.status_code == 422, body
        assert response.json()["detail"]
    assert client.get("/api/v1/runs", headers=h).json()["total"] == 0


def test_unknown_run_is_404(client, auth):
    response = client.get("/api/v1/runs/987654", headers=auth())
    assert response.status_code == 404
    assert response.json() == {"detail": "run 987654 not found"}


def test_cross_project_isolation(client, auth):
    mine = client.post("/api/v1/runs", json={"name": "shared-name"}, headers=auth("alpha")).json()
    theirs = client.post("/api/v1/runs", json={"name": "shared-name"}, headers=auth("beta"))
    assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]  # names are per project
    for method, path, body in (
        ("GET", f"/api/v1/runs/{mine['id']}", None),
        ("PATCH", f"/api/v1/runs/{mine['id']}", {"status": "failed"}),
        ("DELETE", f"/api/v1/runs/{mine['id']}", None),
        ("GET", f"/api/v1/runs/{mine['id']}/metrics", None),
        ("POST", f"/api/v1/runs/{mine['id']}/metrics", {"steps": [{"step": 0, "values": {"a": 1}}]}),
        ("GET", f"/api/v1/runs/{mine['id']}/metrics/names", None),
    ):
        response = client.request(method, path, json=body, headers=auth("beta"))
        assert response.status_code == 404, (method, path)
        assert "detail" in response.json()
    assert [r["name"] for r in client.get("/api/v1/runs", headers=auth("beta")).json()["runs"]] == ["shared-name"]
    assert client.get(f"/api/v1/runs/{mine['id']}", headers=auth("alpha")).json()["status"] == "running"
    assert client.get(f"/api/v1/runs/{mine['id']}/metrics", headers=auth("alpha")).json() == {"metrics": {}}


def test_every_api_route_needs_a_token(client, app):
    from route_table import app_routes

    api = sorted((m, p) for m, p in app_routes() if p.startswith("/api/v1"))
    assert len(api) >= 14
    for method, path in api:
        response = client.request(method, path.replace("{run_id}", "1"))
        assert response.status_code == 401, (method, path)
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["detail"]


def test_bad_and_revoked_tokens_are_401(client, database, make_token):
    from moeproxy.service.tokens import repository

    token = make_token("p")
    h = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/whoami", headers=h).json()["project"] == "p"
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer mpx_wrong"}).status_code == 401
    assert client.get("/api/v1/runs", headers={"Authorization": f"Basic {token}"}).status_code == 401
    with database.scope() as s:
        repository.revoke_token(s, token)
    response = client.get("/api/v1/runs", headers=h)
    assert response.status_code == 401 and response.json() == {"detail": "invalid or revoked token"}


def test_tokens_are_stored_hashed(database, make_token):
    from moeproxy.service.tokens.models import ApiToken
    from moeproxy.service.tokens.repository import hash_token
    from sqlalchemy import select

    token = make_token("hashed")
    with database.scope() as s:
        stored = s.scalars(select(ApiToken.token_hash)).all()
    assert token not in stored
    assert hash_token(token) in stored


def test_delete_run_removes_its_metrics(client, auth, database):
    from moeproxy.service.metrics.models import MetricPoint
    from sqlalchemy import func, select

    h = auth()
    run = client.post("/api/v1/runs", json={"name": "gone"}, headers=h).json()
    keep = client.post("/api/v1/runs", json={"name": "kept"}, headers=h).json()
    for r in (run, keep):
        client.post(f"/api/v1/runs/{r['id']}/metrics", json={"steps": [{"step": 0, "values": {"a": 1, "b": 2}}]}, headers=h)
    assert client.delete(f"/api/v1/runs/{run['id']}", headers=h).status_code == 204
    assert client.get(f"/api/v1/runs/{run['id']}", headers=h).status_code == 404
    with database.scope() as s:
        assert s.scalar(select(func.count()).select_from(MetricPoint)) == 2


def test_health_probes_need_no_token(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_openapi_documents_the_api(client):
    spec = client.get("/openapi.json").json()
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/runs/{run_id}/metrics", "/api/v1/aliases"} <= set(spec["paths"])
    ingest = spec["paths"]["/api/v1/runs/{run_id}/metrics"]["post"]
    schema = ingest["requestBody"]["content"]["application/json"]["schema"]
    assert schema["properties"]["steps"]["maxItems"] == 10_000
    assert client.get("/docs").status_code == 200
