from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from moeproxy.service.limits import SmallJson, StoredText
from moeproxy.service.runs.models import RunStatus
from pydantic import BaseModel, ConfigDict, Field, field_validator

Tag = Annotated[StoredText, Field(min_length=1, max_length=128)]
ModelUri = Annotated[
    StoredText,
    Field(
        min_length=1,
        max_length=4096,
        description="the checkpoint the reproduction workers read (a path or URI); jobs need it",
    ),
]


def _strip_nonempty(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StoredText = Field(min_length=1, max_length=256, description="unique within the project")
    framework: StoredText | None = Field(default=None, max_length=64, description="verl, trl, openrlhf, mindspeed_rl, ...")
    model: StoredText | None = Field(default=None, max_length=256)
    model_uri: ModelUri | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=64)
    config: SmallJson = Field(default_factory=dict, description="at most 256 KiB as JSON")

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, value: str) -> str:
        return _strip_nonempty(value)


class RunUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: RunStatus | None = None
    framework: StoredText | None = Field(default=None, max_length=64)
    model: StoredText | None = Field(default=None, max_length=256)
    model_uri: ModelUri | None = None
    tags: list[Tag] | None = Field(default=None, max_length=64)
    config: SmallJson | None = None


class RunSummary(BaseModel):
    """A run as listed: everything but its config (``GET /api/v1/runs/{id}`` has that)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    framework: str | None
    model: str | None
    model_uri: str | None = None
    status: RunStatus
    tags: list[str]
    created_at: datetime
    updated_at: datetime


class RunOut(RunSummary):
    config: dict[str, Any]


class RunList(BaseModel):
    runs: list[RunSummary]
    total: int
    limit: int
    offset: int
