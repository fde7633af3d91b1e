"""``/mlflow/api/2.0/mlflow/...``: the MLflow tracking calls a training job makes (see package doc).

Checked against the real MLflow client: ``set_experiment`` calls experiments/get-by-name,
experiments/create and experiments/get; ``start_run`` runs/create; ``log_param(s)``
runs/log-parameter and runs/log-batch; ``log_metric(s)`` runs/log-metric and runs/log-batch;
``set_tag`` runs/set-tag; ``end_run`` runs/get and runs/update; ``search_runs`` runs/search (the
filter grammar of :mod:`.search`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from moeproxy.service.auth import ProjectDep, SessionDep
from moeproxy.service.errors import (
    DATABASE_RETRY_AFTER_S,
    DATABASE_UNAVAILABLE,
    DATABASE_UNAVAILABLE_DETAIL,
    ServiceError,
)
from moeproxy.service.jobs import auto as auto_jobs
from moeproxy.service.limits import StoredText, data_error_message
from moeproxy.service.mlflow import repository as repo
from moeproxy.service.mlflow.errors import ERROR_CODE_BY_STATUS, MlflowApiError, not_found
from moeproxy.service.mlflow.schemas import (
    CreateExperiment,
    CreateRun,
    DeleteRun,
    DeleteTag,
    Key,
    LogBatch,
    LogMetric,
    LogParam,
    RunUuid,
    SearchRuns,
    SetTag,
    UpdateRun,
)
from pydantic import BaseModel
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class MlflowRoute(APIRoute):
    """Answers every error in MLflow's shape, which the MLflow client parses into MlflowException."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def mlflow_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except MlflowApiError as exc:
                return JSONResponse(exc.body(), status_code=exc.status_code)
            except ServiceError as exc:
                code = ERROR_CODE_BY_STATUS.get(exc.status_code, "INTERNAL_ERROR")
                return JSONResponse({"error_code": code, "message": exc.detail}, status_code=exc.status_code)
            except StarletteHTTPException as exc:  # the body limits (413, 408) among others
                code = ERROR_CODE_BY_STATUS.get(exc.status_code, "BAD_REQUEST")
                return JSONResponse({"error_code": code, "message": str(exc.detail)}, status_code=exc.status_code)
            except RequestValidationError as exc:
                message = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors()
                )
                return JSONResponse(
                    {"error_code": "INVALID_PARAMETER_VALUE", "message": message}, status_code=400
                )
            except DATABASE_UNAVAILABLE:  # the MLflow client retries TEMPORARILY_UNAVAILABLE / 503
                return JSONResponse(
                    {"error_code": "TEMPORARILY_UNAVAILABLE", "message": DATABASE_UNAVAILABLE_DETAIL},
                    status_code=503,
                    headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
                )
            except DataError as exc:  # a value the database cannot hold that no check above caught
                return JSONResponse(
                    {"error_code": "INVALID_PARAMETER_VALUE", "message": data_error_message(exc)},
                    status_code=400,
                )
            except RecursionError:
                return JSONResponse(
                    {"error_code": "INVALID_PARAMETER_VALUE", "message": "request body is nested too deeply"},
                    status_code=400,
                )
            except Exception:
                # Still MLflow's shape, so the client reports it instead of failing to parse it.
                log.exception("unhandled error in %s", request.url.path)
                return JSONResponse(
                    {"error_code": "INTERNAL_ERROR", "message": "internal server error"}, status_code=500
                )

        return mlflow_handler


class MlflowErrorBody(BaseModel):
    """MLflow's own error shape (mlflow/protos/databricks.proto ErrorCode names)."""

    error_code: str
    message: str


def _mlflow_error(description: str) -> dict:
    return {"model": MlflowErrorBody, "description": description}


MLFLOW_ERRORS: dict[int | str, dict] = {
    400: _mlflow_error("INVALID_PARAMETER_VALUE: a missing, malformed or unstorable field"),
    401: _mlflow_error("UNAUTHENTICATED: missing, invalid or revoked bearer token"),
    404: _mlflow_error("RESOURCE_DOES_NOT_EXIST"),
    408: _mlflow_error("the request body did not arrive in time"),
    409: _mlflow_error("RESOURCE_ALREADY_EXISTS"),
    413: _mlflow_error("REQUEST_LIMIT_EXCEEDED: body over 1 MiB"),
    429: _mlflow_error("REQUEST_LIMIT_EXCEEDED: too many requests; wait Retry-After seconds"),
    500: _mlflow_error("INTERNAL_ERROR (logged)"),
    503: _mlflow_error("TEMPORARILY_UNAVAILABLE: the database is away; retry after Retry-After seconds"),
    # Request validation answers 400 in MLflow's shape; "4XX" also keeps FastAPI from adding its 422.
    "4XX": _mlflow_error("any other client error"),
}

router = APIRouter(
    prefix="/mlflow/api/2.0/mlflow", tags=["mlflow"], route_class=MlflowRoute, responses=MLFLOW_ERRORS
)

EMPTY: dict = {}


@router.get("/experiments/get-by-name")
def get_experiment_by_name(
    project: ProjectDep, session: SessionDep, experiment_name: Annotated[StoredText, Query(min_length=1, max_length=256)]
) -> dict:
    experiment = repo.get_experiment_by_name(session, project.id, experiment_name)
    if experiment is None and experiment_name == repo.DEFAULT_EXPERIMENT_NAME:
        experiment = repo.default_experiment(session, project.id)
    if experiment is None:
        raise not_found(f"Could not find experiment with name '{experiment_name}'")
    return {"experiment": repo.experiment_json(experiment)}


@router.get("/experiments/get")
def get_experiment(project: ProjectDep, session: SessionDep, experiment_id: Annotated[StoredText, Query(max_length=64)]) -> dict:
    return {"experiment": repo.experiment_json(repo.get_experiment(session, project.id, experiment_id))}


@router.post("/experiments/create")
def create_experiment(spec: CreateExperiment, project: ProjectDep, session: SessionDep) -> dict:
    return {"experiment_id": repo.external_id(repo.create_experiment(session, project.id, spec))}


# The MLflow client POSTs its search; GET answers the same for curl. Two routes, one handler, each
# with its own operation id (one id for both is not a valid OpenAPI document).
@router.post("/experiments/search", operation_id="mlflow_search_experiments")
@router.get("/experiments/search", operation_id="mlflow_search_experiments_get")
def search_experiments(project: ProjectDep, session: SessionDep) -> dict:
    repo.default_experiment(session, project.id)
    return {"experiments": [repo.experiment_json(e) for e in repo.list_experiments(session, project.id)]}


@router.post("/runs/create")
def create_run(spec: CreateRun, project: ProjectDep, session: SessionDep) -> dict:
    mrun, _run = repo.create_run(session, project.id, spec)
    return {"run": repo.run_json(session, mrun, with_metrics=False)}


@router.get("/runs/get")
def get_run(
    project: ProjectDep,
    session: SessionDep,
    run_id: Annotated[RunUuid | None, Query()] = None,
    run_uuid: Annotated[RunUuid | None, Query()] = None,
) -> dict:
    mrun, _run = repo.get_run(session, project.id, run_id or run_uuid or "")
    return {"run": repo.run_json(session, mrun)}


@router.post("/runs/search")
def search_runs(spec: SearchRuns, project: ProjectDep, session: SessionDep) -> dict:
    page, token = repo.search_runs(session, project.id, spec)
    out: dict = {"runs": [repo.run_json(session, mrun) for mrun in page]}
    if token is not None:
        out["next_page_token"] = token
    return out


@router.post("/runs/update")
def update_run(spec: UpdateRun, request: Request, project: ProjectDep, session: SessionDep) -> dict:
    mrun, run = repo.get_run(session, project.id, spec.run_id)
    previous_status = run.status
    repo.update_run(session, mrun, run, spec)
    auto_jobs.after_status_change(session, run, previous_status, request.app.state.settings)
    experiment = repo.get_experiment_for(session, mrun)
    return {"run_info": repo.run_info_json(mrun, repo.external_id(experiment))}


@router.post("/runs/delete")
def delete_run(spec: DeleteRun, project: ProjectDep, session: SessionDep) -> dict:
    mrun, _run = repo.get_run(session, project.id, spec.run_id)
    mrun.lifecycle_stage = "deleted"  # MLflow soft-deletes; the moeproxy run and its metrics stay
    return EMPTY


@router.post("/runs/log-metric")
def log_metric(spec: LogMetric, project: ProjectDep, session: SessionDep) -> dict:
    mrun, run = repo.get_run(session, project.id, spec.run_id)
    repo.log_metrics(session, mrun, run, [spec])
    return EMPTY


@router.post("/runs/log-parameter")
def log_parameter(spec: LogParam, project: ProjectDep, session: SessionDep) -> dict:
    mrun, run = repo.get_run(session, project.id, spec.run_id)
    repo.log_params(session, mrun, run, [spec])
    return EMPTY


@router.post("/runs/set-tag")
def set_tag(spec: SetTag, project: ProjectDep, session: SessionDep) -> dict:
    mrun, run = repo.get_run(session, project.id, spec.run_id)
    repo.set_tags(session, mrun, run, [spec])
    return EMPTY


@router.post("/runs/delete-tag")
def delete_tag(spec: DeleteTag, project: ProjectDep, session: SessionDep) -> dict:
    mrun, _run = repo.get_run(session, project.id, spec.run_id)
    repo.delete_tag(session, mrun, spec.key)
    return EMPTY


@router.post("/runs/log-batch")
def log_batch(spec: LogBatch, project: ProjectDep, session: SessionDep) -> dict:
    mrun, run = repo.get_run(session, project.id, spec.run_id)
    if spec.params:
        repo.log_params(session, mrun, run, spec.params)
    if spec.tags:
        repo.set_tags(session, mrun, run, spec.tags)
    if spec.metrics:
        repo.log_metrics(session, mrun, run, spec.metrics)
    return EMPTY


@router.get("/metrics/get-history")
def get_metric_history(
    project: ProjectDep,
    session: SessionDep,
    metric_key: Annotated[Key, Query()],
    run_id: Annotated[RunUuid | None, Query()] = None,
    run_uuid: Annotated[RunUuid | None, Query()] = None,
) -> Response:
    mrun, _run = repo.get_run(session, project.id, run_id or run_uuid or "")
    # json.dumps rather than JSONResponse: values are already made JSON-safe ("NaN" strings).
    body = {"metrics": repo.metric_history(session, mrun.run_id, metric_key)}
    return Response(json.dumps(body), media_type="application/json")
