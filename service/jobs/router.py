"""``/api/v1/jobs``: reproduction jobs of the token's project (issue 18)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import API_ERRORS, ErrorBody
from moeproxy.service.jobs import repository
from moeproxy.service.jobs.models import JobState
from moeproxy.service.jobs.schemas import JobCreate, JobList, JobOut
from moeproxy.service.limits import INT32_MAX

router = APIRouter(
    prefix="/api/v1/jobs",
    tags=["jobs"],
    responses={**API_ERRORS, 409: {"model": ErrorBody, "description": "not possible in the job's or run's state"}},
)


@router.post("", response_model=JobOut, status_code=status.HTTP_201_CREATED)
def create_job(spec: JobCreate, request: Request, project: ProjectDep, session: SessionDep) -> JobOut:
    """Queue a reproduction of a run's fault on a proxy of the run's ``model_uri``.

    409 when the run has no ``model_uri``, a job for the run and its model is already open, or the
    project has its maximum of open jobs (``MOEPROXY_JOB_MAX_OPEN_PER_PROJECT``).
    """
    job = repository.create_job(
        session,
        project.id,
        repository.JobRequest(
            run_id=spec.run_id,
            classes=spec.classes,
            steps=spec.steps,
            seeds=spec.seeds,
            keep_ratio=spec.keep_ratio,
            method=spec.method,
            grid={"engine": spec.engine} if spec.engine else None,
        ),
        request.app.state.settings,
    )
    return JobOut.of(job)


@router.get("", response_model=JobList)
def list_jobs(
    project: ProjectDep,
    session: SessionDep,
    run_id: Annotated[int | None, Query(ge=1, le=INT32_MAX, description="only this run's jobs")] = None,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=INT32_MAX),
) -> JobList:
    """The project's jobs, newest first."""
    jobs, total = repository.list_jobs(session, project.id, run_id=run_id, state=state, limit=limit, offset=offset)
    return JobList(jobs=[JobOut.of(j) for j in jobs], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: int, project: ProjectDep, session: SessionDep) -> JobOut:
    return JobOut.of(repository.get_job(session, project.id, job_id))


@router.post("/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: int, project: ProjectDep, session: SessionDep) -> JobOut:
    """A queued job is cancelled at once; a running one gets ``cancel_requested`` and its worker
    stops it at its next heartbeat; a finished one answers 409."""
    return JobOut.of(repository.request_cancel(session, project.id, job_id))
