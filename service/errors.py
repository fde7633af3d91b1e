"""Named service errors; the app turns each into a 4xx JSON ``{"detail": ...}``."""

from __future__ import annotations

import sqlalchemy.exc
from pydantic import BaseModel


class ServiceError(Exception):
    status_code = 400

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


class NotAuthenticated(ServiceError):
    status_code = 401


class NotFound(ServiceError):
    status_code = 404


class RunNotFound(NotFound):
    def __init__(self, run_id: object):
        super().__init__(f"run {run_id} not found")


class InvalidInput(ServiceError):
    status_code = 422


class PayloadTooLarge(ServiceError):
    status_code = 413


class UnsupportedMediaType(ServiceError):
    status_code = 415


# --- How the errors read in the OpenAPI document: the bodies the handlers in app.py really send.


class ErrorBody(BaseModel):
    detail: str


class FieldProblem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    # A list from request validation (FastAPI's shape, without the echoed input); a sentence
    # from the checks after it (a value that does not fit its column, a body nested too deeply).
    detail: list[FieldProblem] | str


def _error(description: str, model: type[BaseModel] = ErrorBody) -> dict:
    return {"model": model, "description": description}


API_ERRORS: dict[int | str, dict] = {
    401: _error("missing, invalid or revoked bearer token"),
    404: _error("no such run (or route) in the token's project"),
    408: _error("the request body did not arrive within MOEPROXY_BODY_READ_TIMEOUT_S"),
    413: _error("request body (1 MiB; a metrics batch 64 MiB) or batch over its limit"),
    422: _error("invalid request: the fields at fault, or what does not fit", ValidationErrorBody),
    429: _error("too many requests from this token or address: wait Retry-After seconds"),
    500: _error("unexpected server error (logged)"),
    503: _error("the database is not available right now: retry after Retry-After seconds"),
}


# --- The database is away (restarting, unreachable, pool exhausted, SQLite busy past its timeout):
# a 503 with Retry-After, which clients retry, rather than a 500 they may not.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
)
DATABASE_RETRY_AFTER_S = 5
DATABASE_UNAVAILABLE_DETAIL = "the database is not available right now: retry"
