from __future__ import annotations

from datetime import datetime
from typing import Any

from moeproxy.service.runs.models import RunStatus
from pydantic import BaseModel, ConfigDict, Field, field_validator


def _strip_nonempty(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=256, description="unique within the project")
    framework: str | None = Field(default=None, max_length=64, description="verl, trl, openrlhf, mindspeed_rl, ...")
    model: str | None = Field(default=None, max_length=256)
    tags: list[str] = Field(default_factory=list, max_length=64)
    config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_not_blank(cls, value: str) -> str:
        return _strip_nonempty(value)


class RunUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: RunStatus | None = None
    framework: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=256)
    tags: list[str] | None = Field(default=None, max_length=64)
    config: dict[str, Any] | None = None


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    framework: str | None
    model: str | None
    status: RunStatus
    tags: list[str]
    config: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class RunList(BaseModel):
    runs: list[RunOut]
    total: int
    limit: int
    offset: int
