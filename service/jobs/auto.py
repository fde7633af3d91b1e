"""Jobs created automatically from triage (issue 18, item 2).

A job is created for a run that has a ``model_uri`` and at least ``settings.job_min_steps`` steps
when its verdict is weak (the top candidate is not ``strong``)

* for two evaluations in a row while it runs (``weak_twice``), or
* when it has ended (``ended_weak``): the evaluation stored after its status left ``running``, or,
  when it ends after its last evaluation, that evaluation.

The candidate classes are the engine's ranked siblings (top classes tied on the same evidence)
plus every fault class the library has no fingerprint for (nothing speaks against those); with no
siblings, every fault class.

An automatic job is made at most once per (run, model_uri): whatever became of it (succeeded and
the run still weak, failed, cancelled by a user), the same evaluations would only start the same
job again.  A new ``model_uri`` on the run, or ``POST /api/v1/jobs``, starts another one.  The
project's open-job cap applies: a job that does not fit is skipped, not queued for later.
Creating one never fails the evaluation that triggered it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.service.jobs import repository
from moeproxy.service.jobs.errors import JobConflict
from moeproxy.service.jobs.models import JobTrigger, ReproductionJob
from moeproxy.service.metrics.models import MetricName, MetricPoint
from moeproxy.service.runs.models import Run, RunStatus
from moeproxy.service.triage import repository as triage
from moeproxy.service.triage.models import TriageEvaluation
from sqlalchemy import func, select
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


def is_weak(row: TriageEvaluation) -> bool:
    return row.top_strength != "strong"


def candidate_classes(ranked: Sequence[str], sibling_groups: Sequence[Sequence[str]]) -> list[str]:
    tied = [c for group in sibling_groups for c in group if c != repository.REFERENCE_CLASS]
    if not tied:
        return repository.default_classes()
    unknown = [c for c in repository.default_classes() if c not in ranked]
    return list(dict.fromkeys([*(c for c in tied if c in FAULT_CLASSES), *unknown]))


def _classes_of(row: TriageEvaluation) -> list[str]:
    ranked = [c["fault_class"] for c in row.candidates]
    siblings = (row.details or {}).get(triage.SIBLINGS_KEY) or []
    return candidate_classes(ranked, [note.get("classes", []) for note in siblings])


def _previous(session: Session, row: TriageEvaluation) -> TriageEvaluation | None:
    return session.scalar(
        select(TriageEvaluation)
        .where(TriageEvaluation.run_id == row.run_id, TriageEvaluation.id < row.id)
        .order_by(TriageEvaluation.id.desc())
        .limit(1)
    )


def count_steps(session: Session, run_id: int) -> int:
    return session.scalar(
        select(func.count(func.distinct(MetricPoint.step)))
        .join(MetricName, MetricPoint.metric_id == MetricName.id)
        .where(MetricName.run_id == run_id)
    ) or 0


def after_evaluation(session: Session, row: TriageEvaluation, *, settings: Any) -> ReproductionJob | None:
    """Called when an evaluation of ``row.run_id`` has been stored in ``row``."""
    run = session.get(Run, row.run_id)
    if run is None or not run.model_uri or not is_weak(row):
        return None
    # Counted in the database, and only for a weak run that could get a job: triage reads a long
    # run binned (metrics.read_binned), so it does not hold the run's steps.
    if count_steps(session, run.id) < settings.job_min_steps:
        return None
    if run.status != RunStatus.running.value:
        trigger = JobTrigger.ended_weak
    elif row.evaluations >= 2 or ((previous := _previous(session, row)) is not None and is_weak(previous)):
        trigger = JobTrigger.weak_twice
    else:
        return None
    return _create(session, run, _classes_of(row), trigger, settings)


def after_status_change(session: Session, run: Run, previous_status: str, settings: Any) -> ReproductionJob | None:
    """Called when a run's status was changed (PATCH, MLflow's runs/update): a run that ended after
    its last evaluation, weak, gets its job now."""
    if previous_status != RunStatus.running.value or run.status == RunStatus.running.value or not run.model_uri:
        return None
    row = triage.latest(session, run.id)
    if row is None or not is_weak(row) or count_steps(session, run.id) < settings.job_min_steps:
        return None
    return _create(session, run, _classes_of(row), JobTrigger.ended_weak, settings)


def _create(session: Session, run: Run, classes: list[str], trigger: JobTrigger, settings: Any) -> ReproductionJob | None:
    if repository.any_job_for(session, run.id, run.model_uri):
        return None
    request = repository.JobRequest(run_id=run.id, classes=classes, trigger=trigger)
    try:
        with session.begin_nested():
            job = repository.create_job(session, run.project_id, request, settings)
    except JobConflict as exc:
        log.info("run %s is weak (%s) but no job was created: %s", run.id, trigger.value, exc.detail)
        return None
    except Exception:  # the evaluation that got here must be stored all the same
        log.exception("automatic job for run %s could not be created", run.id)
        return None
    log.info("run %s is weak (%s): job %s queued for %s", run.id, trigger.value, job.id, ", ".join(classes))
    return job
