"""One evaluation of one run: read its metrics, run the engine, store the outcome, enqueue alerts.

The three steps are separate so that live triage holds no transaction while the engine computes
(on SQLite every transaction takes the write lock: ingestion would wait for the evaluation).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from moeproxy.service.alerts.channels import channel_urls
from moeproxy.service.alerts.outbox import enqueue_due
from moeproxy.service.aliases import repository as aliases
from moeproxy.service.db import utcnow
from moeproxy.service.jobs import auto as auto_jobs
from moeproxy.service.loop import repository as layers
from moeproxy.service.metrics import repository as metrics
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from moeproxy.service.triage import repository
from moeproxy.service.triage.engine import SignatureEngine
from moeproxy.service.triage.schemas import TriageResponse
from moeproxy.signatures.canonical import BinnedRun
from moeproxy.signatures.settings import DEFAULT_SETTINGS, RunSettings, settings_from_config
from moeproxy.signatures.vocabulary import MetricAlias
from sqlalchemy import select
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

NO_METRICS_VERDICT = "no metrics yet"


@dataclass(frozen=True)
class EvaluationInput:
    run_id: int
    run_name: str
    project: str
    framework: str | None
    #: The run on triage's grid (metrics.read_binned): bounded however long the run is.
    run: BinnedRun
    aliases: list[MetricAlias]
    #: The newest library layer a reproduction job wrote for the run's model, read over the base
    #: library (service/loop); None: the base library alone.
    layer_path: str | None = None
    #: What the run's config says that its metrics cannot (a LoRA policy: its LR range).
    settings: RunSettings = DEFAULT_SETTINGS


def load_input(session: Session, run: Run) -> EvaluationInput:
    return EvaluationInput(
        run_id=run.id,
        run_name=run.name,
        project=session.scalar(select(Project.name).where(Project.id == run.project_id)) or "",
        framework=run.framework,
        run=metrics.read_binned(session, run.id, framework=run.framework, name=run.name),
        aliases=aliases.effective_aliases(session, run.project_id, run.framework),
        layer_path=getattr(layers.newest_layer(session, run.project_id, run.model_uri), "path", None),
        settings=settings_from_config(run.config),
    )


def compute(engine: SignatureEngine, data: EvaluationInput) -> TriageResponse:
    """The evaluation itself (no database); a run without metrics gets an empty ranking."""
    now = utcnow()
    if not data.run.series:
        return TriageResponse(run_id=data.run_id, evaluated_at=now, candidates=[], verdict=NO_METRICS_VERDICT)
    return engine.evaluate(
        data.run, run_id=data.run_id, framework=data.framework, aliases=data.aliases, now=now,
        layer_path=data.layer_path, settings=data.settings,
    )


def save(session: Session, result: TriageResponse, data: EvaluationInput, settings: Any) -> int:
    """Store the outcome (not for a run without metrics), create a reproduction job when the run
    stays weak (:mod:`moeproxy.service.jobs.auto`) and enqueue due alerts; returns alerts added."""
    if not result.candidates:
        return 0
    row = repository.store(session, result)
    auto_jobs.after_evaluation(session, row, settings=settings)
    result.history = repository.history(session, result.run_id)
    channels = list(channel_urls(settings))
    if not channels:
        return 0
    return len(
        enqueue_due(
            session,
            result,
            run_name=data.run_name,
            project=data.project,
            channels=channels,
            public_url=settings.public_url,
        )
    )


def evaluate_run(
    session: Session, run: Run, engine: SignatureEngine, settings: Any
) -> tuple[TriageResponse, int]:
    """All three steps in the caller's unit of work (on-demand evaluation on a request)."""
    data = load_input(session, run)
    result = compute(engine, data)
    return result, save(session, result, data, settings)
