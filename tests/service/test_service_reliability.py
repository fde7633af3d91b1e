"""Defects found from outside (issue 16), each reproduced here against a real server."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from uvicorn_process import UvicornProcess, create_token


def _start_slow_body(port: int, token: str, run_id: int) -> socket.socket:
    """Send the headers of a metrics POST and 5 bytes of its body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST /api/v1/runs/{run_id}/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    sock.sendall(head.encode() + b'{"ste')
    return sock


def _read_response(sock: socket.socket) -> str:
    """One whole HTTP response (headers and Content-Length body), however the segments arrive."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_a_slow_body_holds_no_database_session_and_times_out(fresh_database_url):
    slow_token, other_token = create_token(fresh_database_url, "slow"), create_token(fresh_database_url, "other")
    with UvicornProcess(fresh_database_url, env={"MOEPROXY_BODY_READ_TIMEOUT_S": "3"}) as server:
        h_slow = {"Authorization": f"Bearer {slow_token}"}
        h_other = {"Authorization": f"Bearer {other_token}"}
        slow_run = httpx.post(f"{server.url}/api/v1/runs", json={"name": "slow"}, headers=h_slow).json()["id"]
        other_run = httpx.post(f"{server.url}/api/v1/runs", json={"name": "other"}, headers=h_other).json()["id"]
        socks = [_start_slow_body(server.port, slow_token, slow_run) for _ in range(4)]
        try:
            time.sleep(0.5)
            # Another project writes while the slow bodies hang: no lock, no pool slot is held by them.
            body = {"steps": [{"step": s, "values": {"loss": 1.0 / (s + 1)}} for s in range(10)]}
            reply = httpx.post(f"{server.url}/api/v1/runs/{other_run}/metrics", json=body, headers=h_other,
                               timeout=20)
            assert reply.status_code == 200 and reply.json()["accepted"] == 10
            # and the slow client is told, within the deadline (3 s here), with a JSON detail
            socks[0].settimeout(20)
            answer = _read_response(socks[0])
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            assert "did not arrive within 3 s" in answer
        finally:
            for sock in socks:
                sock.close()


@pytest.mark.parametrize("name,what", [("loss\u0000x", "NUL"), ("\ud800loss", "lone surrogate")])
def test_an_unstorable_metric_name_is_a_422_not_a_500(client, auth, name, what):
    run_id = client.post("/api/v1/runs", json={"name": f"bad-{what}"}, headers=auth()).json()["id"]
    raw = json.dumps({"steps": [{"step": 0, "values": {name: 1.0, "ok": 2.0}}]})  # ASCII-escaped JSON
    reply = client.post(f"/api/v1/runs/{run_id}/metrics", content=raw,
                        headers={**auth(), "Content-Type": "application/json"})
    assert reply.status_code == 422 and what in reply.json()["detail"]
    assert client.get(f"/api/v1/runs/{run_id}/metrics", headers=auth()).json()["metrics"] == {}  # nothing half-written


@pytest.mark.parametrize("path", ["/api/v1/runs/{run}/metrics", "/api/v1/runs"])
def test_deeply_nested_json_is_a_422(client, auth, path):
    run_id = client.post("/api/v1/runs", json={"name": "nested"}, headers=auth()).json()["id"]
    raw = '{"steps": ' + "[" * 100_000 + "]" * 100_000 + "}"
    reply = client.post(path.format(run=run_id), content=raw, headers={**auth(), "Content-Type": "application/json"})
    # the metrics route says why (422); FastAPI's own body parser answers 400 "error parsing the body"
    assert reply.status_code in ((422,) if "metrics" in path else (400, 422)) and "detail" in reply.json()


def test_the_client_drops_an_unstorable_name_and_keeps_the_rest_flowing(fresh_database_url, tmp_path):
    """One bad name must not stop a job's stream (issue 16): 60 steps, a NUL name in step 10."""
    from moeproxy.client import MetricsClient

    token = create_token(fresh_database_url, "client-names")
    with UvicornProcess(fresh_database_url) as server:
        with MetricsClient(server.url, token, "names-run", spill_path=tmp_path / "spill.jsonl",
                           flush_interval_s=0.05, batch_steps=5) as client:
            for step in range(60):
                values = {"loss": 1.0 / (step + 1)}
                if step == 10:
                    values["bad\u0000name"] = 1.0
                client.log(step, values)
        assert client.stats["points_skipped"] == 1
        run_id = client.run_id
        got = httpx.get(f"{server.url}/api/v1/runs/{run_id}/metrics",
                        headers={"Authorization": f"Bearer {token}"}).json()["metrics"]
    assert set(got) == {"loss"} and got["loss"]["steps"] == list(range(60))
    assert not (tmp_path / "spill.jsonl").exists() or (tmp_path / "spill.jsonl").stat().st_size == 0


HUGE_IDS = [2**31, 2**63, 2**64]


@pytest.mark.parametrize("huge", HUGE_IDS, ids=["2^31", "2^63", "2^64"])
@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/api/v1/runs/{id}"),
        ("PATCH", "/api/v1/runs/{id}"),
        ("DELETE", "/api/v1/runs/{id}"),
        ("GET", "/api/v1/runs/{id}/metrics"),
        ("POST", "/api/v1/runs/{id}/metrics"),
        ("GET", "/api/v1/runs/{id}/metrics/names"),
        ("GET", "/api/v1/runs/{id}/triage"),
        ("GET", "/api/v1/runs/{id}/triage/history"),
    ],
)
def test_a_run_id_beyond_the_column_is_404_not_500(client, auth, method, path, huge):
    body = {"steps": [{"step": 0, "values": {"loss": 1.0}}]} if path.endswith("metrics") else {"status": "finished"}
    reply = client.request(method, path.format(id=huge), headers=auth(), json=None if method in ("GET", "DELETE") else body)
    assert reply.status_code == 404 and "not found" in reply.json()["detail"]


@pytest.mark.parametrize("query", ["offset=9223372036854775808", "offset=2147483648"])
def test_a_huge_offset_is_422(client, auth, query):
    reply = client.get(f"/api/v1/runs?{query}", headers=auth())
    assert reply.status_code == 422 and reply.json()["detail"]


@pytest.mark.parametrize("after", [2**63, -(2**63) - 1, 2**70])
def test_an_after_step_beyond_64_bits_is_422(client, auth, after):
    run_id = client.post("/api/v1/runs", json={"name": "after"}, headers=auth()).json()["id"]
    reply = client.get(f"/api/v1/runs/{run_id}/metrics?after_step={after}", headers=auth())
    assert reply.status_code == 422 and reply.json()["detail"]


def test_a_page_of_a_huge_run_id_is_not_found(client, make_token):
    assert client.post("/login", data={"token": make_token()}, follow_redirects=False).status_code == 303
    assert client.get(f"/runs/{2**63}", follow_redirects=False).status_code == 404


MLFLOW = "/mlflow/api/2.0/mlflow"
LONG = "x" * 300


def _mlflow_run(client, auth) -> str:
    reply = client.post(f"{MLFLOW}/runs/create", json={"experiment_id": "0", "run_name": "ok"}, headers=auth())
    assert reply.status_code == 200, reply.text
    return reply.json()["run"]["info"]["run_id"]


MLFLOW_BAD_INPUTS = {
    "run name too long": ("POST", "runs/create", {"run_name": LONG}),
    "runName tag too long": ("POST", "runs/create", {"tags": [{"key": "mlflow.runName", "value": LONG}]}),
    "framework tag too long": ("POST", "runs/create", {"tags": [{"key": "moeproxy.framework", "value": LONG}]}),
    "user id too long": ("POST", "runs/create", {"user_id": LONG}),
    "start time beyond 64 bits": ("POST", "runs/create", {"start_time": 2**64}),
    "experiment name with NUL": ("POST", "experiments/create", {"name": "exp\u0000"}),
    "experiment id beyond int32": ("GET", "experiments/get?experiment_id=99999999999", None),
    "experiment name query with NUL": ("GET", "experiments/get-by-name?experiment_name=a%00b", None),
    "run id query with NUL": ("GET", "runs/get?run_id=a%00b", None),
    "metric step beyond 64 bits": ("POST", "runs/log-metric", {"key": "loss", "value": 1.0, "step": 2**64}),
    "metric timestamp beyond 64 bits": ("POST", "runs/log-metric", {"key": "loss", "value": 1.0, "timestamp": 2**64}),
    "metric key with NUL": ("POST", "runs/log-metric", {"key": "lo\u0000ss", "value": 1.0}),
    "metric key a lone surrogate": ("POST", "runs/log-metric", {"key": "\ud800", "value": 1.0}),
    "metric value an integer beyond a double": ("POST", "runs/log-metric", {"key": "loss", "value": 10**400}),
    "framework tag set too long": ("POST", "runs/set-tag", {"key": "moeproxy.framework", "value": LONG}),
    "end time beyond 64 bits": ("POST", "runs/update", {"status": "FINISHED", "end_time": 2**64}),
    "param key too long": ("POST", "runs/log-batch", {"params": [{"key": "k" * 600, "value": "v"}]}),
    "param value too long": ("POST", "runs/log-parameter", {"key": "k", "value": "v" * 9000}),
}


@pytest.mark.parametrize("case", list(MLFLOW_BAD_INPUTS))
def test_mlflow_inputs_that_do_not_fit_are_mlflow_4xx(client, auth, case):
    """Each was a 500 (which the MLflow client retries, blocking the training loop); now a 4xx
    in MLflow's own error shape, which the client raises at once as an MlflowException."""
    method, path, body = MLFLOW_BAD_INPUTS[case]
    if body is not None and path.startswith("runs/") and path != "runs/create":
        body = {**body, "run_id": _mlflow_run(client, auth)}
    raw = None if body is None else json.dumps(body)  # ASCII escapes carry NUL and surrogates
    reply = client.request(method, f"{MLFLOW}/{path}", content=raw,
                           headers={**auth(), "Content-Type": "application/json"})
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.text)
    answer = reply.json()
    assert answer["error_code"] in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST") and answer["message"]


def test_a_huge_run_config_is_refused_and_lists_leave_configs_out(client, auth):
    from moeproxy.service.limits import MAX_BODY_BYTES, MAX_CONFIG_BYTES

    too_big = {"blob": "x" * (MAX_CONFIG_BYTES + 1)}
    reply = client.post("/api/v1/runs", json={"name": "big", "config": too_big}, headers=auth())
    assert reply.status_code == 422 and "limit" in json.dumps(reply.json()["detail"])
    huge = {"blob": "x" * (MAX_BODY_BYTES + 1)}
    reply = client.post("/api/v1/runs", json={"name": "huge", "config": huge}, headers=auth())
    assert reply.status_code == 413 and "limit" in reply.json()["detail"]

    def chunks():  # no Content-Length: counted as it arrives
        raw = json.dumps({"name": "chunked", "config": huge}).encode()
        for i in range(0, len(raw), 65536):
            yield raw[i : i + 65536]

    reply = client.post("/api/v1/runs", content=chunks(), headers={**auth(), "Content-Type": "application/json"})
    assert reply.status_code == 413
    run_id = client.post("/api/v1/runs", json={"name": "fine", "config": {"lr": 1e-6}}, headers=auth()).json()["id"]
    patched = client.patch(f"/api/v1/runs/{run_id}", json={"config": too_big}, headers=auth())
    assert patched.status_code == 422
    listed = client.get("/api/v1/runs", headers=auth()).json()["runs"]
    assert [r["name"] for r in listed] == ["fine"] and "config" not in listed[0]
    assert client.get(f"/api/v1/runs/{run_id}", headers=auth()).json()["config"] == {"lr": 1e-6}


def test_an_oversized_mlflow_body_is_413_in_mlflow_shape(client, auth):
    from moeproxy.service.limits import MAX_BODY_BYTES

    run_id = _mlflow_run(client, auth)
    tags = [{"key": f"t{i}", "value": "v" * 7999} for i in range(MAX_BODY_BYTES // 8000 + 2)]
    reply = client.post(f"{MLFLOW}/runs/log-batch", json={"run_id": run_id, "tags": tags}, headers=auth())
    assert reply.status_code == 413 and reply.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED"


@pytest.mark.parametrize("field,value", [("name", "run\u0000"), ("framework", "\ud800"), ("tags", ["a\u0000"])])
def test_unstorable_run_fields_are_422(client, auth, field, value):
    body = {"name": "r", field: value}
    reply = client.post("/api/v1/runs", content=json.dumps(body), headers={**auth(), "Content-Type": "application/json"})
    assert reply.status_code == 422 and reply.json()["detail"]


@pytest.fixture
def in_process_server(fresh_database_url):
    """A real uvicorn serving the app in this process (so a test can break one of its functions)."""
    from app_thread import serve_in_thread

    from moeproxy.config import Settings
    from moeproxy.service.app import create_app

    served = serve_in_thread(create_app(Settings(database_url=fresh_database_url)), log_level="critical")
    yield served.port
    served.stop()


def test_an_unexpected_500_keeps_the_connection_open(in_process_server, fresh_database_url, monkeypatch):
    """Starlette answered 500 and re-raised, and uvicorn then closed the connection (defect 7)."""
    from moeproxy.service.runs import repository

    def broken(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(repository, "list_runs", broken)
    token = create_token(fresh_database_url, "keepalive")
    request = (
        f"GET /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", in_process_server), timeout=10) as sock:
        sock.sendall(request)  # two requests on one connection
        first = _read_response(sock)
        second = _read_response(sock)
    assert first.startswith("HTTP/1.1 500") and '{"detail":"internal server error"}' in first
    assert "a bug" not in first
    assert "connection: close" not in first.lower()
    assert second.startswith("HTTP/1.1 200"), second


def test_security_headers_on_pages_api_and_errors(client, auth):
    login = client.get("/login")
    policy = login.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy and "unsafe-eval" not in policy
    assert login.headers["x-frame-options"] == "DENY" and login.headers["x-content-type-options"] == "nosniff"
    for reply in (client.get("/api/v1/runs", headers=auth()), client.get("/api/v1/runs"), client.get("/docs")):
        assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]
        assert reply.headers["x-content-type-options"] == "nosniff"
    assert "script-src" not in client.get("/docs").headers["content-security-policy"]  # Swagger UI's CDN


def test_the_access_log_keeps_no_token_from_a_query(caplog):
    import logging

    from moeproxy.service.middleware import install_log_redaction

    install_log_redaction()
    install_log_redaction()  # idempotent
    access = logging.getLogger("uvicorn.access")
    assert sum(type(f).__name__ == "RedactSecrets" for f in access.filters) == 1
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/faults?token=mpx_SECRET&x=1", "1.1", 303)
    assert "mpx_SECRET" not in caplog.text and "token=[redacted]&x=1" in caplog.text
