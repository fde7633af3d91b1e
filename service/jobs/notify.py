"""The two messages of a reproduction job on the alert channels (Slack, webhook): "a reproduction
was started" when a job is made for a run, and its outcome when it ends. Rows of the alert outbox
like any alert, so they are retried and delivered by the service's outbox worker (a job's worker
only enqueues them)."""

from __future__ import annotations

from typing import Any

from moeproxy.service.alerts.channels import channel_urls
from moeproxy.service.alerts.messages import JobMessage
from moeproxy.service.alerts.outbox import enqueue_message
from moeproxy.service.jobs.models import ReproductionJob
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from sqlalchemy import select
from sqlalchemy.orm import Session


def job_message(session: Session, job: ReproductionJob, kind: str, settings: Any) -> int:
    """Enqueue ``kind`` (``job_started`` | ``job_finished``) for ``job`` on every configured channel;
    returns the rows added (0 without channels)."""
    channels = list(channel_urls(settings))
    if not channels:
        return 0
    run = session.get(Run, job.run_id)
    if run is None:
        return 0
    project = session.scalar(select(Project.name).where(Project.id == job.project_id)) or ""
    result = job.result or {}
    retriage = result.get("retriage") or {}
    message = JobMessage(
        kind=kind, run_id=run.id, run_name=run.name, project=project, job_id=job.id, state=job.state,
        trigger=job.trigger, classes=tuple(job.classes), url=f"{settings.public_url.rstrip('/')}/runs/{run.id}",
        top_class=retriage.get("top_class"), score=retriage.get("score"), strength=retriage.get("strength"),
        verdict=retriage.get("verdict"), library_version=result.get("library_version"),
        device_hours=job.device_hours, error=(job.error or "").splitlines()[0][:300] if job.error else None,
    )
    return len(enqueue_message(session, message, channels=channels))
