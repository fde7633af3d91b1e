"""Response shapes of the metrics routes (the ingest body is parsed in codec.py; its schema is there)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

NonFinite = Literal["NaN", "Infinity", "-Infinity"]


class IngestResult(BaseModel):
    accepted: int = Field(description="points stored (a step sent twice in one request counts once)")


class Series(BaseModel):
    steps: list[int]
    values: list[float | NonFinite]


class MetricsOut(BaseModel):
    metrics: dict[str, Series]


class MetricNameOut(BaseModel):
    name: str
    canonical: str
    points: int = Field(description="points the service holds for the metric")
    last_step: int | None = Field(description="its highest step (None: no point yet)")


class MetricNamesOut(BaseModel):
    names: list[MetricNameOut]
