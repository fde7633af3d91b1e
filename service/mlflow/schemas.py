"""Request bodies of the MLflow REST API (mlflow/protos/service.proto), as the client sends them.

Field names follow MLflow's JSON (protobuf JSON mapping); the client sends both ``run_id`` and
the deprecated ``run_uuid``.  Unknown fields are ignored, as MLflow's server does.
"""

from __future__ import annotations

from typing import Annotated, Literal

from moeproxy.service.limits import INT64_MAX, INT64_MIN, StoredText
from pydantic import BaseModel, ConfigDict, Field, model_validator

# MLflow's own limits (mlflow/utils/validation.py: MAX_TAG_VAL_LENGTH); keys are stored as metric
# names (512 characters) or in JSON.
MAX_VALUE_LENGTH = 8000
Key = Annotated[StoredText, Field(min_length=1, max_length=512)]
Millis = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]  # ms since the epoch: a BigInteger column
RunUuid = Annotated[StoredText, Field(max_length=64)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class KeyValue(_Body):
    key: Key
    value: StoredText = Field(default="", max_length=MAX_VALUE_LENGTH)


class Metric(_Body):
    key: Key
    value: float | int | str
    timestamp: Millis | None = None
    step: int = Field(default=0, ge=0, le=INT64_MAX)


class _RunRef(_Body):
    run_id: RunUuid | None = None
    run_uuid: RunUuid | None = None

    @model_validator(mode="after")
    def _one_id(self):
        if not (self.run_id or self.run_uuid):
            raise ValueError("run_id is required")
        self.run_id = self.run_id or self.run_uuid
        return self


class CreateExperiment(_Body):
    name: StoredText = Field(min_length=1, max_length=256)
    artifact_location: StoredText | None = Field(default=None, max_length=512)
    tags: list[KeyValue] = Field(default_factory=list)


class CreateRun(_Body):
    experiment_id: StoredText = Field(default="0", max_length=64)
    user_id: StoredText | None = Field(default=None, max_length=256)
    run_name: StoredText | None = Field(default=None, max_length=200)
    start_time: Millis | None = None
    tags: list[KeyValue] = Field(default_factory=list)


class UpdateRun(_RunRef):
    status: StoredText | None = Field(default=None, max_length=16)
    end_time: Millis | None = None
    run_name: StoredText | None = Field(default=None, max_length=200)


class LogMetric(_RunRef, Metric):
    pass


class LogParam(_RunRef, KeyValue):
    pass


class SetTag(_RunRef, KeyValue):
    pass


class DeleteTag(_RunRef):
    key: Key


class DeleteRun(_RunRef):
    pass


class LogBatch(_RunRef):
    # MLflow's own limits per request (mlflow/utils/validation.py).
    metrics: list[Metric] = Field(default_factory=list, max_length=1000)
    params: list[KeyValue] = Field(default_factory=list, max_length=100)
    tags: list[KeyValue] = Field(default_factory=list, max_length=100)


class SearchRuns(_Body):
    experiment_ids: list[StoredText] = Field(default_factory=list, max_length=100)
    filter: StoredText = Field(default="", max_length=4096)
    run_view_type: Literal["ACTIVE_ONLY", "DELETED_ONLY", "ALL"] = "ACTIVE_ONLY"
    max_results: int = Field(default=1000, ge=1, le=50000)
    order_by: list[StoredText] = Field(default_factory=list, max_length=10)
    page_token: StoredText | None = Field(default=None, max_length=64)
