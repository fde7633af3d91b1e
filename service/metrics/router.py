from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from moeproxy.service.aliases import repository as aliases
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import API_ERRORS, ErrorBody, UnsupportedMediaType
from moeproxy.service.limits import BODY_LIMIT_SCOPE_KEY, INT64_MAX, INT64_MIN
from moeproxy.service.metrics import codec, repository
from moeproxy.service.metrics.codec import INGEST_BODY_SCHEMA, encode_values, parse_ingest_body
from moeproxy.service.metrics.schemas import IngestResult, MetricNameOut, MetricNamesOut, MetricsOut
from moeproxy.service.runs import repository as runs

router = APIRouter(prefix="/api/v1/runs/{run_id}/metrics", tags=["metrics"], responses=API_ERRORS)


async def read_limited_body(request: Request) -> bytes:
    """The raw body, refused with 413 past MAX_BODY_BYTES before it is all read.

    The size limit and the read deadline are ``limits.BodyLimits``'s (this route only raises the
    limit to a metrics batch's); this runs before the request's database session is opened (see
    ``ingest_metrics``), so a client that sends its body slowly, or never, holds nothing.
    """
    content_type = request.headers.get("content-type", "application/json")
    if "json" not in content_type:
        raise UnsupportedMediaType(f"expected Content-Type application/json, got {content_type!r}")
    request.scope[BODY_LIMIT_SCOPE_KEY] = codec.MAX_BODY_BYTES
    return await request.body()


RawBody = Annotated[bytes, Depends(read_limited_body)]


@router.post(
    "",
    response_model=IngestResult,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": INGEST_BODY_SCHEMA}}}},
    responses={
        413: {"model": ErrorBody, "description": "more than 10,000 steps, 1,000,000 points or 64 MiB in one request"},
        415: {"model": ErrorBody, "description": "the body is not application/json"},
    },
)
def ingest_metrics(run_id: int, body: RawBody, project: ProjectDep, session: SessionDep) -> IngestResult:
    """Store points; idempotent on (run, metric, step): a re-sent point overwrites, never duplicates.

    Values may be numbers, the JSON literals ``NaN``/``Infinity``/``-Infinity`` or those strings.
    """
    run = runs.get_run_ref(session, project.id, run_id)
    batch = parse_ingest_body(body)
    return IngestResult(accepted=repository.ingest(session, run, batch))


@router.get("", response_model=MetricsOut)
def read_metrics(
    run_id: int,
    project: ProjectDep,
    session: SessionDep,
    names: Annotated[
        list[str] | None, Query(description="comma-separated metric names (the parameter may repeat)")
    ] = None,
    after_step: Annotated[int | None, Query(ge=INT64_MIN, le=INT64_MAX, description="only steps strictly after this one")] = None,
) -> Response:
    """The run's series; non-finite values as the strings "NaN", "Infinity", "-Infinity"."""
    runs.get_run(session, project.id, run_id)
    wanted = [n for part in names for n in part.split(",") if n] if names else None
    series = repository.read_metrics(session, run_id, names=wanted, after_step=after_step)
    content = {
        "metrics": {name: {"steps": steps, "values": encode_values(values)} for name, (steps, values) in series.items()}
    }
    # Non-finite values are strings by now, so any strict encoder is correct; orjson is the fast one.
    return Response(codec.dumps(content), media_type="application/json")


@router.get("/names", response_model=MetricNamesOut)
def metric_names(run_id: int, project: ProjectDep, session: SessionDep) -> MetricNamesOut:
    """The names the run has logged, each with its canonical name (SPEC section 4), the number of
    points held and the highest step."""
    run = runs.get_run(session, project.id, run_id)
    summaries = repository.metric_summaries(session, run.id)
    canonical = aliases.canonical_names(session, project.id, run.framework, list(summaries))
    return MetricNamesOut(names=[MetricNameOut(name=n, canonical=c, points=summaries[n][0], last_step=summaries[n][1])
                                 for n, c in canonical.items()])
