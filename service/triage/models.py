"""Stored evaluations and the per-class history of a run's triage.

An evaluation whose outcome (verdict, ranking of the top classes, each class's strength) is the
same as the run's latest stored one is folded into it (scores, step and time refreshed,
``evaluations`` counted) rather than stored again: a live run is evaluated every few seconds for
days, and the history that matters is when the outcome changed.  ``triage_class_history`` keeps,
per class, when it first became likely (``strong``) and when it was first ranked first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from moeproxy.service.db import Base, utcnow
from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column


class TriageEvaluation(Base):
    __tablename__ = "triage_evaluations"
    __table_args__ = (Index("ix_triage_evaluations_run_id_id", "run_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    first_evaluated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    evaluated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    evaluations: Mapped[int] = mapped_column(Integer, default=1)
    last_step: Mapped[int | None] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(512))
    top_class: Mapped[str | None] = mapped_column(String(128), index=True)
    top_score: Mapped[float] = mapped_column(Float)
    top_strength: Mapped[str] = mapped_column(String(16))
    outcome_key: Mapped[str] = mapped_column(String(64))
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class TriageClassHistory(Base):
    __tablename__ = "triage_class_history"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    fault_class: Mapped[str] = mapped_column(String(128), primary_key=True)
    first_likely_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_likely_step: Mapped[int | None] = mapped_column(Integer)
    first_top_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_top_step: Mapped[int | None] = mapped_column(Integer)
    last_score: Mapped[float] = mapped_column(Float)
    last_strength: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
