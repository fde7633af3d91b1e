"""What a job executor is given and returns: the contract between the queue's worker and
``moeproxy.service.jobs.executor.execute(job, ctx)``.

The worker calls ``executor(job, ctx)`` on its main thread with a :class:`JobSpec` (the job row as
it was claimed, frozen) and a context (:class:`moeproxy.service.jobs.worker.JobContext`) that holds
the lease.  The executor returns a :class:`JobOutcome` (or None: succeeded, no result), raises
:class:`JobCancelled` (the job ends ``cancelled``), or raises anything else (the job ends
``failed`` with the error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: int
    project_id: int
    project: str  # the project's name
    run_id: int
    run_name: str
    model_uri: str  # the run's checkpoint, as registered on the run when the job was created
    method: str  # proxy_builder method name (METHODS)
    keep_ratio: float  # fraction of routed experts the proxy keeps
    classes: tuple[str, ...]  # fault classes to reproduce (catalogue names), ranked when automatic
    grid: Mapping[str, Any]  # parameter grid; {} means the executor's defaults
    seeds: tuple[int, ...]
    steps: int  # RL steps per reproduction
    trigger: str  # manual | weak_twice | ended_weak
    attempt: int  # 1 on the first claim; more when a worker died and the job was claimed again


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A finished job's record, stored on its row (``result`` is JSON: e.g. the new library
    version, the re-triage verdict)."""

    result: Mapping[str, Any] = field(default_factory=dict)
    device_hours: float | None = None
    planner_estimate: Mapping[str, Any] | None = None


class JobCancelled(Exception):
    """A cancel was requested: raised by ``ctx.heartbeat()`` / ``ctx.raise_if_cancelled()``; an
    executor may also raise it itself.  The worker marks the job cancelled."""


class LeaseLost(Exception):
    """The job is no longer this worker's (its lease expired and it was put back or taken by another
    worker): raised by ``ctx.heartbeat()``; whatever the executor does next will not be recorded."""
