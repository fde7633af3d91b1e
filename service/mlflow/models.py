"""MLflow experiments and runs, each tied to a project and (runs) to a moeproxy run."""

from __future__ import annotations

from datetime import datetime

from moeproxy.service.db import Base, utcnow
from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class MlflowExperiment(Base):
    __tablename__ = "mlflow_experiments"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    artifact_location: Mapped[str] = mapped_column(String(512), default="")
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")
    tags: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class MlflowRun(Base):
    __tablename__ = "mlflow_runs"

    run_uuid: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("mlflow_experiments.id", ondelete="CASCADE"), index=True
    )
    run_name: Mapped[str] = mapped_column(String(256))
    user_id: Mapped[str] = mapped_column(String(256), default="")
    status: Mapped[str] = mapped_column(String(16), default="RUNNING")
    start_time: Mapped[int] = mapped_column(BigInteger)  # ms since the epoch, as MLflow sends it
    end_time: Mapped[int | None] = mapped_column(BigInteger)
    lifecycle_stage: Mapped[str] = mapped_column(String(16), default="active")
    params: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    tags: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
