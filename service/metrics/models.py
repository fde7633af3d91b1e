"""Two tables keep the points narrow: a metric is (run, name) -> id, a point is (metric id, step, value).

NaN: PostgreSQL stores it exactly in ``double precision``; SQLite cannot (a NaN
float becomes NULL on the way in), so there NaN is stored as NULL.  A point is
only stored when it was logged, so NULL has no other meaning, and readers treat
NULL as NaN on both backends.  ±inf are stored as IEEE infinities on both.
Use :func:`moeproxy.service.metrics.repository.read_metrics` (or
``read_metric_arrays``) rather than raw SQL to get floats back.
"""

from __future__ import annotations

from moeproxy.service.db import Base
from sqlalchemy import BigInteger, Double, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class MetricName(Base):
    __tablename__ = "metric_names"
    __table_args__ = (UniqueConstraint("run_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(512))


class MetricPoint(Base):
    __tablename__ = "metric_points"
    # The composite primary key is the idempotency key (run, metric, step) and the read index;
    # on SQLite the table is WITHOUT ROWID so the key is the table.
    __table_args__ = {"sqlite_with_rowid": False}

    # Deliberately no foreign key: the per-row FK check halved PostgreSQL ingest
    # throughput (measured: 69k -> 128k points/s for 2,000-point upserts).  Points
    # are deleted with their run by the runs repository, and metric ids only come
    # from metric_names rows written in the same transaction.
    metric_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    value: Mapped[float | None] = mapped_column(Double)
