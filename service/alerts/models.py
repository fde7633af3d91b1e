"""The alert outbox: one row per (run, class, level, channel); the unique key is the no-duplicate rule."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from moeproxy.service.db import Base, utcnow
from sqlalchemy import JSON, DateTime, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column


class OutboxStatus(enum.StrEnum):
    pending = "pending"  # waiting for its next attempt (next_attempt_at)
    sending = "sending"  # claimed by a worker until lease_until (a crashed worker's claim expires)
    sent = "sent"
    dead = "dead"  # the receiver refused it for good (4xx), or attempts ran out


class AlertOutbox(Base):
    __tablename__ = "alert_outbox"
    __table_args__ = (
        UniqueConstraint("run_id", "fault_class", "level", "channel"),
        Index("ix_alert_outbox_status_next_attempt_at", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    fault_class: Mapped[str] = mapped_column(String(128))
    level: Mapped[int] = mapped_column(Integer)
    channel: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=OutboxStatus.pending.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
