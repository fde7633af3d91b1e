"""Page logins: a browser session per login, and one-time login links.

Only SHA-256 hashes of the secrets are stored (as for API tokens). A session made with a project's
API token remembers the token, so revoking the token ends the session too; a session with no
project is an operator's (``MOEPROXY_UI_TOKEN``) and sees every project.
"""

from __future__ import annotations

from datetime import datetime

from moeproxy.service.db import Base, UTCDateTime, utcnow
from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column


class UiSession(Base):
    __tablename__ = "ui_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # NULL: an operator session (every project).
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LoginLink(Base):
    __tablename__ = "ui_login_links"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    label: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
