from __future__ import annotations

from fastapi import APIRouter, Query, Response, status
from moeproxy.service.aliases import repository
from moeproxy.service.aliases.schemas import AliasCreate, AliasList, AliasOut
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import API_ERRORS

router = APIRouter(prefix="/api/v1/aliases", tags=["aliases"], responses=API_ERRORS)


def _out(row) -> AliasOut:
    return AliasOut(
        framework=row.framework,
        name=row.name,
        canonical=row.canonical,
        scope="global" if row.project_id is None else "project",
    )


@router.get("", response_model=AliasList)
def list_aliases(
    project: ProjectDep, session: SessionDep, framework: str | None = Query(None, description="only this framework (and '*')")
) -> AliasList:
    """Global aliases (SPEC section 4, seeded) and this project's own."""
    return AliasList(aliases=[_out(r) for r in repository.list_aliases(session, project.id, framework=framework)])


@router.post(
    "",
    response_model=AliasOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": AliasOut, "description": "the project's alias existed and was replaced"}},
)
def add_alias(spec: AliasCreate, response: Response, project: ProjectDep, session: SessionDep) -> AliasOut:
    """Add (or replace) a project alias; it overrides a global alias of the same framework and name."""
    row, created = repository.add_alias(session, project.id, spec.framework, spec.name, spec.canonical)
    if not created:
        response.status_code = status.HTTP_200_OK
    return _out(row)
