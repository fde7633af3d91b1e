"""Request rate limits (issue 16): 429 with Retry-After per credential and per address, in each
route's own error shape, probes exempt; and the client waits as told."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from moeproxy.client import MetricsClient, retry_after_s
from moeproxy.config import Settings
from moeproxy.service.app import create_app


@pytest.fixture
def limited(database):
    app = create_app(
        Settings(database_url="sqlite://", rate_limit_per_token=3, rate_limit_per_address=8, rate_limit_window_s=600),
        database=database,
    )
    with TestClient(app) as client:
        yield client


def test_a_token_over_its_limit_gets_429_with_retry_after(limited, make_token):
    one, other = ({"Authorization": f"Bearer {make_token(p)}"} for p in ("one", "other"))
    assert [limited.get("/api/v1/whoami", headers=one).status_code for _ in range(3)] == [200, 200, 200]
    refused = limited.get("/api/v1/runs", headers=one)
    assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= 600
    assert "too many requests" in refused.json()["detail"]
    assert limited.get("/api/v1/whoami", headers=other).status_code == 200  # counted apart
    mlflow = limited.post("/mlflow/api/2.0/mlflow/runs/create", json={}, headers=one)
    assert mlflow.status_code == 429 and mlflow.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED"
    assert limited.get("/healthz").status_code == 200 and limited.get("/readyz").status_code == 200


def test_made_up_tokens_are_bounded_by_the_address_limit(limited):
    codes = [limited.get("/api/v1/whoami", headers={"Authorization": f"Bearer guess-{i}"}).status_code for i in range(10)]
    assert codes[:8] == [401] * 8 and codes[8:] == [429, 429]
    assert limited.post("/login", data={"token": "x"}).status_code == 429  # pages count too


def test_the_defaults_leave_a_training_job_far_below_the_limits():
    s = Settings(database_url="sqlite://")
    per_second = s.rate_limit_per_token / s.rate_limit_window_s
    # An MLflow client logging 50 metrics one call each at a step per second, or the moeproxy
    # client flushing every 2 s with 16 data-parallel ranks each on its own run.
    assert per_second >= 2 * 50 and per_second >= 16 / 2
    assert s.rate_limit_per_address >= s.rate_limit_per_token


@pytest.mark.parametrize(
    ("status", "header", "expected"),
    [(429, "7", 7.0), (503, "2", 2.0), (429, "100000", 300.0), (500, "7", None), (429, "", None), (429, "soon", None)],
)
def test_retry_after_is_read_from_429_and_503(status, header, expected):
    response = httpx.Response(status, headers={"Retry-After": header} if header else {})
    assert retry_after_s(response) == expected


def test_retry_after_as_an_http_date():
    from email.utils import format_datetime
    from datetime import UTC, datetime, timedelta

    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after_s(httpx.Response(429, headers={"Retry-After": when})) <= 30


def test_the_client_waits_as_long_as_a_429_asks(tmp_path, monkeypatch):
    """Backoff alone would retry after ~0.5 s; the server said 7 s."""
    import moeproxy.client as client_module

    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/runs":
            return httpx.Response(201, json={"id": 1})
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "too many requests"})
        return httpx.Response(200, json={"accepted": 1})

    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    client = MetricsClient(
        "http://moeproxy.test", "tok", "rl", transport=httpx.MockTransport(handler),
        spill_path=tmp_path / "spill.jsonl", register_atexit=False,
    )
    client._send([(0, {"loss": 1.0})])  # the sender thread's call, run here to see its waits
    client.close()
    assert calls["n"] == 2 and 7.0 in slept
    assert not (tmp_path / "spill.jsonl").exists() or not (tmp_path / "spill.jsonl").read_text().strip()
