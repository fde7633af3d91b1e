from __future__ import annotations

from fastapi import APIRouter
from moeproxy.service.auth import ProjectDep
from moeproxy.service.errors import API_ERRORS
from moeproxy.service.tokens.schemas import WhoAmI

router = APIRouter(prefix="/api/v1", tags=["tokens"], responses=API_ERRORS)


@router.get("/whoami", response_model=WhoAmI)
def whoami(project: ProjectDep) -> WhoAmI:
    """The project this token belongs to (a cheap way for a client to check its token)."""
    return WhoAmI(project=project.name, project_id=project.id)
