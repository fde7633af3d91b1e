"""Read-only queries behind the pages (plain functions on a session)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from moeproxy.service.metrics.models import MetricName
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from moeproxy.service.triage.models import TriageEvaluation
from moeproxy.service.triage.repository import as_utc
import numpy as np
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
    project: str | None = None,
    status: str | None = None,
    verdict: str | None = None,
    page: int = 1,
    per_page: int = 50,
) -> RunPage:
    """Runs newest first with their current verdict; ``verdict`` filters on the top class
    (or ``"none"`` for runs not evaluated yet)."""
    latest = _latest_evaluation_ids()
    query = (
        select(Run, Project.name, TriageEvaluation)
        .join(Project, Project.id == Run.project_id)
        .outerjoin(latest, latest.c.run_id == Run.id)
        .outerjoin(TriageEvaluation, TriageEvaluation.id == latest.c.eval_id)
    )
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


def project_names(session: Session) -> list[str]:
    return list(session.scalars(select(Project.name).order_by(Project.name)))


def verdict_classes(session: Session) -> list[str]:
    return [c for c in session.scalars(select(TriageEvaluation.top_class).distinct()) if c]


def get_run(session: Session, run_id: int) -> tuple[Run, str] | None:
    found = session.execute(
        select(Run, Project.name).join(Project, Project.id == Run.project_id).where(Run.id == run_id)
    ).first()
    return None if found is None else (found[0], found[1])


def read_series(session: Session, run_id: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (steps, values) of every metric of the run, straight from the driver into numpy.

    The page reads whole runs (100,000 points for 5,000 steps x 20 metrics); building ORM rows
    for them costs more than the rest of the page together.  NaN is stored as NULL
    (metrics/models.py): ``np.array(..., dtype=float)`` turns NULL back into NaN.
    """
    ids = dict(
        session.execute(select(MetricName.id, MetricName.name).where(MetricName.run_id == run_id)).all()
    )
    if not ids:
        return {}
    id_list = ",".join(str(int(i)) for i in ids)  # our own integer keys: safe to inline
    cursor = session.connection().connection.dbapi_connection.cursor()
    try:
        cursor.execute(
            f"SELECT metric_id, step, value FROM metric_points WHERE metric_id IN ({id_list}) ORDER BY metric_id, step"
        )
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return {}
    table = np.array(rows, dtype=np.float64)
    metric_col = table[:, 0].astype(np.int64)
    bounds = np.flatnonzero(np.diff(metric_col)) + 1
    out = {}
    for chunk_ids, chunk in zip(np.split(metric_col, bounds), np.split(table, bounds), strict=True):
        out[ids[int(chunk_ids[0])]] = (chunk[:, 1].astype(np.int64), chunk[:, 2].copy())
    return out
