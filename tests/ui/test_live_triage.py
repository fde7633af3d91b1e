"""Live evaluation: triggered by ingestion, off the request thread, debounced per run."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens import repository as tokens
from moeproxy.service.triage import repository as triage_repo
from moeproxy.service.triage.engine import SignatureEngine
from moeproxy.service.triage.live import LiveTriage
from moeproxy.signatures.synthetic import synthetic_run
from ui_helpers import ingest_body
from waiting import wait_for

from moeproxy.config import Settings


@pytest.fixture
def live_db(fresh_database_url):
    db = Database(fresh_database_url)
    yield db
    db.dispose()


def test_ingest_triggers_evaluation_in_the_background(live_db, fingerprint_library):
    settings = Settings(database_url=live_db.url, fingerprints=fingerprint_library, triage_interval_s=0.5)
    app = create_app(settings, database=live_db)
    with live_db.scope() as s:
        _row, token = tokens.create_token(s, "live")
    headers = {"Authorization": f"Bearer {token}"}
    run = synthetic_run("rollout_logp_precision", steps=80, onset=30, seed=111)

    with TestClient(app) as client:
        live = app.state.live_triage
        engine = app.state.triage_engine
        gate, entered = threading.Event(), threading.Event()
        real_evaluate = engine.evaluate

        def gated(*args, **kwargs):
            entered.set()
            assert gate.wait(30)
            return real_evaluate(*args, **kwargs)

        engine.evaluate = gated
        run_id = client.post(
            "/api/v1/runs", json={"name": "live", "framework": "verl"}, headers=headers
        ).json()["id"]
        ingest = client.post(f"/api/v1/runs/{run_id}/metrics", json=ingest_body(run), headers=headers)
        # The ingest answered while the evaluation it triggered is still held inside the engine.
        assert ingest.status_code == 200 and ingest.json()["accepted"] > 0
        assert entered.wait(30), "ingestion did not trigger an evaluation"
        with live_db.scope() as s:
            assert triage_repo.latest(s, run_id) is None
        gate.set()
        wait_for(lambda: live.evaluations >= 1 and live.idle(), what="the evaluation")
        body = client.get(f"/api/v1/runs/{run_id}/triage", headers=headers).json()
        assert body["candidates"][0]["fault_class"] == "rollout_logp_precision"
        assert body["last_step"] == 79


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_debounce_at_most_once_per_interval_and_trailing_edge(live_db, fingerprint_library):
    with live_db.scope() as s:
        project = tokens.get_or_create_project(s, "debounce")
        run = Run(project_id=project.id, name="r", framework="verl")
        s.add(run)
        s.flush()
        run_id = run.id
    import json

    from moeproxy.service.metrics import repository as metrics
    from moeproxy.service.metrics.codec import parse_ingest_body

    def ingest(start, stop):
        body = json.dumps(
            ingest_body(
                synthetic_run("gradient_overflow", steps=90, onset=30, seed=112), start=start, stop=stop
            )
        )
        with live_db.scope() as s:
            metrics.ingest(s, s.get(Run, run_id), parse_ingest_body(body.encode()))

    clock = FakeClock()
    settings = Settings(database_url=live_db.url, fingerprints=fingerprint_library)
    live = LiveTriage(
        live_db, SignatureEngine(fingerprint_library), settings, interval_s=10.0, clock=clock
    ).start()
    try:
        ingest(0, 60)
        live.poke(run_id)  # a quiet run: evaluated at once (leading edge)
        wait_for(lambda: live.evaluations == 1 and live.idle(), what="first evaluation")
        for stop in range(61, 91):  # a burst of batches within the interval
            ingest(stop - 1, stop)
            live.poke(run_id)
        time.sleep(0.3)
        assert live.evaluations == 1  # nothing more before the interval has passed
        clock.now += 10.0
        live.poke(run_id)  # (any wake-up; the burst is already scheduled)
        wait_for(lambda: live.evaluations == 2 and live.idle(), what="trailing evaluation")
        time.sleep(0.3)
        assert live.evaluations == 2  # the whole burst cost one more evaluation
        with live_db.scope() as s:
            assert triage_repo.latest(s, run_id).last_step == 89  # ... and it saw the last batch
    finally:
        live.stop()


def test_live_triage_is_off_on_a_shared_test_connection(ui_client, ui_app):
    assert ui_app.state.live_triage is None  # one connection cannot be shared with background threads


def test_live_triage_compiles_dtw_as_it_starts_not_inside_the_first_evaluation():
    """The warm-up (library load, DTW compile: seconds with the GIL held) runs when the thread
    starts, so a job's first batches are not slowed by it; a warm-up that fails leaves the thread
    running (evaluations say what is wrong, run by run)."""
    from moeproxy.service.triage.errors import LibraryUnavailable

    class Engine:
        def __init__(self, fail: bool):
            self.fail, self.warmed = fail, threading.Event()

        def warm(self):
            self.warmed.set()
            if self.fail:
                raise LibraryUnavailable("no such file")

    for fail in (False, True):
        engine = Engine(fail)
        live = LiveTriage(None, engine, None, interval_s=1.0).start()
        try:
            assert engine.warmed.wait(10)
            time.sleep(0.05)
            assert live._thread is not None and live._thread.is_alive() and live.evaluations == 0
        finally:
            live.stop()
