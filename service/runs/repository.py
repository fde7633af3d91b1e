"""Run storage.  Plain functions taking a session; they never commit."""

from __future__ import annotations

from dataclasses import dataclass

from moeproxy.service.errors import RunNotFound
from moeproxy.service.limits import fits_id
from moeproxy.service.metrics.models import MetricName, MetricPoint
from moeproxy.service.runs.models import Run, RunStatus
from moeproxy.service.runs.schemas import RunCreate, RunUpdate
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer


def get_run(session: Session, project_id: int, run_id: int) -> Run:
    """The run, if it belongs to ``project_id``; another project's run is as absent as a missing one."""
    # An id beyond the column's range cannot exist (and would fail inside the query on PostgreSQL).
    run = session.scalar(select(Run).where(Run.id == run_id, Run.project_id == project_id)) if fits_id(run_id) else None
    if run is None:
        raise RunNotFound(run_id)
    return run


@dataclass(frozen=True, slots=True)
class RunRef:
    id: int
    project_id: int
    framework: str | None


def get_run_ref(session: Session, project_id: int, run_id: int) -> RunRef:
    """:func:`get_run` without loading the row's JSON columns (the ingest hot path)."""
    if not fits_id(run_id):
        raise RunNotFound(run_id)
    row = session.execute(
        select(Run.id, Run.project_id, Run.framework).where(Run.id == run_id, Run.project_id == project_id)
    ).first()
    if row is None:
        raise RunNotFound(run_id)
    return RunRef(id=row[0], project_id=row[1], framework=row[2])


def get_run_by_name(session: Session, project_id: int, name: str) -> Run | None:
    return session.scalar(select(Run).where(Run.project_id == project_id, Run.name == name))


def get_or_create_run(session: Session, project_id: int, spec: RunCreate) -> tuple[Run, bool]:
    """``(run, created)``.  An existing run of that name resumes: it is marked running again and
    fields it lacks (framework, model, model_uri) are filled in; its config and tags are kept."""
    run = get_run_by_name(session, project_id, spec.name)
    if run is None:
        candidate = Run(
            project_id=project_id,
            name=spec.name,
            framework=spec.framework,
            model=spec.model,
            model_uri=spec.model_uri,
            tags=list(spec.tags),
            config=dict(spec.config),
            status=RunStatus.running.value,
        )
        try:
            with session.begin_nested():  # two jobs registering the same name at once
                session.add(candidate)
            return candidate, True
        except IntegrityError:
            run = get_run_by_name(session, project_id, spec.name)
            if run is None:
                raise
    if run.status != RunStatus.running.value:
        run.status = RunStatus.running.value
    run.framework = run.framework or spec.framework
    run.model = run.model or spec.model
    run.model_uri = run.model_uri or spec.model_uri
    session.flush()
    return run, False


def list_runs(session: Session, project_id: int, *, limit: int = 50, offset: int = 0) -> tuple[list[Run], int]:
    """Newest first, with the total count for pagination (configs are not loaded: lists leave them out)."""
    total = session.scalar(select(func.count()).select_from(Run).where(Run.project_id == project_id)) or 0
    runs = session.scalars(
        select(Run)
        .options(defer(Run.config, raiseload=True))
        .where(Run.project_id == project_id)
        .order_by(Run.created_at.desc(), Run.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return list(runs), total


def update_run(session: Session, project_id: int, run_id: int, patch: RunUpdate) -> Run:
    run = get_run(session, project_id, run_id)
    for field, value in patch.model_dump(exclude_unset=True).items():
        if value is None and field in ("status", "tags", "config"):
            continue  # explicit null on a non-nullable field means "leave as is"
        setattr(run, field, value.value if isinstance(value, RunStatus) else value)
    session.flush()
    return run


def delete_run(session: Session, project_id: int, run_id: int) -> None:
    """Delete a run with its metrics (metric_points has no FK cascade: see metrics/models.py)."""
    run = get_run(session, project_id, run_id)
    metric_ids = select(MetricName.id).where(MetricName.run_id == run.id).scalar_subquery()
    session.execute(delete(MetricPoint).where(MetricPoint.metric_id.in_(metric_ids)))
    session.execute(delete(MetricName).where(MetricName.run_id == run.id))
    session.delete(run)
    session.flush()
