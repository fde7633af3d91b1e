"""Bearer-token authentication for ``/api/v1`` (SPEC section 5)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from moeproxy.service.errors import NotAuthenticated
from moeproxy.service.tokens import repository as tokens
from moeproxy.service.tokens.repository import ProjectRef
from sqlalchemy.orm import Session

_bearer = HTTPBearer(auto_error=False, description="a token from `moeproxy token create --project NAME`")


def get_session(request: Request):
    """The request's unit of work (commits before the response is sent; see ``SessionDep``)."""
    with request.app.state.database.scope() as session:
        yield session


# scope="function": the commit runs when the handler returns, *before* the response
# goes out, so a client that saw 200 can read its points back at once.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def current_project(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ProjectRef:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise NotAuthenticated("missing bearer token: send 'Authorization: Bearer <token>'")
    project = tokens.authenticate_ref(session, credentials.credentials)
    if project is None:
        raise NotAuthenticated("invalid or revoked token")
    return project


# The token's project as a frozen (id, name): handlers scope every query by ``project.id``.
ProjectDep = Annotated[ProjectRef, Depends(current_project)]
