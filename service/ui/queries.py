"""Read-only queries behind the pages (plain functions on a session)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from moeproxy.service.db import is_sqlite
from moeproxy.service.limits import fits_id
from moeproxy.service.metrics.models import MetricName
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


# PostgreSQL binary COPY rows of (int4 metric_id, int8 step, float8 value): a field count, then
# (length, data) per field; NULL never occurs because NaN is selected as the float8 'NaN'.
_PG_COPY_ROW = np.dtype(
    [("fields", ">i2"), ("l1", ">i4"), ("metric_id", ">i4"), ("l2", ">i4"), ("step", ">i8"), ("l3", ">i4"), ("value", ">f8")]
)
_PG_COPY_HEADER = 19  # signature (11) + flags (4) + header extension length (4)
_PG_COPY_TRAILER = 2  # int16 -1


def read_series(session: Session, run_id: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (steps, values) of every metric of the run, straight from the driver into numpy.

    The page reads whole runs (100,000 points for 5,000 steps x 20 metrics); building ORM rows
    for them costs more than the rest of the page together.  PostgreSQL: binary COPY parsed by
    numpy; SQLite: one cursor fetch.  NaN is stored as NULL (metrics/models.py) and comes back NaN.
    """
    ids = dict(session.execute(select(MetricName.id, MetricName.name).where(MetricName.run_id == run_id)).all())
    if not ids:
        return {}
    id_list = ",".join(str(int(i)) for i in ids)  # our own integer keys: safe to inline
    raw = session.connection().connection.dbapi_connection
    if is_sqlite(session):
        metric_col, steps, values = _read_sqlite(raw, id_list)
    else:
        metric_col, steps, values = _read_postgres(raw, id_list)
    if metric_col.size == 0:
        return {}
    # Sorted here, not in SQL: PostgreSQL sorts 100,000 rows on disk with the default work_mem.
    order = np.lexsort((steps, metric_col))
    metric_col, steps, values = metric_col[order], steps[order], values[order]
    bounds = np.flatnonzero(np.diff(metric_col)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [metric_col.size]])
    return {ids[int(metric_col[a])]: (steps[a:b].copy(), values[a:b].copy()) for a, b in zip(starts, ends, strict=True)}


def _read_sqlite(raw, id_list: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cursor = raw.cursor()
    try:
        cursor.execute(
            # id_list is our own integer keys joined by commas (read_series): nothing a client wrote.
            f"SELECT metric_id, step, value FROM metric_points WHERE metric_id IN ({id_list})"  # nosec B608
        )
        rows = cursor.fetchall()
    finally:
        cursor.close()
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    table = np.array(rows, dtype=np.float64)  # NULL -> NaN; steps stay exact below 2**53
    return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]


def _read_postgres(raw, id_list: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # id_list is our own integer keys (read_series), and COPY takes no bound parameters.
    sql = (
        "COPY (SELECT metric_id, step, COALESCE(value, 'NaN'::float8) FROM metric_points "  # nosec B608
        f"WHERE metric_id IN ({id_list})) TO STDOUT (FORMAT BINARY)"
    )
    with raw.cursor() as cursor, cursor.copy(sql) as copy:
        data = b"".join(bytes(chunk) for chunk in copy)
    rows = np.frombuffer(data, dtype=_PG_COPY_ROW, offset=_PG_COPY_HEADER,
                         count=(len(data) - _PG_COPY_HEADER - _PG_COPY_TRAILER) // _PG_COPY_ROW.itemsize)
    return rows["metric_id"].astype(np.int64), rows["step"].astype(np.int64), rows["value"].astype(np.float64)
