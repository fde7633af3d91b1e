"""Read-only queries behind the pages (plain functions on a session)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from moeproxy.service.limits import fits_id
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from moeproxy.service.triage.models import TriageEvaluation
from moeproxy.service.triage.repository import as_utc
from sqlalchemy import func, select
from sqlalchemy.orm import Session


@dataclass(frozen=True, slots=True)
class RunRow:
    id: int
    name: str
    project: str
    framework: str | None
    model: str | None
    status: str
    created_at: datetime
    top_class: str | None
    top_score: float | None
    top_strength: str | None
    verdict: str | None
    evaluated_at: datetime | None
    last_step: int | None


@dataclass(frozen=True, slots=True)
class RunPage:
    rows: list[RunRow]
    total: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))


def _latest_evaluation_ids():
    return (
        select(TriageEvaluation.run_id, func.max(TriageEvaluation.id).label("eval_id"))
        .group_by(TriageEvaluation.run_id)
        .subquery()
    )


def list_runs(
    session: Session,
    *,
    project_id: int | None = None,
    project: str | None = None,
    status: str | None = None,
    verdict: str | None = None,
    page: int = 1,
    per_page: int = 50,
) -> RunPage:
    """Runs newest first with their current verdict; ``project_id`` is the viewer's project (None:
    every project), ``verdict`` filters on the top class (or ``"none"`` for runs not evaluated yet)."""
    latest = _latest_evaluation_ids()
    query = (
        select(Run, Project.name, TriageEvaluation)
        .join(Project, Project.id == Run.project_id)
        .outerjoin(latest, latest.c.run_id == Run.id)
        .outerjoin(TriageEvaluation, TriageEvaluation.id == latest.c.eval_id)
    )
    if project_id is not None:
        query = query.where(Run.project_id == project_id)
    if project:
        query = query.where(Project.name == project)
    if status:
        query = query.where(Run.status == status)
    if verdict == "none":
        query = query.where(TriageEvaluation.id.is_(None))
    elif verdict:
        query = query.where(TriageEvaluation.top_class == verdict)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(
        query.order_by(Run.created_at.desc(), Run.id.desc()).limit(per_page).offset((page - 1) * per_page)
    ).all()
    return RunPage(
        rows=[
            RunRow(
                id=run.id,
                name=run.name,
                project=project_name,
                framework=run.framework,
                model=run.model,
                status=run.status,
                created_at=as_utc(run.created_at),
                top_class=ev.top_class if ev else None,
                top_score=ev.top_score if ev else None,
                top_strength=ev.top_strength if ev else None,
                verdict=ev.verdict if ev else None,
                evaluated_at=as_utc(ev.evaluated_at) if ev else None,
                last_step=ev.last_step if ev else None,
            )
            for run, project_name, ev in rows
        ],
        total=total,
        page=page,
        per_page=per_page,
    )


def project_names(session: Session, *, project_id: int | None = None) -> list[str]:
    query = select(Project.name).order_by(Project.name)
    if project_id is not None:
        query = query.where(Project.id == project_id)
    return list(session.scalars(query))


def verdict_classes(session: Session, *, project_id: int | None = None) -> list[str]:
    query = select(TriageEvaluation.top_class).distinct()
    if project_id is not None:
        query = query.join(Run, Run.id == TriageEvaluation.run_id).where(Run.project_id == project_id)
    return [c for c in session.scalars(query) if c]


def get_run(session: Session, run_id: int, *, project_id: int | None = None) -> tuple[Run, str] | None:
    """The run and its project's name; None when absent or not the viewer's (``project_id``)."""
    if not fits_id(run_id):
        return None
    query = select(Run, Project.name).join(Project, Project.id == Run.project_id).where(Run.id == run_id)
    if project_id is not None:
        query = query.where(Run.project_id == project_id)
    found = session.execute(query).first()
    return None if found is None else (found[0], found[1])


@dataclass(frozen=True, slots=True)
class JobRow:
    """One reproduction job as the pages show it (service/jobs)."""

    id: int
    run_id: int
    run_name: str
    project: str
    state: str
    trigger: str
    classes: list[str]
    progress: dict
    result: dict | None
    error: str | None
    device_hours: float | None
    created_at: datetime
    finished_at: datetime | None
    planner_estimate: dict | None = None

    @property
    def error_line(self) -> str | None:
        return self.error.splitlines()[0] if self.error else None

    @property
    def retriage(self) -> dict:
        return (self.result or {}).get("retriage") or {}

    @property
    def consistency(self) -> dict:
        """The check of the reproduction the run now matches against the run (executor._consistency)."""
        return (self.result or {}).get("consistency") or {}

    @property
    def devices(self) -> dict:
        """The planner's device counts for one reproduction: {"proxy": n, "original": m}."""
        return (self.planner_estimate or {}).get("devices") or {}


@dataclass(frozen=True)
class JobDetail:
    """One job's page: its row as the tables show it, and the spec and attempts behind it."""

    row: JobRow
    model_uri: str
    method: str
    keep_ratio: float
    seeds: list[int]
    steps: int
    engine: dict
    attempts: int
    worker_id: str | None
    started_at: datetime | None
    cancel_requested: bool


def get_job(session: Session, job_id: int, *, project_id: int | None = None) -> JobDetail | None:
    """The job if the viewer may see it (``project_id`` None: any project's)."""
    from moeproxy.service.jobs.models import ReproductionJob

    if not fits_id(job_id):
        return None
    job = session.get(ReproductionJob, job_id)
    if job is None or (project_id is not None and job.project_id != project_id):
        return None  # another project's job is as absent as a missing one
    (row,) = list_jobs(session, job_id=job.id)
    return JobDetail(row, job.model_uri, job.method, job.keep_ratio, list(job.seeds), job.steps,
                     dict((job.grid or {}).get("engine") or {}), job.attempts, job.worker_id,
                     as_utc(job.started_at) if job.started_at else None, job.cancel_requested_at is not None)


def list_jobs(session: Session, *, project_id: int | None = None, run_id: int | None = None,
              job_id: int | None = None, limit: int = 100) -> list[JobRow]:
    """Reproduction jobs the viewer may see (``project_id`` None: every project), newest first."""
    from moeproxy.service.jobs.models import ReproductionJob

    query = (select(ReproductionJob, Run.name, Project.name)
             .join(Run, Run.id == ReproductionJob.run_id)
             .join(Project, Project.id == ReproductionJob.project_id)
             .order_by(ReproductionJob.created_at.desc(), ReproductionJob.id.desc())
             .limit(limit))
    if project_id is not None:
        query = query.where(ReproductionJob.project_id == project_id)
    if run_id is not None:
        query = query.where(ReproductionJob.run_id == run_id)
    if job_id is not None:
        query = query.where(ReproductionJob.id == job_id)
    return [JobRow(j.id, j.run_id, run_name, project, j.state, j.trigger, list(j.classes), dict(j.progress or {}),
                   j.result, j.error, j.device_hours, as_utc(j.created_at),
                   as_utc(j.finished_at) if j.finished_at else None, j.planner_estimate)
            for j, run_name, project in session.execute(query)]
