from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response, status
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import API_ERRORS
from moeproxy.service.jobs import auto as auto_jobs
from moeproxy.service.limits import INT32_MAX
from moeproxy.service.runs import repository
from moeproxy.service.runs.schemas import RunCreate, RunList, RunOut, RunSummary, RunUpdate

router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=API_ERRORS)


@router.post(
    "",
    response_model=RunOut,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": RunOut, "description": "a run of that name already exists; it resumes"}},
)
def create_run(spec: RunCreate, response: Response, project: ProjectDep, session: SessionDep) -> RunOut:
    """Register a run; the same name in the same project returns the existing run (200)."""
    run, created = repository.get_or_create_run(session, project.id, spec)
    if not created:
        response.status_code = status.HTTP_200_OK
    return RunOut.model_validate(run)


@router.get("", response_model=RunList)
def list_runs(
    project: ProjectDep,
    session: SessionDep,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=INT32_MAX),
) -> RunList:
    """The project's runs, newest first (without their configs: read one run for that)."""
    runs, total = repository.list_runs(session, project.id, limit=limit, offset=offset)
    return RunList(runs=[RunSummary.model_validate(r) for r in runs], total=total, limit=limit, offset=offset)


@router.get("/{run_id}", response_model=RunOut)
def get_run(run_id: int, project: ProjectDep, session: SessionDep) -> RunOut:
    return RunOut.model_validate(repository.get_run(session, project.id, run_id))


@router.patch("/{run_id}", response_model=RunOut)
def update_run(
    run_id: int, patch: RunUpdate, request: Request, project: ProjectDep, session: SessionDep
) -> RunOut:
    """Change a run's status (running/finished/failed/crashed), tags, config, framework, model or
    model_uri.  A run that ends weak gets a reproduction job (when it has a model_uri)."""
    previous_status = repository.get_run(session, project.id, run_id).status
    run = repository.update_run(session, project.id, run_id, patch)
    auto_jobs.after_status_change(session, run, previous_status, request.app.state.settings)
    return RunOut.model_validate(run)


@router.delete("/{run_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_run(run_id: int, project: ProjectDep, session: SessionDep) -> Response:
    """Delete a run and all its metrics."""
    repository.delete_run(session, project.id, run_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
