"""End to end: ingestion -> live triage -> outbox -> a real local HTTP receiver standing in for Slack."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from ui_helpers import ingest_body
from moeproxy.config import Settings
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.tokens import repository as tokens
from moeproxy.signatures.synthetic import synthetic_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "alerts"))
from http_receiver import Receiver  # the receiver helper lives with the alert tests


def wait_for(predicate, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_strong_fault_alerts_once_through_429_and_500(fresh_database_url, fingerprint_library, receiver):
    receiver.script = [(429, {"Retry-After": "1"}), (500, {})]
    db = Database(fresh_database_url)
    settings = Settings(
        database_url=fresh_database_url,
        fingerprints=fingerprint_library,
        triage_interval_s=0.2,
        slack_webhook_url=receiver.url,
        public_url="http://triage.example",
    )
    app = create_app(settings, database=db)
    with db.scope() as s:
        _row, token = tokens.create_token(s, "alerts")
    headers = {"Authorization": f"Bearer {token}"}
    run = synthetic_run("gradient_overflow", steps=90, onset=30, seed=131)
    try:
        with TestClient(app) as client:
            app.state.alert_outbox.policy = type(app.state.alert_outbox.policy)(
                base_s=0.05, max_backoff_s=0.2
            )
            run_id = client.post(
                "/api/v1/runs", json={"name": "fp16-run", "framework": "verl"}, headers=headers
            ).json()["id"]
            for start in range(0, 90, 30):  # three batches: live triage re-evaluates as they arrive
                client.post(
                    f"/api/v1/runs/{run_id}/metrics",
                    json=ingest_body(run, start=start, stop=start + 30),
                    headers=headers,
                )
                time.sleep(0.3)
            assert wait_for(lambda: len(receiver.accepted) >= 1), [s.status for s in receiver.seen]
            # More evaluations of the same outcome send nothing more.
            client.post(f"/api/v1/runs/{run_id}/triage", headers=headers)
            client.post(f"/api/v1/runs/{run_id}/metrics", json=ingest_body(run, start=60), headers=headers)
            assert app.state.live_triage.wait_idle(60)
            time.sleep(1.0)
    finally:
        db.dispose()
    statuses = [s.status for s in receiver.seen]
    assert statuses[:3] == [429, 500, 200]
    alerts = [s.body for s in receiver.accepted]
    classes = [a["text"].split(" ")[0] for a in alerts]
    assert classes.count("gradient_overflow") == 1, classes  # one alert for the class (escalation aside)
    first = alerts[0]
    assert first["blocks"][0]["text"]["text"] == "Likely fault: gradient_overflow"
    assert f"http://triage.example/runs/{run_id}" in first["blocks"][4]["elements"][0]["url"]
