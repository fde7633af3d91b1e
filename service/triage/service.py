"""One evaluation of one run: read its metrics, run the engine, store the outcome, enqueue alerts."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from moeproxy.service.aliases import repository as aliases
from moeproxy.service.alerts.channels import channel_urls
from moeproxy.service.alerts.outbox import enqueue_due
from moeproxy.service.db import utcnow
from moeproxy.service.metrics import repository as metrics
from moeproxy.service.runs.models import Run
from moeproxy.service.tokens.models import Project
from moeproxy.service.triage import repository
from moeproxy.service.triage.engine import SignatureEngine
from moeproxy.service.triage.schemas import TriageResponse

log = logging.getLogger(__name__)

NO_METRICS_VERDICT = "no metrics yet"


def evaluate_run(session: Session, run: Run, engine: SignatureEngine, settings: Any) -> tuple[TriageResponse, int]:
    """Evaluate and store; returns the result and the number of alerts enqueued.

    A run without metrics is answered (``candidates`` empty) but not stored.
    """
    series = metrics.read_metric_arrays(session, run.id)
    now = utcnow()
    if not series:
        return TriageResponse(run_id=run.id, evaluated_at=now, candidates=[], verdict=NO_METRICS_VERDICT), 0
    result = engine.evaluate(
        series,
        run_id=run.id,
        framework=run.framework,
        aliases=aliases.effective_aliases(session, run.project_id, run.framework),
        now=now,
    )
    repository.store(session, result)
    channels = list(channel_urls(settings))
    added = 0
    if channels:
        project = session.scalar(select(Project.name).where(Project.id == run.project_id))
        added = len(
            enqueue_due(
                session, result, run_name=run.name, project=project, channels=channels, public_url=settings.public_url
            )
        )
    result.history = repository.history(session, run.id)
    return result, added
