"""MLflow-shaped errors: ``{"error_code": ..., "message": ...}`` as the MLflow client expects them."""

from __future__ import annotations


class MlflowApiError(Exception):
    def __init__(self, error_code: str, message: str, status_code: int = 400):
        super().__init__(message)
        self.error_code, self.message, self.status_code = error_code, message, status_code

    def body(self) -> dict[str, str]:
        return {"error_code": self.error_code, "message": self.message}


def not_found(message: str) -> MlflowApiError:
    return MlflowApiError("RESOURCE_DOES_NOT_EXIST", message, 404)


def already_exists(message: str) -> MlflowApiError:
    return MlflowApiError("RESOURCE_ALREADY_EXISTS", message, 400)


def invalid(message: str) -> MlflowApiError:
    return MlflowApiError("INVALID_PARAMETER_VALUE", message, 400)


# moeproxy service errors by HTTP status -> MLflow error code (mlflow/protos/databricks.proto names).
ERROR_CODE_BY_STATUS: dict[int, str] = {
    400: "INVALID_PARAMETER_VALUE",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "RESOURCE_DOES_NOT_EXIST",
    409: "RESOURCE_ALREADY_EXISTS",
    413: "REQUEST_LIMIT_EXCEEDED",
    415: "INVALID_PARAMETER_VALUE",
    422: "INVALID_PARAMETER_VALUE",
}
