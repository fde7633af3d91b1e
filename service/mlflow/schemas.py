"""Request bodies of the MLflow REST API (mlflow/protos/service.proto), as the client sends them.

Field names follow MLflow's JSON (protobuf JSON mapping); the client sends both ``run_id`` and
the deprecated ``run_uuid``.  Unknown fields are ignored, as MLflow's server does.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class KeyValue(_Body):
    key: str = Field(min_length=1, max_length=512)
    value: str = ""


class Metric(_Body):
    key: str = Field(min_length=1, max_length=512)
    value: float | int | str
    timestamp: int | None = None
    step: int = Field(default=0, ge=0)


class _RunRef(_Body):
    run_id: str | None = None
    run_uuid: str | None = None

    @model_validator(mode="after")
    def _one_id(self):
        if not (self.run_id or self.run_uuid):
            raise ValueError("run_id is required")
        self.run_id = self.run_id or self.run_uuid
        return self


class CreateExperiment(_Body):
    name: str = Field(min_length=1, max_length=256)
    artifact_location: str | None = None
    tags: list[KeyValue] = Field(default_factory=list)


class CreateRun(_Body):
    experiment_id: str = "0"
    user_id: str | None = None
    run_name: str | None = Field(default=None, max_length=200)
    start_time: int | None = None
    tags: list[KeyValue] = Field(default_factory=list)


class UpdateRun(_RunRef):
    status: str | None = None
    end_time: int | None = None
    run_name: str | None = None


class LogMetric(_RunRef, Metric):
    pass


class LogParam(_RunRef, KeyValue):
    pass


class SetTag(_RunRef, KeyValue):
    pass


class DeleteTag(_RunRef):
    key: str


class DeleteRun(_RunRef):
    pass


class LogBatch(_RunRef):
    # MLflow's own limits per request (mlflow/utils/validation.py).
    metrics: list[Metric] = Field(default_factory=list, max_length=1000)
    params: list[KeyValue] = Field(default_factory=list, max_length=100)
    tags: list[KeyValue] = Field(default_factory=list, max_length=100)
