"""The ``reproduction_jobs`` table: one row per requested reproduction of a run's fault.

A job is *open* while ``queued`` or ``running``; at most one open job per (run, model) is enforced
by a partial unique index, so two creations racing on one run cannot both succeed.  The lease
columns (``worker_id``, ``lease_expires_at``, ``heartbeat_at``, ``attempts``) belong to the queue
(:mod:`moeproxy.service.jobs.queue`): a job is a worker's only while its lease holds, and
``attempts`` (the number of claims) is the fence a completion must present.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from moeproxy.service.db import Base, UTCDateTime, utcnow
from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column


class JobState(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


OPEN_STATES: tuple[str, ...] = (JobState.queued.value, JobState.running.value)
FINISHED_STATES: tuple[str, ...] = (JobState.succeeded.value, JobState.failed.value, JobState.cancelled.value)


class JobTrigger(enum.StrEnum):
    manual = "manual"  # POST /api/v1/jobs
    weak_twice = "weak_twice"  # two evaluations in a row weak
    ended_weak = "ended_weak"  # the run ended with a weak verdict


_OPEN_WHERE = text("state IN ('queued', 'running')")


class ReproductionJob(Base):
    __tablename__ = "reproduction_jobs"
    __table_args__ = (
        Index("ix_reproduction_jobs_project_id_created_at", "project_id", "created_at"),
        Index("ix_reproduction_jobs_run_id", "run_id"),
        Index("ix_reproduction_jobs_state_created_at", "state", "created_at"),
        Index(
            "uq_reproduction_jobs_open_run_model",
            "run_id",
            "model_uri",
            unique=True,
            postgresql_where=_OPEN_WHERE,
            sqlite_where=_OPEN_WHERE,
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model_uri: Mapped[str] = mapped_column(Text)
    # The proxy spec: a proxy_builder method name and the fraction of routed experts kept.
    method: Mapped[str] = mapped_column(String(64))
    keep_ratio: Mapped[float] = mapped_column(Float)
    classes: Mapped[list[str]] = mapped_column(JSON)
    grid: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    seeds: Mapped[list[int]] = mapped_column(JSON)
    steps: Mapped[int] = mapped_column(Integer)
    trigger: Mapped[str] = mapped_column(String(32), default=JobTrigger.manual.value)
    state: Mapped[str] = mapped_column(String(16), default=JobState.queued.value)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    worker_id: Mapped[str | None] = mapped_column(String(256))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    device_hours: Mapped[float | None] = mapped_column(Float)
    planner_estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
