"""The job queue and its workers on SQLite and PostgreSQL, with committed data (several engines,
threads and processes on one database): claims, leases, retries after a worker dies, guarded
completion, failures, cancellation and stopping."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from job_executors import Recorder
from moeproxy.service.app import create_app
from moeproxy.service.db import Database, utcnow
from moeproxy.service.jobs import queue, repository
from moeproxy.service.jobs.models import ReproductionJob
from moeproxy.service.jobs.spec import JobCancelled, JobOutcome
from moeproxy.service.jobs.worker import run_worker
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens import repository as tokens
from waiting import wait_for

from moeproxy.config import Settings

HERE = Path(__file__).resolve().parent


@pytest.fixture
def url(fresh_database_url) -> str:
    return fresh_database_url


@pytest.fixture
def db(url):
    database = Database(url)
    yield database
    database.dispose()


def settings_for(url: str, **overrides) -> Settings:
    return Settings(database_url=url, job_max_open_per_project=100, **overrides)


def queue_jobs(db: Database, n: int, project: str = "queue") -> list[int]:
    """``n`` queued jobs, each for a run of its own, oldest first."""
    settings = settings_for(db.url)
    ids = []
    with db.scope() as s:
        p = tokens.get_or_create_project(s, project)
        for i in range(n):
            run = Run(project_id=p.id, name=f"run-{len(ids)}-{time.monotonic_ns()}", model_uri=f"/models/m{i}")
            s.add(run)
            s.flush()
            ids.append(repository.create_job(s, p.id, repository.JobRequest(run_id=run.id), settings).id)
    return ids


def job_row(db: Database, job_id: int) -> ReproductionJob:
    with db.scope() as s:
        return s.get(ReproductionJob, job_id)


def worker_thread(db: Database, executor, worker_id: str, **kwargs) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    options = {"lease_s": 2.0, "poll_s": 0.05, **kwargs}
    thread = threading.Thread(
        target=run_worker,
        args=(db,),
        kwargs={"executor": executor, "worker_id": worker_id, "stop": stop, "settings": settings_for(db.url), **options},
        daemon=True,
    )
    thread.start()
    return thread, stop


def test_claims_take_the_oldest_job_once(db):
    first, second = queue_jobs(db, 2)
    with db.scope() as s:
        lease_a, spec_a = queue.claim(s, "a", 30, max_attempts=3)
    with db.scope() as s:
        _lease_b, spec_b = queue.claim(s, "b", 30, max_attempts=3)
    with db.scope() as s:
        assert queue.claim(s, "c", 30, max_attempts=3) is None
    assert (spec_a.id, spec_b.id) == (first, second)
    assert (lease_a.attempt, lease_a.worker_id) == (1, "a")
    assert spec_a.model_uri == "/models/m0" and spec_a.project == "queue" and spec_a.run_name.startswith("run-")
    assert spec_a.classes and spec_a.seeds and spec_a.steps >= 8
    row = job_row(db, first)
    assert row.state == "running" and row.worker_id == "a" and row.attempts == 1 and row.started_at is not None


def test_skip_locked_hands_concurrent_claims_different_jobs(db, backend):
    """A claim whose transaction is still open holds its row: a second claim on PostgreSQL skips it
    without waiting (FOR UPDATE SKIP LOCKED).  SQLite has one writer at a time: there the second
    claim waits for the first to commit, and then finds the job taken."""
    first, second = queue_jobs(db, 2)
    other = Database(db.url)  # a second engine: another worker process, in effect
    try:
        holding = db.session()
        try:
            _lease, spec = queue.claim(holding, "holder", 30, max_attempts=3)
            assert spec.id == first
            if backend == "postgres":
                with other.scope() as s:
                    _lease, other_spec = queue.claim(s, "other", 30, max_attempts=3)
                assert other_spec.id == second
            holding.commit()
        finally:
            holding.close()
        if backend == "sqlite":
            with other.scope() as s:
                _lease, other_spec = queue.claim(s, "other", 30, max_attempts=3)
            assert other_spec.id == second
    finally:
        other.dispose()
    assert job_row(db, first).worker_id == "holder" and job_row(db, second).worker_id == "other"


def test_two_workers_never_run_the_same_job(db):
    ids = queue_jobs(db, 8)
    recorder = Recorder(work_s=0.05)
    engines = [Database(db.url), Database(db.url)]  # one engine each, as two processes would have
    workers = [worker_thread(engine, recorder, f"worker-{i}") for i, engine in enumerate(engines)]
    try:
        wait_for(lambda: all(job_row(db, j).state == "succeeded" for j in ids), what="every job done")
    finally:
        for thread, stop in workers:
            stop.set()
            thread.join(30)
        for engine in engines:
            engine.dispose()
    assert sorted(job_id for job_id, _attempt, _worker in recorder.runs) == ids  # each exactly once
    rows = [job_row(db, j) for j in ids]
    assert all(r.attempts == 1 and r.result["worker"] in ("worker-0", "worker-1") for r in rows)
    assert all(r.device_hours == 0.01 and r.finished_at is not None and r.worker_id is None for r in rows)


def test_an_expired_lease_is_retried_and_the_stale_worker_cannot_complete(db, caplog):
    [job_id] = queue_jobs(db, 1)
    t0 = utcnow()
    with db.scope() as s:
        stale, _spec = queue.claim(s, "stale", 10, max_attempts=2, now=t0)
    with db.scope() as s:  # within the lease: nobody else gets it
        assert queue.claim(s, "fresh", 10, max_attempts=2, now=t0 + timedelta(seconds=5)) is None
    with db.scope() as s:
        fresh, spec = queue.claim(s, "fresh", 10, max_attempts=2, now=t0 + timedelta(seconds=11))
    assert spec.id == job_id and spec.attempt == 2 and fresh.attempt == 2
    later = t0 + timedelta(seconds=12)
    with caplog.at_level(logging.WARNING, logger="moeproxy.service.jobs.queue"), db.scope() as s:
        beat, _ = queue.heartbeat(s, stale, 10, now=later)
        assert not beat.held
        assert queue.complete(s, stale, JobOutcome(result={"by": "stale"}), now=later) is None
        assert not queue.fail(s, stale, "stale failure", now=later)
    assert "completion by worker stale (attempt 1) refused" in caplog.text
    with db.scope() as s:
        assert queue.complete(s, fresh, JobOutcome(result={"by": "fresh"}), now=later) == "succeeded"
    with db.scope() as s:  # never completed twice, not even by its own worker
        assert queue.complete(s, fresh, JobOutcome(result={"by": "again"}), now=later) is None
    row = job_row(db, job_id)
    assert row.state == "succeeded" and row.result == {"by": "fresh"} and row.attempts == 2


def test_a_job_whose_workers_keep_dying_fails_after_max_attempts(db):
    [job_id] = queue_jobs(db, 1)
    t = utcnow()
    for attempt in (1, 2):
        with db.scope() as s:
            lease, _spec = queue.claim(s, f"w{attempt}", 10, max_attempts=2, now=t)
        assert lease.attempt == attempt
        t += timedelta(seconds=11)
    with db.scope() as s:
        assert queue.claim(s, "w3", 10, max_attempts=2, now=t) is None
    row = job_row(db, job_id)
    assert row.state == "failed" and row.finished_at is not None and row.worker_id is None
    assert "lease expired 2 times (last worker w2)" in row.error


def test_a_worker_killed_mid_job_has_its_job_retried_and_completed_once(db, url, tmp_path):
    [job_id] = queue_jobs(db, 1)
    marker = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    doomed = subprocess.Popen(
        [sys.executable, str(HERE / "job_executors.py"), url, "doomed", "3", str(marker)],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: marker.exists() and marker.read_text().strip() == f"{job_id} 1", what="the job to start")
        wait_for(lambda: job_row(db, job_id).progress == {"alive": True}, what="a heartbeat")
        os.kill(doomed.pid, signal.SIGKILL)
        assert doomed.wait(30) == -signal.SIGKILL
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
    assert job_row(db, job_id).state == "running" and job_row(db, job_id).worker_id == "doomed"
    recorder = Recorder()
    thread, stop = worker_thread(db, recorder, "survivor")
    try:
        wait_for(lambda: job_row(db, job_id).state == "succeeded", what="the retried job to finish")
    finally:
        stop.set()
        thread.join(30)
    row = job_row(db, job_id)
    assert recorder.runs == [(job_id, 2, "survivor")]
    assert row.attempts == 2 and row.result == {"worker": "survivor", "attempt": 2}
    assert marker.read_text().splitlines() == [f"{job_id} 1"]  # the dead worker ran it once, never again
    with db.scope() as s:  # what the dead worker would have sent, had it lived
        dead = queue.Lease(job_id, "doomed", 1, utcnow() + timedelta(seconds=60))
        assert queue.complete(s, dead, JobOutcome(result={"by": "doomed"})) is None
    assert job_row(db, job_id).result == {"worker": "survivor", "attempt": 2}


@pytest.mark.parametrize("mode", [[], ["wrap"]], ids=["plain", "interrupt-wrapped"])
def test_sigterm_releases_the_job_and_exits(db, url, tmp_path, mode):
    """Also when what the signal interrupts turns it into an error of its own ("wrap"): a full run on
    a loaded machine once recorded the job as failed (its error was not kept; a heartbeat query cut
    off by the signal is the likely path, an Exception being the only way to "failed")."""
    [job_id] = queue_jobs(db, 1)
    marker = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "job_executors.py"), url, "terminated", "30", str(marker), *mode],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: marker.exists(), what="the job to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.stderr.read().decode()[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
    row = job_row(db, job_id)
    assert row.state == "queued" and row.worker_id is None and row.attempts == 0, row.error  # another worker may take it


@pytest.fixture
def api(db, url):
    """A client on the app over the same database, with a token of the jobs' project."""
    with db.scope() as s:
        _row, token = tokens.create_token(s, "queue")
    with TestClient(create_app(settings_for(url), database=db)) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client


def test_a_failing_job_records_its_error_and_the_api_shows_it(db, api):
    [job_id] = queue_jobs(db, 1)

    def broken(job, ctx):
        ctx.heartbeat({"done": 1, "total": 4})
        raise ValueError(f"bad checkpoint: {job.model_uri} has no config.json")

    assert run_worker(db, executor=broken, worker_id="w", once=True, settings=settings_for(db.url)) == 1
    body = api.get(f"/api/v1/jobs/{job_id}").json()
    assert body["state"] == "failed" and body["finished_at"] is not None and body["worker_id"] is None
    assert body["error"].startswith("ValueError: bad checkpoint: /models/m0 has no config.json")
    assert "Traceback" in body["error"] and body["progress"] == {"done": 1, "total": 4}
    assert api.get("/api/v1/jobs?state=failed").json()["total"] == 1


def test_a_missing_executor_fails_the_job_clearly(db, monkeypatch):
    from moeproxy.service.jobs import worker

    monkeypatch.setattr(worker, "EXECUTOR_MODULE", "moeproxy.service.jobs.no_such_executor")
    [job_id] = queue_jobs(db, 1)
    assert run_worker(db, once=True, worker_id="w", settings=settings_for(db.url)) == 1
    row = job_row(db, job_id)
    assert row.state == "failed"
    assert row.error == (
        "ExecutorUnavailable: no job executor: the module moeproxy.service.jobs.no_such_executor is not "
        "installed, so this worker cannot build proxies or run reproductions"
    )


def test_an_executor_without_its_extra_names_the_extra(db):
    [job_id] = queue_jobs(db, 1)

    def needs_torch(job, ctx):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    run_worker(db, executor=needs_torch, worker_id="w", once=True, settings=settings_for(db.url))
    error = job_row(db, job_id).error
    assert error.startswith("MissingExtra: `moeproxy worker` needs the [ml] extra (torch is not installed)")


@pytest.mark.parametrize("style", ["heartbeat", "flag"])
def test_a_cancelled_running_job_stops(db, api, style):
    """``heartbeat``: the executor heartbeats and gets JobCancelled; ``flag``: it only watches
    ``ctx.cancelled``, which the worker's background heartbeat sets."""
    [job_id] = queue_jobs(db, 1)
    seen: list[str] = []

    def long_job(job, ctx):
        for i in range(100_000):  # bounded: a job that never stops fails the test, not the suite
            if style == "heartbeat":
                try:
                    ctx.heartbeat({"done": i})
                except JobCancelled:
                    seen.append("cancelled")
                    raise
            elif ctx.cancelled:
                seen.append("cancelled")
                return JobOutcome(result={"stopped_at": i})
            time.sleep(0.01)
        return JobOutcome(result={"ran": "to its end"})

    thread, stop = worker_thread(db, long_job, "w", lease_s=1.5)
    try:
        wait_for(lambda: job_row(db, job_id).state == "running", what="the job to run")
        asked = api.post(f"/api/v1/jobs/{job_id}/cancel").json()
        assert asked["state"] == "running" and asked["cancel_requested"] is True
        wait_for(lambda: job_row(db, job_id).state == "cancelled", what="the job to stop")
    finally:
        stop.set()
        thread.join(30)
    assert seen == ["cancelled"] and not thread.is_alive()
    body = api.get(f"/api/v1/jobs/{job_id}").json()
    assert body["finished_at"] is not None and body["worker_id"] is None
    assert api.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 409


def test_a_worker_stopped_while_idle_returns(db):
    thread, stop = worker_thread(db, Recorder(), "idle", poll_s=0.05)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_the_worker_command(url, tmp_path):
    moeproxy = str(Path(sys.executable).parent / "moeproxy")

    def run(args, database_url):
        env = {**os.environ, "MOEPROXY_DATABASE_URL": database_url}
        return subprocess.run([moeproxy, *args], env=env, capture_output=True, text=True, timeout=120, check=False)

    help_text = run(["worker", "--help"], url).stdout
    assert all(option in help_text for option in ("--once", "--worker-id", "--lease-s", "--poll-s", "--ray-address"))
    idle = run(["worker", "--once", "--worker-id", "cli-worker"], url)
    assert idle.returncode == 0, idle.stderr
    assert "worker cli-worker stopped after 0 jobs" in idle.stdout
    empty = run(["worker", "--once"], f"sqlite:///{tmp_path / 'empty.db'}")
    assert empty.returncode == 2 and "run `moeproxy db upgrade` first" in empty.stderr


@pytest.mark.parametrize("same_run", [False, True], ids=["runs-of-one-project", "one-run"])
def test_concurrent_creations_keep_the_cap_and_one_open_job_per_run(db, same_run):
    """Eight creations at once, each on its own engine: the project's cap (2) and the one open job
    per run and model hold however they interleave."""
    from moeproxy.service.jobs.errors import JobConflict

    with db.scope() as s:
        project = tokens.get_or_create_project(s, "racing")
        runs = [Run(project_id=project.id, name=f"race-{i}", model_uri="/models/m") for i in range(8)]
        s.add_all(runs)
        s.flush()
        project_id, run_ids = project.id, [r.id for r in runs]
    settings = Settings(database_url=db.url)  # the default cap of 2
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create(run_id: int) -> None:
        engine = Database(db.url)
        try:
            barrier.wait(30)
            with engine.scope() as s:
                repository.create_job(s, project_id, repository.JobRequest(run_id=run_id), settings)
            outcomes.append("created")
        except JobConflict as exc:
            outcomes.append(type(exc).__name__)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=create, args=(run_ids[0] if same_run else r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == 8
    created = 1 if same_run else 2
    assert outcomes.count("created") == created
    assert set(outcomes) - {"created"} == {"OpenJobExists" if same_run else "OpenJobCapReached"}
    with db.scope() as s:
        assert repository.open_jobs_in_project(s, project_id) == created
