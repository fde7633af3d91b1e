"""Job storage: create (with the open-job rules), read, list, cancel.  Plain functions on a session;
they never commit (the request scope or the worker's unit of work does)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.service.db import utcnow
from moeproxy.service.jobs import notify
from moeproxy.service.jobs.errors import (
    JobFinished,
    JobNotFound,
    NoModelUri,
    OpenJobCapReached,
    OpenJobExists,
)
from moeproxy.service.jobs.models import OPEN_STATES, JobState, JobTrigger, ReproductionJob
from moeproxy.service.limits import fits_id
from moeproxy.service.runs.models import Run
from moeproxy.service.runs.repository import get_run
from moeproxy.service.tokens.models import Project
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

#: The reference class is reproduced as every fault's healthy twin, not as a candidate of its own.
REFERENCE_CLASS = "healthy"


def default_classes() -> list[str]:
    """Every fault class of the catalogue (what a job reproduces when nothing narrows it)."""
    return [name for name in FAULT_CLASSES if name != REFERENCE_CLASS]


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job's spec before defaults: None means "the setting's default"."""

    run_id: int
    classes: Sequence[str] | None = None
    steps: int | None = None
    seeds: Sequence[int] | None = None
    keep_ratio: float | None = None
    method: str | None = None
    grid: dict[str, Any] | None = None
    trigger: JobTrigger = JobTrigger.manual


def _with_engine_defaults(grid: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The job's grid with the deployment's engine options under the request's own: stored with
    the job, so a job says what it ran whatever the settings are later."""
    grid = dict(grid or {})
    engine = {**defaults, **(grid.get("engine") or {})}
    return {**grid, "engine": engine} if engine else grid


def get_job(session: Session, project_id: int, job_id: int) -> ReproductionJob:
    """The job, if it belongs to ``project_id``; another project's job is as absent as a missing one."""
    job = (
        session.scalar(
            select(ReproductionJob).where(ReproductionJob.id == job_id, ReproductionJob.project_id == project_id)
        )
        if fits_id(job_id)
        else None
    )
    if job is None:
        raise JobNotFound(job_id)
    return job


def open_job_for(session: Session, run_id: int, model_uri: str) -> ReproductionJob | None:
    return session.scalar(
        select(ReproductionJob).where(
            ReproductionJob.run_id == run_id,
            ReproductionJob.model_uri == model_uri,
            ReproductionJob.state.in_(OPEN_STATES),
        )
    )


def open_jobs_in_project(session: Session, project_id: int) -> int:
    return session.scalar(
        select(func.count())
        .select_from(ReproductionJob)
        .where(ReproductionJob.project_id == project_id, ReproductionJob.state.in_(OPEN_STATES))
    ) or 0


def any_job_for(session: Session, run_id: int, model_uri: str) -> bool:
    return session.scalar(
        select(ReproductionJob.id)
        .where(ReproductionJob.run_id == run_id, ReproductionJob.model_uri == model_uri)
        .limit(1)
    ) is not None


def create_job(session: Session, project_id: int, request: JobRequest, settings: Any) -> ReproductionJob:
    """A queued job for the run's current ``model_uri``.

    Refused (409) when the run has no model_uri, when a job for this run and model is open, or when
    the project already has ``settings.job_max_open_per_project`` open jobs.  The project's row is
    locked so that two creations in one project count one after the other (PostgreSQL; a SQLite
    write transaction holds the database already); the partial unique index catches two creations
    for one run that still meet.  The run's row is locked before it, the order in which an
    evaluation that creates a job takes them (``triage.repository.store`` locks the run first):
    the other order could deadlock with it.
    """
    run = get_run(session, project_id, request.run_id)
    if not run.model_uri:
        raise NoModelUri(run.id)
    session.execute(select(Run.id).where(Run.id == run.id).with_for_update())
    session.execute(select(Project.id).where(Project.id == project_id).with_for_update())
    existing = open_job_for(session, run.id, run.model_uri)
    if existing is not None:
        raise OpenJobExists(existing.id, run.id)
    cap = settings.job_max_open_per_project
    if open_jobs_in_project(session, project_id) >= cap:
        raise OpenJobCapReached(cap)
    job = ReproductionJob(
        project_id=project_id,
        run_id=run.id,
        model_uri=run.model_uri,
        method=request.method or settings.job_method,
        keep_ratio=request.keep_ratio if request.keep_ratio is not None else settings.job_keep_ratio,
        classes=list(request.classes) if request.classes else default_classes(),
        grid=_with_engine_defaults(request.grid, settings.job_engine),
        seeds=list(request.seeds) if request.seeds else list(settings.job_seeds),
        steps=request.steps or settings.job_steps,
        trigger=request.trigger.value,
        state=JobState.queued.value,
        progress={},
        attempts=0,
    )
    try:
        with session.begin_nested():
            session.add(job)
    except IntegrityError:
        existing = open_job_for(session, run.id, run.model_uri)
        if existing is None:
            raise
        raise OpenJobExists(existing.id, run.id) from None
    notify.job_message(session, job, "job_started", settings)
    return job


def list_jobs(
    session: Session,
    project_id: int,
    *,
    run_id: int | None = None,
    state: JobState | None = None,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[ReproductionJob], int]:
    """Newest first, with the total count for pagination (as ``list_runs``)."""
    where = [ReproductionJob.project_id == project_id]
    if run_id is not None:
        where.append(ReproductionJob.run_id == get_run(session, project_id, run_id).id)
    if state is not None:
        where.append(ReproductionJob.state == state.value)
    total = session.scalar(select(func.count()).select_from(ReproductionJob).where(*where)) or 0
    jobs = session.scalars(
        select(ReproductionJob)
        .where(*where)
        .order_by(ReproductionJob.created_at.desc(), ReproductionJob.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return list(jobs), total


def request_cancel(session: Session, project_id: int, job_id: int) -> ReproductionJob:
    """A queued job is cancelled at once; a running one is marked, and its worker stops it at its next
    heartbeat (one whose lease has expired, its worker gone, is cancelled at once); a finished one
    cannot be cancelled (409).  The row is locked, so a worker claiming it at the same moment either
    claims it first (then it is running here) or skips it."""
    get_job(session, project_id, job_id)
    job = session.scalar(
        select(ReproductionJob).where(ReproductionJob.id == job_id).with_for_update().execution_options(
            populate_existing=True
        )
    )
    if job is None:  # deleted with its run in between
        raise JobNotFound(job_id)
    now = utcnow()
    if job.state == JobState.queued.value:
        job.state, job.finished_at, job.cancel_requested_at = JobState.cancelled.value, now, now
    elif job.state == JobState.running.value:
        job.cancel_requested_at = job.cancel_requested_at or now
        if job.lease_expires_at is not None and job.lease_expires_at < now:
            job.state, job.finished_at = JobState.cancelled.value, now
            job.error = f"cancelled; its worker {job.worker_id} had stopped heartbeating"
            job.worker_id = job.lease_expires_at = None
    else:
        raise JobFinished(job.id, job.state)
    session.flush()
    return job
