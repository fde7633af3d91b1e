"""Liveness and readiness probes (no token): /healthz = process up, /readyz = database reachable."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database not reachable"}})
def readyz(request: Request) -> JSONResponse:
    try:
        request.app.state.database.ping()
    except Exception as exc:  # any driver error means "not ready"
        log.warning("readiness check failed: %s", exc)
        return JSONResponse({"status": "unavailable", "detail": "database not reachable"}, status_code=503)
    return JSONResponse({"status": "ready"})
