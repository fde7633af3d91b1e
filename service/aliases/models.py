from __future__ import annotations

from datetime import datetime

from moeproxy.service.db import Base, UTCDateTime, utcnow
from sqlalchemy import ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column


class MetricAliasRow(Base):
    """framework metric name -> canonical name.  ``project_id`` NULL = global (seeded by migrations)."""

    __tablename__ = "metric_aliases"
    __table_args__ = (
        # NULL project ids are distinct in a plain unique constraint, so global and
        # per-project uniqueness are two partial indexes (both backends support them).
        Index(
            "uq_metric_aliases_global",
            "framework",
            "name",
            unique=True,
            sqlite_where=text("project_id IS NULL"),
            postgresql_where=text("project_id IS NULL"),
        ),
        Index(
            "uq_metric_aliases_project",
            "project_id",
            "framework",
            "name",
            unique=True,
            sqlite_where=text("project_id IS NOT NULL"),
            postgresql_where=text("project_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    framework: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(512))
    canonical: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
