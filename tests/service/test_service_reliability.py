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
            answer = socks[0].recv(4096).decode()
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
