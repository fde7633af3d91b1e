"""Projects and bearer tokens.

A token is ``mpx_`` + 32 random bytes (url-safe base64, 256 bits of entropy
from :mod:`secrets`).  Only its SHA-256 is stored.  A slow password hash
(bcrypt, argon2) exists to make guessing *low-entropy* human passwords
expensive; a 256-bit random secret cannot be guessed whatever the hash, so a
fast hash loses nothing and keeps the per-request lookup to one indexed
equality match.  A stolen database therefore yields no usable token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from moeproxy.service.db import utcnow
from moeproxy.service.errors import InvalidInput, NotFound
from moeproxy.service.tokens.models import ApiToken, Project
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

TOKEN_PREFIX = "mpx_"
_SHOWN_PREFIX_LEN = 12
PROJECT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def validate_project_name(name: str) -> str:
    if not PROJECT_NAME_RE.match(name):
        raise InvalidInput(
            f"invalid project name {name!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def get_project(session: Session, name: str) -> Project | None:
    return session.scalar(select(Project).where(Project.name == name))


def get_or_create_project(session: Session, name: str) -> Project:
    validate_project_name(name)
    project = get_project(session, name)
    if project is not None:
        return project
    try:
        with session.begin_nested():
            project = Project(name=name)
            session.add(project)
        return project
    except IntegrityError:
        project = get_project(session, name)
        if project is None:
            raise
        return project


def create_token(session: Session, project_name: str, *, label: str | None = None) -> tuple[ApiToken, str]:
    """A new token for the project (created if new).  Returns the row and the secret, shown once."""
    project = get_or_create_project(session, project_name)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken(project_id=project.id, token_hash=hash_token(secret), prefix=secret[:_SHOWN_PREFIX_LEN], label=label)
    session.add(token)
    session.flush()
    return token, secret


def list_tokens(session: Session, project_name: str | None = None, *, include_revoked: bool = False) -> list[ApiToken]:
    query = select(ApiToken).join(Project).order_by(Project.name, ApiToken.id)
    if project_name is not None:
        query = query.where(Project.name == project_name)
    if not include_revoked:
        query = query.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(query).all())


def revoke_token(session: Session, ref: str) -> ApiToken:
    """Revoke by numeric id, by the shown prefix, or by the full secret."""
    query = select(ApiToken)
    if ref.isdigit():
        query = query.where(ApiToken.id == int(ref))
    elif len(ref) > _SHOWN_PREFIX_LEN:
        query = query.where(ApiToken.token_hash == hash_token(ref))
    else:
        query = query.where(ApiToken.prefix == ref)
    matches = list(session.scalars(query).all())
    if not matches:
        raise NotFound(f"no token matches {ref!r}")
    if len(matches) > 1:
        raise InvalidInput(f"{ref!r} matches {len(matches)} tokens: revoke by id")
    token = matches[0]
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        session.flush()
    return token


@dataclass(frozen=True, slots=True)
class ProjectRef:
    """The authenticated project of a request (what handlers need, without an ORM load)."""

    id: int
    name: str


def authenticate_ref(session: Session, secret: str) -> ProjectRef | None:
    """Like :func:`authenticate`, as a plain ``(id, name)`` row: the per-request hot path."""
    row = session.execute(
        select(Project.id, Project.name)
        .join(ApiToken, ApiToken.project_id == Project.id)
        .where(ApiToken.token_hash == hash_token(secret), ApiToken.revoked_at.is_(None))
    ).first()
    return None if row is None else ProjectRef(id=row[0], name=row[1])

