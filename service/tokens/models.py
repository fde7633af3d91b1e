from __future__ import annotations

from datetime import datetime

from moeproxy.service.db import Base, UTCDateTime, utcnow
from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column, relationship


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="project", cascade="all, delete-orphan")


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    # hex SHA-256 of the whole token; the secret itself is never stored.
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the token, shown by `token list` to tell tokens apart.
    prefix: Mapped[str] = mapped_column(String(16))
    label: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    project: Mapped[Project] = relationship(back_populates="tokens")
