"""``GET /api/v1/runs/{id}/triage`` (SPEC section 5) and its history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import API_ERRORS
from moeproxy.service.runs import repository as runs
from moeproxy.service.triage import repository
from moeproxy.service.triage.live import get_engine
from moeproxy.service.triage.schemas import TriageResponse
from moeproxy.service.triage.service import evaluate_run
from pydantic import BaseModel

router = APIRouter(prefix="/api/v1/runs/{run_id}/triage", tags=["triage"], responses=API_ERRORS)


def _public(result: TriageResponse, details: bool) -> TriageResponse:
    return result if details else result.model_copy(update={"details": {}})


@router.get("", response_model=TriageResponse)
def get_triage(
    run_id: int,
    request: Request,
    project: ProjectDep,
    session: SessionDep,
    details: Annotated[
        bool, Query(description="add change points, expected shapes and per-metric scores")
    ] = False,
) -> TriageResponse:
    """The latest evaluation: candidates ranked (``healthy`` is a class), strength, evidence, verdict.

    Live triage re-evaluates a run in the background as metrics arrive; a run not evaluated yet is
    evaluated now.
    """
    run = runs.get_run(session, project.id, run_id)
    row = repository.latest(session, run.id)
    if row is None:
        result, _alerts = evaluate_run(session, run, get_engine(request.app), request.app.state.settings)
        return _public(result, details)
    return _public(repository.to_response(session, row), details)


@router.post("", response_model=TriageResponse)
def evaluate_now(
    run_id: int,
    request: Request,
    project: ProjectDep,
    session: SessionDep,
    details: Annotated[bool, Query()] = False,
) -> TriageResponse:
    """Evaluate the run now (outside the live schedule) and store the result."""
    run = runs.get_run(session, project.id, run_id)
    result, _alerts = evaluate_run(session, run, get_engine(request.app), request.app.state.settings)
    return _public(result, details)


class OutcomeChange(BaseModel):
    first_evaluated_at: str
    evaluated_at: str
    evaluations: int
    last_step: int | None
    verdict: str
    top_score: float
    top_strength: str


class TriageHistory(BaseModel):
    run_id: int
    changes: list[OutcomeChange]


@router.get("/history", response_model=TriageHistory)
def get_history(
    run_id: int, project: ProjectDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> TriageHistory:
    """The run's outcome changes, newest first (an unchanged outcome is folded into one entry)."""
    run = runs.get_run(session, project.id, run_id)
    return TriageHistory(
        run_id=run.id,
        changes=[
            OutcomeChange(
                first_evaluated_at=repository.as_utc(r.first_evaluated_at).isoformat(),
                evaluated_at=repository.as_utc(r.evaluated_at).isoformat(),
                evaluations=r.evaluations,
                last_step=r.last_step,
                verdict=r.verdict,
                top_score=r.top_score,
                top_strength=r.top_strength,
            )
            for r in repository.evaluations(session, run.id, limit)
        ],
    )
