"""Requests and answers of ``/api/v1/jobs``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from moeproxy.proxy_builder.methods import METHODS
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.service.jobs.models import JobState
from moeproxy.service.jobs.repository import REFERENCE_CLASS
from moeproxy.service.limits import INT32_MAX
from pydantic import BaseModel, ConfigDict, Field, field_validator

Seed = Annotated[int, Field(ge=0, le=INT32_MAX)]


class JobCreate(BaseModel):
    """A reproduction of one run's fault; what is left out comes from the service's settings
    (``MOEPROXY_JOB_STEPS``, ``MOEPROXY_JOB_SEEDS``, ``MOEPROXY_JOB_KEEP_RATIO``, ``MOEPROXY_JOB_METHOD``)."""

    model_config = ConfigDict(extra="forbid")

    run_id: int = Field(ge=1, le=INT32_MAX)
    classes: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=len(FAULT_CLASSES),
        description="fault classes to reproduce (the catalogue's names); default: every fault class",
    )
    steps: int | None = Field(default=None, ge=8, le=100_000, description="RL steps per reproduction")
    # Two at least: a job's fingerprints are calibrated leaving one seed out.
    seeds: list[Seed] | None = Field(default=None, min_length=2, max_length=64)
    keep_ratio: float | None = Field(default=None, gt=0, le=1, description="fraction of routed experts kept")
    method: str | None = Field(default=None, description="proxy construction method (proxy_builder's names)")
    engine: dict[str, bool | int | float | str | list[str] | list[float]] | None = Field(
        default=None,
        max_length=64,
        description="reproduction engine options over its defaults (EngineConfig fields: tasks, max_new_tokens, "
        "prompts_per_step, group_size, lr, ...); an unknown option fails the job with its name when it runs",
    )

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        faults = [c for c in FAULT_CLASSES if c != REFERENCE_CLASS]
        if REFERENCE_CLASS in value:
            raise ValueError(f"{REFERENCE_CLASS!r} is reproduced as every fault's twin, not as a candidate: list fault classes")
        unknown = [c for c in value if c not in FAULT_CLASSES]
        if unknown:
            raise ValueError(f"unknown fault classes {', '.join(map(repr, unknown))}; known: {', '.join(faults)}")
        return list(dict.fromkeys(value))  # order kept, repeats dropped

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if len(set(value)) < 2:
            raise ValueError("at least two different seeds: a job's fingerprints are calibrated leaving one seed out")
        return list(dict.fromkeys(value))

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str | None) -> str | None:
        if value is not None and value not in METHODS:
            raise ValueError(f"unknown method {value!r}; known: {', '.join(METHODS)}")
        return value


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    run_id: int
    model_uri: str
    method: str
    keep_ratio: float
    classes: list[str]
    grid: dict[str, Any]
    seeds: list[int]
    steps: int
    trigger: str = Field(description="manual, weak_twice (two weak evaluations in a row) or ended_weak")
    state: JobState
    cancel_requested: bool = Field(description="a cancel was asked while the job ran; its worker stops it")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    progress: dict[str, Any]
    result: dict[str, Any] | None
    worker_id: str | None
    lease_expires_at: datetime | None
    heartbeat_at: datetime | None
    attempts: int = Field(description="times a worker claimed the job (a lost lease puts it back)")
    device_hours: float | None
    planner_estimate: dict[str, Any] | None

    @classmethod
    def of(cls, job) -> JobOut:
        return cls.model_validate(
            {
                **{name: getattr(job, name) for name in cls.model_fields if name != "cancel_requested"},
                "cancel_requested": job.cancel_requested_at is not None,
            }
        )


class JobList(BaseModel):
    jobs: list[JobOut]
    total: int
    limit: int
    offset: int
