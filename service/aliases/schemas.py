from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AliasCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    framework: str = Field(min_length=1, max_length=64, description='e.g. "verl", "trl", "openrlhf", or "*" for any')
    name: str = Field(min_length=1, max_length=512, description="the metric name as the framework logs it")
    canonical: str = Field(min_length=1, max_length=128, description="the canonical metric it means (SPEC section 4)")

    @field_validator("framework", "name", "canonical")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value.strip()


class AliasOut(BaseModel):
    framework: str
    name: str
    canonical: str
    scope: Literal["global", "project"]


class AliasList(BaseModel):
    aliases: list[AliasOut]
