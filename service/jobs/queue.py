"""The job queue on the database: claims, leases, heartbeats and guarded completion.

* :func:`claim` takes the oldest queued job.  On PostgreSQL the candidate row is selected with
  ``FOR UPDATE SKIP LOCKED``, so concurrent workers each get a different job without waiting on
  one another; on SQLite (one local worker is the intended setup) the write transaction holds the
  database.  On both, the claim itself is one ``UPDATE ... WHERE id = :id AND state = 'queued'``
  whose row count must be 1, so two workers can never take the same job.
* A claimed job is the worker's while its lease holds: ``(worker_id, attempts)`` identifies the
  claim (``attempts`` is the fence: a job claimed again after a lost lease has a new one), and
  ``lease_expires_at`` must lie ahead.  :func:`heartbeat` extends it and reports a cancel
  request; :func:`complete`, :func:`fail`, :func:`mark_cancelled` and :func:`release` only act on
  a claim that still holds, so a stale worker's completion is refused (and logged) and no job is
  ever completed twice.
* :func:`requeue_expired` (run by every claim) puts a running job whose lease expired — its worker
  died or stalled — back to ``queued``; after ``max_attempts`` claims it fails with the reason
  instead, and a job whose cancel was requested is cancelled.

Plain functions on a session; the caller's unit of work commits (the worker keeps each call in a
short transaction of its own).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from moeproxy.service.db import is_sqlite, utcnow
from moeproxy.service.jobs.models import JobState, ReproductionJob
from moeproxy.service.jobs.spec import JobOutcome, JobSpec
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from sqlalchemy import ColumnElement, and_, case, select, update
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 16_000


@dataclass(frozen=True, slots=True)
class Lease:
    job_id: int
    worker_id: str
    attempt: int
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Beat:
    held: bool  # False: the lease was lost (expired, or the job taken back)
    cancel_requested: bool


def _held(lease: Lease, now: datetime) -> ColumnElement[bool]:
    return and_(
        ReproductionJob.id == lease.job_id,
        ReproductionJob.state == JobState.running.value,
        ReproductionJob.worker_id == lease.worker_id,
        ReproductionJob.attempts == lease.attempt,
        ReproductionJob.lease_expires_at >= now,
    )


def requeue_expired(session: Session, *, max_attempts: int, now: datetime | None = None) -> list[int]:
    """Running jobs whose lease expired: queued again, failed after ``max_attempts``, or cancelled."""
    now = now or utcnow()
    expired = session.scalars(
        select(ReproductionJob)
        .where(ReproductionJob.state == JobState.running.value, ReproductionJob.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    for job in expired:
        worker = job.worker_id
        if job.cancel_requested_at is not None:
            job.state, job.finished_at = JobState.cancelled.value, now
            job.error = f"cancelled; its worker {worker} stopped heartbeating before it stopped the job"
        elif job.attempts >= max_attempts:
            job.state, job.finished_at = JobState.failed.value, now
            job.error = (
                f"the lease expired {job.attempts} times (last worker {worker}): the workers running "
                f"this job stopped heartbeating (killed, out of memory, or stalled); "
                f"MOEPROXY_JOB_MAX_ATTEMPTS={max_attempts}"
            )
        else:
            job.state = JobState.queued.value
        log.warning(
            "job %s: lease of worker %s expired (attempt %s); now %s", job.id, worker, job.attempts, job.state
        )
        job.worker_id = job.lease_expires_at = None
    session.flush()
    return [job.id for job in expired]


def claim(
    session: Session, worker_id: str, lease_s: float, *, max_attempts: int, now: datetime | None = None
) -> tuple[Lease, JobSpec] | None:
    """The oldest queued job, now running under ``worker_id`` for ``lease_s`` seconds; None if none."""
    now = now or utcnow()
    requeue_expired(session, max_attempts=max_attempts, now=now)
    candidates = (
        select(ReproductionJob.id)
        .where(ReproductionJob.state == JobState.queued.value)
        .order_by(ReproductionJob.created_at, ReproductionJob.id)
        .limit(1)
    )
    if not is_sqlite(session):
        candidates = candidates.with_for_update(skip_locked=True)
    job_id = session.scalar(candidates)
    if job_id is None:
        return None
    expires = now + timedelta(seconds=lease_s)
    claimed = session.execute(
        update(ReproductionJob)
        .where(ReproductionJob.id == job_id, ReproductionJob.state == JobState.queued.value)
        .values(
            state=JobState.running.value,
            worker_id=worker_id,
            attempts=ReproductionJob.attempts + 1,
            lease_expires_at=expires,
            heartbeat_at=now,
            started_at=now,
            updated_at=now,
            error=None,
        )
        .execution_options(synchronize_session=False)
    )
    if claimed.rowcount != 1:  # taken (or cancelled) since it was read: not ours
        return None
    job = session.scalar(
        select(ReproductionJob).where(ReproductionJob.id == job_id).execution_options(populate_existing=True)
    )
    run_name = session.scalar(select(Run.name).where(Run.id == job.run_id)) or ""
    project = session.scalar(select(Project.name).where(Project.id == job.project_id)) or ""
    lease = Lease(job.id, worker_id, job.attempts, expires)
    return lease, spec_of(job, project=project, run_name=run_name)


def spec_of(job: ReproductionJob, *, project: str, run_name: str) -> JobSpec:
    return JobSpec(
        id=job.id,
        project_id=job.project_id,
        project=project,
        run_id=job.run_id,
        run_name=run_name,
        model_uri=job.model_uri,
        method=job.method,
        keep_ratio=job.keep_ratio,
        classes=tuple(job.classes),
        grid=dict(job.grid or {}),
        seeds=tuple(job.seeds),
        steps=job.steps,
        trigger=job.trigger,
        attempt=job.attempts,
    )


def heartbeat(
    session: Session,
    lease: Lease,
    lease_s: float,
    *,
    progress: Mapping[str, Any] | None = None,
    device_hours: float | None = None,
    planner_estimate: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> tuple[Beat, Lease]:
    """Extend the lease (and store progress figures); report whether a cancel was requested."""
    now = now or utcnow()
    expires = now + timedelta(seconds=lease_s)
    values: dict[str, Any] = {"lease_expires_at": expires, "heartbeat_at": now}
    if progress is not None:
        values["progress"] = dict(progress)
    if device_hours is not None:
        values["device_hours"] = device_hours
    if planner_estimate is not None:
        values["planner_estimate"] = dict(planner_estimate)
    held = session.execute(
        update(ReproductionJob).where(_held(lease, now)).values(**values).execution_options(synchronize_session=False)
    ).rowcount == 1
    if not held:
        log.warning("job %s: worker %s lost its lease (attempt %s)", lease.job_id, lease.worker_id, lease.attempt)
        return Beat(held=False, cancel_requested=False), lease
    cancel = session.scalar(select(ReproductionJob.cancel_requested_at).where(ReproductionJob.id == lease.job_id))
    return Beat(held=True, cancel_requested=cancel is not None), Lease(
        lease.job_id, lease.worker_id, lease.attempt, expires
    )


def _finish(session: Session, lease: Lease, what: str, now: datetime | None, **values: Any) -> bool:
    now = now or utcnow()
    done = session.execute(
        update(ReproductionJob)
        .where(_held(lease, now))
        .values(finished_at=now, updated_at=now, worker_id=None, lease_expires_at=None, **values)
        .execution_options(synchronize_session=False)
    ).rowcount == 1
    if not done:
        log.warning(
            "job %s: %s by worker %s (attempt %s) refused: the job is no longer this worker's "
            "(lease expired, job claimed again or finished)", lease.job_id, what, lease.worker_id, lease.attempt,
        )
    return done


def complete(session: Session, lease: Lease, outcome: JobOutcome, *, now: datetime | None = None) -> str | None:
    """Record the executor's outcome: ``succeeded``, or ``cancelled`` when a cancel was requested
    meanwhile (the result is kept).  Returns the state written, None when refused."""
    # Decided inside the UPDATE: a cancel asked between a read and the write cannot be missed.
    state = case(
        (ReproductionJob.cancel_requested_at.is_(None), JobState.succeeded.value), else_=JobState.cancelled.value
    )
    values: dict[str, Any] = {"state": state, "result": dict(outcome.result)}
    if outcome.device_hours is not None:
        values["device_hours"] = outcome.device_hours
    if outcome.planner_estimate is not None:
        values["planner_estimate"] = dict(outcome.planner_estimate)
    if not _finish(session, lease, "completion", now, **values):
        return None
    return session.scalar(select(ReproductionJob.state).where(ReproductionJob.id == lease.job_id))


def fail(session: Session, lease: Lease, error: str, *, now: datetime | None = None) -> bool:
    if len(error) > MAX_ERROR_CHARS:
        error = error[: MAX_ERROR_CHARS // 2] + "\n...\n" + error[-MAX_ERROR_CHARS // 2 :]
    return _finish(session, lease, "failure", now, state=JobState.failed.value, error=error)


def mark_cancelled(session: Session, lease: Lease, *, now: datetime | None = None) -> bool:
    return _finish(session, lease, "cancellation", now, state=JobState.cancelled.value)


def release(session: Session, lease: Lease, *, now: datetime | None = None) -> bool:
    """Put the job back to ``queued`` (the worker is stopping); the claim does not count as an attempt."""
    now = now or utcnow()
    released = session.execute(
        update(ReproductionJob)
        .where(_held(lease, now))
        .values(
            state=JobState.queued.value,
            worker_id=None,
            lease_expires_at=None,
            attempts=ReproductionJob.attempts - 1,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    ).rowcount == 1
    if not released:
        log.warning("job %s: release by worker %s refused: no longer its job", lease.job_id, lease.worker_id)
    return released
