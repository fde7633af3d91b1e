"""A reproduction job's two messages on the alert channels (issue 18, item 5): "a reproduction was
started" when the job is made, its outcome when the worker ends it, delivered by the outbox to a
real local Slack-shaped receiver and to the JSON webhook, once each per job."""

from __future__ import annotations

import pytest
from moeproxy.service.alerts.models import AlertOutbox
from moeproxy.service.alerts.outbox import deliver_due, resolver_from_urls
from moeproxy.service.jobs import repository as jobs
from moeproxy.service.jobs.spec import JobOutcome
from moeproxy.service.jobs.worker import run_worker
from moeproxy.service.runs.models import Run
from sqlalchemy import select

from moeproxy.config import Settings


@pytest.fixture
def settings(alerts_db, receiver):
    return Settings(database_url=alerts_db.url, slack_webhook_url=receiver.url, public_url="http://moeproxy.test")


def _job(alerts_db, run_id, settings) -> int:
    with alerts_db.scope() as s:
        s.get(Run, run_id).model_uri = "/models/qwen3-moe"
    with alerts_db.scope() as s:
        project_id = s.get(Run, run_id).project_id
        return jobs.create_job(s, project_id, jobs.JobRequest(run_id=run_id, classes=["router_corruption"]),
                               settings).id


def _deliver(alerts_db, receiver, n):
    resolve = resolver_from_urls({"slack": receiver.url})
    for _ in range(50):
        deliver_due(alerts_db, resolve)
        if len(receiver.accepted) >= n:
            return [a.body for a in receiver.accepted]
    raise AssertionError("the outbox did not deliver")


def test_a_job_says_it_started_and_how_it_ended(alerts_db, run_id, settings, receiver):
    job_id = _job(alerts_db, run_id, settings)
    (started,) = _deliver(alerts_db, receiver, 1)
    assert started["blocks"][0]["text"]["text"] == "Reproduction started"
    assert started["text"] == (f"No confident match in run qwen3-grpo [rl-team]: reproduction job {job_id} "
                               "started on a proxy (router_corruption)")

    def executor(job, ctx):
        return JobOutcome(result={"library_version": 2, "retriage": {
            "top_class": "router_corruption", "score": 0.91, "strength": "strong",
            "verdict": "likely router_corruption (expert-routing consistency), score 0.91"}}, device_hours=0.25)

    assert run_worker(alerts_db, executor=executor, settings=settings, once=True) == 1
    finished = _deliver(alerts_db, receiver, 2)[1]
    assert finished["blocks"][0]["text"]["text"] == "Reproduction succeeded"
    assert finished["text"] == (f"Reproduction job {job_id} for run qwen3-grpo [rl-team] finished: library v2, "
                                "now router_corruption (0.91, strong)")
    fields = {f["text"].split("\n")[0]: f["text"] for f in finished["blocks"][2]["fields"]}
    assert fields["*Device-hours*"] == "*Device-hours*\n0.25"
    assert "<http://moeproxy.test/runs/" in fields["*Run*"]


def test_a_failed_job_says_why_and_nothing_is_said_twice(alerts_db, run_id, settings, receiver):
    job_id = _job(alerts_db, run_id, settings)

    def executor(job, ctx):
        raise RuntimeError("model_uri '/models/qwen3-moe': no such directory on this worker")

    run_worker(alerts_db, executor=executor, settings=settings, once=True)
    bodies = _deliver(alerts_db, receiver, 2)
    assert bodies[1]["text"] == (f"Reproduction job {job_id} for run qwen3-grpo [rl-team] failed: RuntimeError: "
                                 "model_uri '/models/qwen3-moe': no such directory on this worker")
    # The same messages enqueued again (a retried worker, a racing creation) add no row.
    from moeproxy.service.jobs import notify
    from moeproxy.service.jobs.models import ReproductionJob

    with alerts_db.scope() as s:
        row = s.get(ReproductionJob, job_id)
        assert notify.job_message(s, row, "job_started", settings) == 0
        assert notify.job_message(s, row, "job_finished", settings) == 0
        assert len(s.scalars(select(AlertOutbox).where(AlertOutbox.run_id == run_id)).all()) == 2


def test_the_webhook_gets_the_job_as_data(alerts_db, run_id, receiver):
    settings = Settings(database_url=alerts_db.url, webhook_url=receiver.url)
    job_id = _job(alerts_db, run_id, settings)
    resolve = resolver_from_urls({"webhook": receiver.url})
    deliver_due(alerts_db, resolve)
    (body,) = [a.body for a in receiver.accepted]
    assert body["event"] == "moeproxy.job.started" and body["job_id"] == job_id
    assert body["classes"] == ["router_corruption"] and body["state"] == "queued"


def test_without_channels_nothing_is_enqueued(alerts_db, run_id):
    _job(alerts_db, run_id, Settings(database_url=alerts_db.url))
    with alerts_db.scope() as s:
        assert s.scalars(select(AlertOutbox)).all() == []
