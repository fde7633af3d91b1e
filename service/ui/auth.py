"""Who may see the pages (SPEC section 5): a login by default, per project.

A browser logs in with one of:

* a project's API token (``moeproxy token create``): it sees that project's runs only;
* ``MOEPROXY_UI_TOKEN``, the operator's login: it sees every project;
* a one-time login link (``moeproxy token login-link``, printed by ``serve --demo``): the code
  travels in the URL *fragment* (``/login#code=...``), which browsers never send, so it cannot end
  up in an access log; the login page's script posts it like a token, and it works once.

A login creates a server-side session (``ui_sessions``): the cookie holds a random secret whose
hash is stored, so logging out (or revoking the API token it was made with) ends it for good.
``MOEPROXY_PUBLIC_UI=1`` (``moeproxy serve --public-ui``) opts out: every page open to anyone who
can reach the port, every project visible, for a laptop.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from fastapi import Request
from moeproxy.service.db import utcnow
from moeproxy.service.errors import InvalidInput
from moeproxy.service.tokens import repository as tokens
from moeproxy.service.tokens.models import ApiToken, Project
from moeproxy.service.ui.models import LoginLink, UiSession
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

COOKIE = "moeproxy_ui"
SESSION_PREFIX = "mps_"
LINK_PREFIX = "mpl_"
SESSION_MAX_AGE = timedelta(days=14)
LINK_MAX_AGE = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: a project (its runs only), or everyone's runs (operator or public pages)."""

    project_id: int | None
    project_name: str | None
    session_id: int | None  # None on public pages: there is nothing to log out of

    @property
    def sees_all(self) -> bool:
        return self.project_id is None


PUBLIC = Viewer(project_id=None, project_name=None, session_id=None)


def is_public(request: Request) -> bool:
    return bool(request.app.state.settings.public_ui)


def operator_token(request: Request) -> str | None:
    return request.app.state.settings.ui_token or None


def _new_secret(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def start_session(session: Session, *, project_id: int | None, token_id: int | None) -> str:
    """A new browser session; returns the cookie's secret (only its hash is stored)."""
    secret = _new_secret(SESSION_PREFIX)
    now = utcnow()
    session.add(
        UiSession(
            secret_hash=tokens.hash_token(secret),
            project_id=project_id,
            token_id=token_id,
            created_at=now,
            expires_at=now + SESSION_MAX_AGE,
        )
    )
    session.flush()
    return secret


def viewer_of(session: Session, secret: str | None) -> Viewer | None:
    """The viewer a session cookie stands for, or None (unknown, expired, logged out, token revoked)."""
    if not secret or not secret.startswith(SESSION_PREFIX):
        return None
    row = session.execute(
        select(UiSession.id, UiSession.project_id, Project.name)
        .outerjoin(Project, Project.id == UiSession.project_id)
        .outerjoin(ApiToken, ApiToken.id == UiSession.token_id)
        .where(
            UiSession.secret_hash == tokens.hash_token(secret),
            UiSession.revoked_at.is_(None),
            UiSession.expires_at > utcnow(),
            or_(UiSession.token_id.is_(None), ApiToken.revoked_at.is_(None)),
        )
    ).first()
    if row is None:
        return None
    return Viewer(project_id=row.project_id, project_name=row.name, session_id=row.id)


def end_session(session: Session, secret: str | None) -> None:
    if secret:
        session.execute(
            update(UiSession)
            .where(UiSession.secret_hash == tokens.hash_token(secret), UiSession.revoked_at.is_(None))
            .values(revoked_at=utcnow())
        )


def create_login_link(
    session: Session, project_name: str | None, *, label: str | None = None, max_age: timedelta = LINK_MAX_AGE
) -> str:
    """A one-time login code: for ``project_name``'s runs, or every project's when None."""
    project_id = None
    if project_name is not None:
        project = tokens.get_project(session, project_name)
        if project is None:
            raise InvalidInput(f"no project {project_name!r}: create a token for it first")
        project_id = project.id
    code = _new_secret(LINK_PREFIX)
    now = utcnow()
    session.add(
        LoginLink(
            code_hash=tokens.hash_token(code),
            project_id=project_id,
            label=label,
            created_at=now,
            expires_at=now + max_age,
        )
    )
    session.flush()
    return code


def _redeem_link(session: Session, code: str) -> str | None:
    now = utcnow()
    link = session.execute(
        select(LoginLink.id, LoginLink.project_id).where(
            LoginLink.code_hash == tokens.hash_token(code), LoginLink.used_at.is_(None), LoginLink.expires_at > now
        )
    ).first()
    if link is None:
        return None
    # Claimed by a conditional UPDATE: two browsers racing for one code cannot both win.
    claimed = session.execute(
        update(LoginLink).where(LoginLink.id == link.id, LoginLink.used_at.is_(None)).values(used_at=now)
    )
    if claimed.rowcount != 1:
        return None
    return start_session(session, project_id=link.project_id, token_id=None)


def log_in(request: Request, session: Session, credential: str) -> str | None:
    """The new session's secret for a valid credential (operator token, login code, API token), or None."""
    credential = credential.strip()
    if not credential:
        return None
    operator = operator_token(request)
    if operator is not None and hmac.compare_digest(credential.encode(), operator.encode()):
        return start_session(session, project_id=None, token_id=None)
    if credential.startswith(LINK_PREFIX):
        return _redeem_link(session, credential)
    found = session.execute(
        select(ApiToken.id, ApiToken.project_id).where(
            ApiToken.token_hash == tokens.hash_token(credential), ApiToken.revoked_at.is_(None)
        )
    ).first()
    if found is None:
        return None
    return start_session(session, project_id=found.project_id, token_id=found.id)


def safe_next(target: str | None) -> str:
    # Only same-site paths: "/runs/1" yes, "//evil.example", "/\\evil.example" and "https://..." no.
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def client_key(request: Request) -> str:
    """The address failed logins are counted against (the socket peer; behind a proxy, the proxy's
    own address unless uvicorn is told to trust ``X-Forwarded-For`` with ``--forwarded-allow-ips``)."""
    return request.client.host if request.client else "unknown"
