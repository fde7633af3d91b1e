"""MLflow experiments/runs on top of moeproxy projects/runs.  Functions take a session; never commit."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable
from typing import Any

from moeproxy.service.db import add_unless_taken
from moeproxy.service.limits import fits_id
from moeproxy.service.metrics import repository as metrics
from moeproxy.service.metrics.codec import ParsedBatch, encode_value
from moeproxy.service.metrics.models import MetricName, MetricPoint
from moeproxy.service.mlflow import search
from moeproxy.service.mlflow.errors import already_exists, invalid, not_found
from moeproxy.service.mlflow.models import MlflowExperiment, MlflowRun
from moeproxy.service.mlflow.schemas import (
    CreateExperiment,
    CreateRun,
    KeyValue,
    Metric,
    SearchRuns,
    UpdateRun,
)
from moeproxy.service.runs import repository as runs
from moeproxy.service.runs.models import Run, RunStatus
from moeproxy.service.runs.schemas import RunCreate, RunUpdate
from moeproxy.signatures.values import parse_nonfinite
from moeproxy.signatures.vocabulary import detect_framework
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

DEFAULT_EXPERIMENT_ID = "0"  # what the MLflow client uses when no experiment was set
DEFAULT_EXPERIMENT_NAME = "Default"

# MLflow RunStatus -> moeproxy run status.
STATUS_MAP: dict[str, RunStatus] = {
    "RUNNING": RunStatus.running,
    "SCHEDULED": RunStatus.running,
    "FINISHED": RunStatus.finished,
    "FAILED": RunStatus.failed,
    "KILLED": RunStatus.crashed,
}

# Tags a job may set to tell moeproxy what its metric names mean (SPEC section 4 aliasing).
FRAMEWORK_TAG = "moeproxy.framework"
MODEL_TAG = "moeproxy.model"


def now_ms() -> int:
    return int(time.time() * 1000)


def external_id(experiment: MlflowExperiment) -> str:
    return DEFAULT_EXPERIMENT_ID if experiment.name == DEFAULT_EXPERIMENT_NAME else str(experiment.id)


def _ms(value) -> int:
    return int(value.timestamp() * 1000)


def experiment_json(experiment: MlflowExperiment) -> dict[str, Any]:
    return {
        "experiment_id": external_id(experiment),
        "name": experiment.name,
        "artifact_location": experiment.artifact_location,
        "lifecycle_stage": experiment.lifecycle_stage,
        "tags": [{"key": k, "value": v} for k, v in (experiment.tags or {}).items()],
        "creation_time": _ms(experiment.created_at),
        "last_update_time": _ms(experiment.updated_at),
    }


def get_experiment_by_name(session: Session, project_id: int, name: str) -> MlflowExperiment | None:
    return session.scalar(
        select(MlflowExperiment).where(
            MlflowExperiment.project_id == project_id, MlflowExperiment.name == name
        )
    )


def _insert_experiment(session: Session, project_id: int, name: str, **fields) -> MlflowExperiment | None:
    row = MlflowExperiment(project_id=project_id, name=name, tags={}, **fields)
    return row if add_unless_taken(session, row) else None


def default_experiment(session: Session, project_id: int) -> MlflowExperiment:
    found = get_experiment_by_name(session, project_id, DEFAULT_EXPERIMENT_NAME)
    if found is None:
        found = _insert_experiment(session, project_id, DEFAULT_EXPERIMENT_NAME) or get_experiment_by_name(
            session, project_id, DEFAULT_EXPERIMENT_NAME
        )
    return found


def get_experiment(session: Session, project_id: int, experiment_id: str) -> MlflowExperiment:
    if experiment_id == DEFAULT_EXPERIMENT_ID:
        return default_experiment(session, project_id)
    found = None
    if experiment_id.isdigit() and fits_id(int(experiment_id)):
        found = session.scalar(
            select(MlflowExperiment).where(
                MlflowExperiment.id == int(experiment_id), MlflowExperiment.project_id == project_id
            )
        )
    if found is None:
        raise not_found(f"No Experiment with id={experiment_id} exists")
    return found


def create_experiment(session: Session, project_id: int, spec: CreateExperiment) -> MlflowExperiment:
    row = _insert_experiment(
        session,
        project_id,
        spec.name,
        artifact_location=spec.artifact_location or "",
    )
    if row is None:
        raise already_exists(f"Experiment '{spec.name}' already exists.")
    row.tags = {t.key: t.value for t in spec.tags}
    session.flush()
    return row


def list_experiments(session: Session, project_id: int) -> list[MlflowExperiment]:
    return list(
        session.scalars(
            select(MlflowExperiment)
            .where(MlflowExperiment.project_id == project_id)
            .order_by(MlflowExperiment.id)
        )
    )


def moeproxy_run_name(experiment: MlflowExperiment, run_name: str) -> str:
    """The experiment is a namespace of runs in the project (the Default experiment adds nothing)."""
    return run_name if experiment.name == DEFAULT_EXPERIMENT_NAME else f"{experiment.name}/{run_name}"


def create_run(session: Session, project_id: int, spec: CreateRun) -> tuple[MlflowRun, Run]:
    experiment = get_experiment(session, project_id, spec.experiment_id)
    tags = {t.key: t.value for t in spec.tags}
    run_uuid = uuid.uuid4().hex
    run_name = spec.run_name or tags.get("mlflow.runName") or f"run-{run_uuid[:8]}"
    tags["mlflow.runName"] = run_name
    spec_run = _checked(
        RunCreate,
        name=moeproxy_run_name(experiment, run_name),
        framework=tags.get(FRAMEWORK_TAG),
        model=tags.get(MODEL_TAG),
        tags=["mlflow"],
        config={"mlflow": {"experiment": experiment.name, "run_name": run_name}},
    )
    run, _created = runs.get_or_create_run(session, project_id, spec_run)
    row = MlflowRun(
        run_uuid=run_uuid,
        run_id=run.id,
        experiment_id=experiment.id,
        run_name=run_name,
        user_id=spec.user_id or tags.get("mlflow.user", ""),
        status="RUNNING",
        start_time=spec.start_time or now_ms(),
        params={},
        tags=tags,
    )
    session.add(row)
    session.flush()
    return row, run


def _checked(schema, /, **fields):
    """``schema(**fields)``; a value taken from tags that the moeproxy run cannot hold is the caller's error."""
    try:
        return schema(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise invalid(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def get_run(session: Session, project_id: int, run_uuid: str) -> tuple[MlflowRun, Run]:
    found = session.execute(
        select(MlflowRun, Run)
        .join(Run, Run.id == MlflowRun.run_id)
        .where(MlflowRun.run_uuid == run_uuid, Run.project_id == project_id)
    ).first()
    if found is None:
        raise not_found(f"Run '{run_uuid}' not found")
    return found[0], found[1]


def _check_active(mrun: MlflowRun) -> None:
    if mrun.lifecycle_stage != "active":
        raise invalid(
            f"The run {mrun.run_uuid} must be in the 'active' state. Current state is {mrun.lifecycle_stage}."
        )


def update_run(session: Session, mrun: MlflowRun, run: Run, spec: UpdateRun) -> MlflowRun:
    if spec.status is not None:
        if spec.status not in STATUS_MAP:
            raise invalid(f"unknown run status {spec.status!r}; one of {', '.join(STATUS_MAP)}")
        mrun.status = spec.status
        run.status = STATUS_MAP[spec.status].value
    if spec.end_time is not None:
        mrun.end_time = spec.end_time
    if spec.run_name:
        mrun.run_name = spec.run_name
        mrun.tags = {**mrun.tags, "mlflow.runName": spec.run_name}
    session.flush()
    return mrun


def _value(metric: Metric) -> float:
    value = metric.value
    if isinstance(value, str):
        nonfinite = parse_nonfinite(value)
        if nonfinite is not None:
            return nonfinite
        try:
            return float(value)
        except ValueError:
            raise invalid(f"metric {metric.key!r}: value {value!r:.40} is not a number") from None
    try:
        return float(value)
    except OverflowError:  # an integer beyond the float range
        raise invalid(f"metric {metric.key!r}: integer value too large for a double") from None


def log_metrics(session: Session, mrun: MlflowRun, run: Run, items: Iterable[Metric]) -> int:
    """Store metrics through the same idempotent ingestion as ``/api/v1`` (keyed on step; last wins)."""
    _check_active(mrun)
    by_step: dict[int, dict[str, float]] = {}
    names: dict[str, None] = {}
    for metric in items:
        by_step.setdefault(metric.step, {})[metric.key] = _value(metric)
        names[metric.key] = None
    if not by_step:
        return 0
    if run.framework is None:
        # No moeproxy.framework tag: a TRL run with report_to=["mlflow"] says nothing of its
        # framework, but its metric names do (only TRL logs completions/mean_length). The first
        # batch with distinctive names decides; a tag set later still wins.
        run.framework = detect_framework(names)
    batch = ParsedBatch(by_step=by_step, names=tuple(names), points=sum(map(len, by_step.values())))
    return metrics.ingest(session, run, batch)


def log_params(session: Session, mrun: MlflowRun, run: Run, items: Iterable[KeyValue]) -> None:
    _check_active(mrun)
    params = dict(mrun.params or {})
    for item in items:
        old = params.get(item.key)
        if old is not None and old != item.value:
            # MLflow's rule: a parameter is logged once; changing it is an error.
            raise invalid(
                f"Changing param values is not allowed. Param with key='{item.key}' was already logged "
                f"with value='{old}' for run ID='{mrun.run_uuid}'. Attempted logging new value '{item.value}'."
            )
        params[item.key] = item.value
    mrun.params = params
    config = dict(run.config or {})
    config["params"] = {**config.get("params", {}), **params}
    run.config = config
    session.flush()


def set_tags(session: Session, mrun: MlflowRun, run: Run, items: Iterable[KeyValue]) -> None:
    _check_active(mrun)
    tags = dict(mrun.tags or {})
    for item in items:
        tags[item.key] = item.value
        if item.key == FRAMEWORK_TAG:
            run.framework = _checked(RunUpdate, framework=item.value).framework
        elif item.key == MODEL_TAG:
            run.model = _checked(RunUpdate, model=item.value).model
    mrun.tags = tags
    session.flush()


def delete_tag(session: Session, mrun: MlflowRun, key: str) -> None:
    tags = dict(mrun.tags or {})
    if key not in tags:
        raise not_found(f"No tag with name: {key} in run with id {mrun.run_uuid}")
    del tags[key]
    mrun.tags = tags
    session.flush()


def _json_value(value: float) -> float | str:
    return value if math.isfinite(value) else encode_value(value)


def latest_metrics(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The value at the last step of each metric (MLflow's ``run.data.metrics``)."""
    last = (
        select(MetricPoint.metric_id, func.max(MetricPoint.step).label("step"))
        .join(MetricName, MetricName.id == MetricPoint.metric_id)
        .where(MetricName.run_id == run_id)
        .group_by(MetricPoint.metric_id)
        .subquery()
    )
    rows = session.execute(
        select(MetricName.name, MetricPoint.step, MetricPoint.value)
        .join(last, last.c.metric_id == MetricName.id)
        .join(MetricPoint, (MetricPoint.metric_id == last.c.metric_id) & (MetricPoint.step == last.c.step))
        .order_by(MetricName.name)
    )
    return [
        {
            "key": name,
            "value": encode_value(value) if value is None else _json_value(value),
            "timestamp": 0,
            "step": step,
        }
        for name, step, value in rows
    ]


def metric_history(session: Session, run_id: int, key: str) -> list[dict[str, Any]]:
    series = metrics.read_metrics(session, run_id, names=[key]).get(key, ([], []))
    return [{"key": key, "value": _json_value(v), "timestamp": 0, "step": s} for s, v in zip(*series)]


def run_info_json(mrun: MlflowRun, experiment_id: str) -> dict[str, Any]:
    info = {
        "run_id": mrun.run_uuid,
        "run_uuid": mrun.run_uuid,
        "run_name": mrun.run_name,
        "experiment_id": experiment_id,
        "user_id": mrun.user_id,
        "status": mrun.status,
        "start_time": mrun.start_time,
        "artifact_uri": "",
        "lifecycle_stage": mrun.lifecycle_stage,
    }
    if mrun.end_time is not None:
        info["end_time"] = mrun.end_time
    return info


def run_json(session: Session, mrun: MlflowRun, *, with_metrics: bool = True) -> dict[str, Any]:
    experiment = session.get(MlflowExperiment, mrun.experiment_id)
    return {
        "info": run_info_json(mrun, external_id(experiment)),
        "data": {
            "metrics": latest_metrics(session, mrun.run_id) if with_metrics else [],
            "params": [{"key": k, "value": v} for k, v in (mrun.params or {}).items()],
            "tags": [{"key": k, "value": v} for k, v in (mrun.tags or {}).items()],
        },
    }


def get_experiment_for(session: Session, mrun: MlflowRun) -> MlflowExperiment:
    return session.get(MlflowExperiment, mrun.experiment_id)


LIFECYCLE_BY_VIEW = {"ACTIVE_ONLY": ("active",), "DELETED_ONLY": ("deleted",), "ALL": ("active", "deleted")}


def search_runs(session: Session, project_id: int, spec: SearchRuns) -> tuple[list[MlflowRun], str | None]:
    """The project's runs of ``spec.experiment_ids`` that match the filter, ordered, one page of
    ``max_results`` from ``page_token`` (an offset) on; the next page's token or None."""
    ids = [get_experiment(session, project_id, e).id for e in spec.experiment_ids] or [
        default_experiment(session, project_id).id]
    rows = list(session.scalars(
        select(MlflowRun).where(MlflowRun.experiment_id.in_(ids),
                                MlflowRun.lifecycle_stage.in_(LIFECYCLE_BY_VIEW[spec.run_view_type]))))
    hits = search.search(rows, spec.filter, spec.order_by)
    try:
        start = int(spec.page_token or 0)
    except ValueError:
        raise invalid(f"page_token {spec.page_token!r} is not a token this server gave") from None
    if start < 0:
        raise invalid(f"page_token {spec.page_token!r} is not a token this server gave")
    page = hits[start:start + spec.max_results]
    more = start + spec.max_results < len(hits)
    return page, str(start + spec.max_results) if more else None
