"""The FastAPI application factory.

``create_app()`` builds the app from :class:`moeproxy.config.Settings`
(``MOEPROXY_DATABASE_URL`` ...).  Run it with
``uvicorn --factory moeproxy.service.app:create_app`` or ``moeproxy serve``
(which also upgrades the database first).  The app does *not* migrate on its
own: several workers or replicas would race; ``moeproxy serve`` /
``moeproxy db upgrade`` do it once, under a lock on PostgreSQL.

Routers are a registry: each module in ``ROUTER_MODULES`` exposes ``router``;
adding a domain is adding its module name.  Startup/shutdown work of other
domains goes into ``LIFESPAN_HOOKS`` (module names exposing
``lifespan(app)``, an async context manager).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from moeproxy.service.db import Database
from moeproxy.service.errors import (
    DATABASE_RETRY_AFTER_S,
    DATABASE_UNAVAILABLE,
    DATABASE_UNAVAILABLE_DETAIL,
    NotAuthenticated,
    ServiceError,
)
from moeproxy.service.limits import BodyLimits, data_error_message
from moeproxy.service.middleware import SecurityHeaders, UnexpectedErrors, install_log_redaction
from moeproxy.service.ratelimit import RateLimits, SlidingWindow
from sqlalchemy.exc import DataError

import moeproxy
from moeproxy.config import Settings, get_settings

log = logging.getLogger(__name__)

ROUTER_MODULES: tuple[str, ...] = (
    "moeproxy.service.health",
    "moeproxy.service.tokens.router",
    "moeproxy.service.runs.router",
    "moeproxy.service.metrics.router",
    "moeproxy.service.aliases.router",
    "moeproxy.service.mlflow.router",
    "moeproxy.service.triage.router",
    "moeproxy.service.jobs.router",
    "moeproxy.service.ui.router",
)

LIFESPAN_HOOKS: tuple[str, ...] = ("moeproxy.service.triage.live",)


def create_app(settings: Settings | None = None, *, database: Database | None = None) -> FastAPI:
    """The service.  ``database`` overrides the one built from ``settings.database_url`` (tests)."""
    settings = settings or get_settings()
    owns_database = database is None
    database = database or Database(settings.database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for name in LIFESPAN_HOOKS:
                await stack.enter_async_context(importlib.import_module(name).lifespan(app))
            yield
        if owns_database:
            database.dispose()

    app = FastAPI(
        title="moeproxy",
        version=moeproxy.__version__,
        description="Metric ingestion and fault triage for RL post-training runs of MoE LLMs.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.database = database
    app.state.login_failures = SlidingWindow(settings.login_max_failures, settings.login_lockout_s)
    for name in ROUTER_MODULES:
        app.include_router(importlib.import_module(name).router)
    # Added innermost first: SecurityHeaders wraps every answer, UnexpectedErrors' 500s included;
    # a rate-limited request is refused before its body is read.
    app.add_middleware(BodyLimits, deadline_s=settings.body_read_timeout_s)
    app.add_middleware(
        RateLimits,
        per_token=settings.rate_limit_per_token,
        per_address=settings.rate_limit_per_address,
        window_s=settings.rate_limit_window_s,
    )
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(SecurityHeaders)
    install_log_redaction()
    _install_error_handlers(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, NotAuthenticated) else None
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own shape (a list of {loc, msg, type}), minus the echoed input, which can be huge.
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    async def _database_away(_request: Request, exc: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", getattr(exc, "orig", None) or exc)
        return JSONResponse(
            {"detail": DATABASE_UNAVAILABLE_DETAIL},
            status_code=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )

    for kind in DATABASE_UNAVAILABLE:
        app.add_exception_handler(kind, _database_away)

    @app.exception_handler(DataError)
    async def _does_not_fit(_request: Request, exc: DataError) -> JSONResponse:
        log.warning("request value refused by the database: %s", exc.orig)
        return JSONResponse({"detail": data_error_message(exc)}, status_code=422)

    @app.exception_handler(RecursionError)
    async def _too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
        # A JSON body nested thousands deep exhausts the parser's recursion: the client's fault.
        return JSONResponse({"detail": "request body is nested too deeply"}, status_code=422)

    # The net under UnexpectedErrors (service/middleware.py), for an error in a middleware itself.
    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)
