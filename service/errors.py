"""Named service errors; the app turns each into a 4xx JSON ``{"detail": ...}``."""

from __future__ import annotations


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


class Conflict(ServiceError):
    status_code = 409


class InvalidInput(ServiceError):
    status_code = 422


class PayloadTooLarge(ServiceError):
    status_code = 413


class UnsupportedMediaType(ServiceError):
    status_code = 415
