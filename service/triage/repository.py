"""Storing and reading evaluations (plain functions on a session; the caller's scope commits)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime

from moeproxy.service.runs.models import Run
from moeproxy.service.triage.models import TriageClassHistory, TriageEvaluation
from moeproxy.service.triage.schemas import ClassHistory, TriageCandidate, TriageResponse, TriageSiblingNote
from sqlalchemy import func, select
from sqlalchemy.orm import Session

OUTCOME_TOP_K = 3  # ranking changes below the top three do not make a new history entry
# The sibling notes are stored in the evaluation's JSON ``details`` column under this key (a list
# the engine adds needs no schema migration); a row stored before them reads as no note.
SIBLINGS_KEY = "siblings"


def as_utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def outcome_key(verdict: str, candidates: Sequence[TriageCandidate]) -> str:
    top = ",".join(c.fault_class for c in candidates[:OUTCOME_TOP_K])
    strengths = ",".join(sorted(f"{c.fault_class}={c.strength}" for c in candidates))
    return hashlib.sha256(f"{verdict}|{top}|{strengths}".encode()).hexdigest()


def latest(session: Session, run_id: int) -> TriageEvaluation | None:
    return session.scalar(
        select(TriageEvaluation)
        .where(TriageEvaluation.run_id == run_id)
        .order_by(TriageEvaluation.id.desc())
        .limit(1)
    )


def latest_evaluated_at(session: Session, run_id: int) -> datetime | None:
    value = session.scalar(
        select(func.max(TriageEvaluation.evaluated_at)).where(TriageEvaluation.run_id == run_id)
    )
    return None if value is None else as_utc(value)


def store(session: Session, result: TriageResponse) -> TriageEvaluation:
    """Store ``result`` (folding it into the latest row when the outcome is unchanged) and update history.

    Two evaluations of one run can finish at once (live triage, ``POST .../triage``, a first
    ``GET``): each would read "no history row for this class" and insert it, and the second insert
    violates the primary key on PostgreSQL. Locking the run's row first serialises them; after the
    wait, READ COMMITTED shows the first one's rows, so the second folds into them. (SQLite
    ignores ``FOR UPDATE``: its write transaction already holds the database lock.)
    """
    session.execute(select(Run.id).where(Run.id == result.run_id).with_for_update())
    key = outcome_key(result.verdict, result.candidates)
    candidates = [c.model_dump(mode="json") for c in result.candidates]
    details = {**result.details, SIBLINGS_KEY: [n.model_dump(mode="json") for n in result.siblings]}
    top = result.candidates[0] if result.candidates else None
    row = latest(session, result.run_id)
    if row is not None and row.outcome_key == key:
        row.evaluated_at = result.evaluated_at
        row.evaluations += 1
        row.last_step, row.candidates, row.details = result.last_step, candidates, details
        row.top_score = top.score if top else 0.0
    else:
        row = TriageEvaluation(
            run_id=result.run_id,
            first_evaluated_at=result.evaluated_at,
            evaluated_at=result.evaluated_at,
            last_step=result.last_step,
            verdict=result.verdict,
            top_class=top.fault_class if top else None,
            top_score=top.score if top else 0.0,
            top_strength=top.strength if top else "weak",
            outcome_key=key,
            candidates=candidates,
            details=details,
        )
        session.add(row)
    _update_history(session, result)
    session.flush()
    return row


def _update_history(session: Session, result: TriageResponse) -> None:
    existing = {
        h.fault_class: h
        for h in session.scalars(select(TriageClassHistory).where(TriageClassHistory.run_id == result.run_id))
    }
    for rank, candidate in enumerate(result.candidates):
        h = existing.get(candidate.fault_class)
        if h is None:
            h = TriageClassHistory(run_id=result.run_id, fault_class=candidate.fault_class)
            session.add(h)
        h.last_score, h.last_strength = candidate.score, candidate.strength
        if candidate.strength == "strong" and h.first_likely_at is None:
            h.first_likely_at, h.first_likely_step = result.evaluated_at, result.last_step
        if rank == 0 and h.first_top_at is None:
            h.first_top_at, h.first_top_step = result.evaluated_at, result.last_step


def history(session: Session, run_id: int) -> list[ClassHistory]:
    rows = session.scalars(select(TriageClassHistory).where(TriageClassHistory.run_id == run_id))
    out = [
        ClassHistory(
            fault_class=h.fault_class,
            first_likely_at=None if h.first_likely_at is None else as_utc(h.first_likely_at),
            first_likely_step=h.first_likely_step,
            first_top_at=None if h.first_top_at is None else as_utc(h.first_top_at),
            first_top_step=h.first_top_step,
            last_score=h.last_score,
            last_strength=h.last_strength,
        )
        for h in rows
    ]
    return sorted(
        out, key=lambda h: (h.first_likely_at is None, h.first_likely_at or datetime.min.replace(tzinfo=UTC))
    )


def to_response(session: Session, row: TriageEvaluation, *, with_history: bool = True) -> TriageResponse:
    details = dict(row.details or {})
    siblings = details.pop(SIBLINGS_KEY, None) or []
    return TriageResponse(
        run_id=row.run_id,
        evaluated_at=as_utc(row.evaluated_at),
        candidates=[TriageCandidate.model_validate(c) for c in row.candidates],
        verdict=row.verdict,
        siblings=[TriageSiblingNote.model_validate(n) for n in siblings],
        last_step=row.last_step,
        evaluations=row.evaluations,
        history=history(session, row.run_id) if with_history else [],
        details=details,
    )


def evaluations(session: Session, run_id: int, limit: int = 100) -> list[TriageEvaluation]:
    """The run's outcome changes, newest first."""
    return list(
        session.scalars(
            select(TriageEvaluation)
            .where(TriageEvaluation.run_id == run_id)
            .order_by(TriageEvaluation.id.desc())
            .limit(limit)
        )
    )
