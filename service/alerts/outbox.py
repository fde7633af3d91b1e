"""The outbox: enqueue due alerts inside the evaluation's unit of work; deliver them later.

Delivery never holds a transaction open across HTTP: a worker claims due rows (a lease, so a
crashed worker's claim expires and another picks the row up), sends outside any transaction,
then records the outcome.  A transient failure reschedules the row with exponential backoff, or
exactly after ``Retry-After`` when the receiver sent one; the row becomes ``sent`` only after a
2xx, so an alert is neither lost nor sent twice by this process.  (Two workers cannot both hold
a lease; a worker that dies after the receiver accepted but before it recorded ``sent`` resends
once after the lease — at-least-once is the most any webhook without an idempotency key allows.)
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from moeproxy.service.alerts.channels import Channel, DeliveryResult, make_channel
from moeproxy.service.alerts.messages import (
    JOB_KINDS,
    AlertMessage,
    JobMessage,
    RankedClass,
    message_from_json,
)
from moeproxy.service.alerts.models import AlertOutbox, OutboxStatus
from moeproxy.service.alerts.policy import due_alerts
from moeproxy.service.db import Database, add_unless_taken, utcnow
from moeproxy.service.triage.schemas import TriageResponse
from moeproxy.signatures.siblings import SiblingNote
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


def as_utc(value: datetime) -> datetime:
    # SQLite hands DateTime(timezone=True) back naive; every stored time is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 2.0
    max_backoff_s: float = 300.0
    max_attempts: int = 200  # ~16 h at the cap: a receiver down for a night still gets the alert
    lease_s: float = 120.0

    def backoff_s(self, attempts: int, rng: random.Random | None = None) -> float:
        delay = min(self.max_backoff_s, self.base_s * 2 ** max(0, attempts - 1))
        return delay / 2 + (rng or random).random() * delay / 2  # "equal jitter"


def alerted_levels(session: Session, run_id: int, channel: str) -> dict[str, int]:
    rows = session.execute(
        select(AlertOutbox.fault_class, func.max(AlertOutbox.level))
        .where(AlertOutbox.run_id == run_id, AlertOutbox.channel == channel)
        .group_by(AlertOutbox.fault_class)
    )
    return {fault_class: level for fault_class, level in rows}


def build_message(
    triage: TriageResponse, *, rank: int, level: int, run_name: str, project: str, public_url: str
) -> AlertMessage:
    candidate = triage.candidates[rank]
    return AlertMessage(
        run_id=triage.run_id,
        run_name=run_name,
        project=project,
        fault_class=candidate.fault_class,
        family=candidate.family,
        score=candidate.score,
        strength=candidate.strength,
        level=level,
        verdict=triage.verdict,
        evaluated_at=as_utc(triage.evaluated_at).isoformat(timespec="seconds"),
        url=f"{public_url.rstrip('/')}/runs/{triage.run_id}",
        last_step=triage.last_step,
        evidence=tuple(candidate.evidence),
        top=tuple(RankedClass(c.fault_class, c.family, c.score, c.strength) for c in triage.candidates[:3]),
        siblings=tuple(SiblingNote.from_dict(n.model_dump()) for n in triage.siblings),
    )


def enqueue_due(
    session: Session,
    triage: TriageResponse,
    *,
    run_name: str,
    project: str,
    channels: Sequence[str],
    public_url: str,
) -> list[AlertOutbox]:
    """Add outbox rows for every (class, level, channel) now due; returns the rows added."""
    added = []
    for channel in channels:
        for due in due_alerts(triage.candidates, alerted_levels(session, triage.run_id, channel)):
            message = build_message(
                triage,
                rank=due.rank,
                level=due.level,
                run_name=run_name,
                project=project,
                public_url=public_url,
            )
            row = _insert_once(session, run_id=triage.run_id, fault_class=due.candidate.fault_class,
                               level=due.level, channel=channel, payload=message.to_json())
            if row is not None:
                added.append(row)
    return added


def enqueue_message(session: Session, message: JobMessage, *, channels: Sequence[str]) -> list[AlertOutbox]:
    """Outbox rows for a job's message, once per (job, kind, channel): a job retried by another
    worker, or a creation that races, does not say the same thing twice."""
    added = []
    for channel in channels:
        row = _insert_once(session, run_id=message.run_id,
                           fault_class=f"job:{message.job_id}",  # the unique key: one row per job ...
                           level=JOB_KINDS.index(message.kind) + 1,  # ... and kind
                           channel=channel, payload=message.to_json())
        if row is not None:
            added.append(row)
    return added


def _insert_once(session: Session, **fields) -> AlertOutbox | None:
    """Add a pending row unless its (run, class, level, channel) is already there: another
    evaluator or worker may have enqueued it first (the unique key decides, in a savepoint so the
    caller's transaction goes on). None when it was there."""
    row = AlertOutbox(**fields, status=OutboxStatus.pending.value, next_attempt_at=utcnow())
    return row if add_unless_taken(session, row) else None


def _claimable(now: datetime):
    return or_(
        and_(AlertOutbox.status == OutboxStatus.pending.value, AlertOutbox.next_attempt_at <= now),
        and_(AlertOutbox.status == OutboxStatus.sending.value, AlertOutbox.lease_until < now),
    )


def claim_due(session: Session, *, now: datetime, limit: int, lease_s: float) -> list[AlertOutbox]:
    """Lease up to ``limit`` due rows to the caller (compare-and-set per row: safe across workers)."""
    ids = session.scalars(
        select(AlertOutbox.id).where(_claimable(now)).order_by(AlertOutbox.next_attempt_at).limit(limit)
    ).all()
    claimed = []
    for row_id in ids:
        result = session.execute(
            update(AlertOutbox)
            .where(AlertOutbox.id == row_id, _claimable(now))
            .values(status=OutboxStatus.sending.value, lease_until=now + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            claimed.append(row_id)
    return list(session.scalars(select(AlertOutbox).where(AlertOutbox.id.in_(claimed)))) if claimed else []


def record_result(
    session: Session,
    row_id: int,
    result: DeliveryResult,
    *,
    now: datetime,
    policy: RetryPolicy,
    rng: random.Random | None = None,
) -> AlertOutbox:
    row = session.get(AlertOutbox, row_id)
    row.attempts += 1
    row.last_status_code = result.status_code
    row.lease_until = None
    if result.ok:
        row.status, row.sent_at, row.last_error = OutboxStatus.sent.value, now, None
        return row
    row.last_error = result.detail
    if result.permanent or row.attempts >= policy.max_attempts:
        row.status = OutboxStatus.dead.value
        log.error(
            "alert %s to %s given up after %d attempts: %s", row.id, row.channel, row.attempts, result.detail
        )
        return row
    wait_s = result.retry_after_s if result.retry_after_s is not None else policy.backoff_s(row.attempts, rng)
    row.status = OutboxStatus.pending.value
    row.next_attempt_at = now + timedelta(seconds=wait_s)
    log.warning("alert %s to %s failed (%s); retry in %.1f s", row.id, row.channel, result.detail, wait_s)
    return row


ChannelResolver = Callable[[str], Channel | None]


def resolver_from_urls(urls: Mapping[str, str]) -> ChannelResolver:
    cache: dict[str, Channel] = {}

    def resolve(name: str) -> Channel | None:
        if name not in urls:
            return None
        if name not in cache:
            cache[name] = make_channel(name, urls[name])
        return cache[name]

    return resolve


def deliver_due(
    db: Database,
    resolve: ChannelResolver,
    *,
    policy: RetryPolicy = RetryPolicy(),
    limit: int = 20,
    now: Callable[[], datetime] = utcnow,
) -> int:
    """Send every row due now, once; returns how many were attempted."""
    with db.scope() as session:
        rows = [
            (r.id, r.channel, r.payload)
            for r in claim_due(session, now=now(), limit=limit, lease_s=policy.lease_s)
        ]
    for row_id, channel_name, payload in rows:
        channel = resolve(channel_name)
        if channel is None:
            result = DeliveryResult(
                ok=False, permanent=True, detail=f"channel {channel_name!r} is not configured"
            )
        else:
            result = channel.send(message_from_json(payload))
        with db.scope() as session:
            record_result(session, row_id, result, now=now(), policy=policy)
    return len(rows)


def next_due_in_s(db: Database, *, now: datetime | None = None) -> float | None:
    """Seconds until the next pending row is due (0 if overdue), None when nothing is pending."""
    now = now or utcnow()
    with db.scope() as session:
        first = session.scalar(
            select(func.min(AlertOutbox.next_attempt_at)).where(
                AlertOutbox.status == OutboxStatus.pending.value
            )
        )
        lease = session.scalar(
            select(func.min(AlertOutbox.lease_until)).where(AlertOutbox.status == OutboxStatus.sending.value)
        )
    times = [as_utc(t) for t in (first, lease) if t is not None]
    if not times:
        return None
    return max(0.0, (min(times) - now).total_seconds())


class OutboxWorker:
    """A daemon thread that delivers the outbox; :meth:`wake` after enqueueing to send at once."""

    def __init__(
        self,
        db: Database,
        resolve: ChannelResolver,
        *,
        policy: RetryPolicy = RetryPolicy(),
        idle_poll_s: float = 30.0,
    ):
        self.db, self.resolve, self.policy, self.idle_poll_s = db, resolve, policy, idle_poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> OutboxWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="moeproxy-alert-outbox", daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before delivering: a wake() during delivery is not lost
            try:
                while deliver_due(self.db, self.resolve, policy=self.policy) and not self._stop.is_set():
                    pass
                wait_s = next_due_in_s(self.db)
            except Exception:  # a database hiccup must not kill the worker; try again later
                log.exception("alert outbox delivery failed")
                wait_s = self.policy.base_s
            self._wake.wait(self.idle_poll_s if wait_s is None else min(wait_s, self.idle_poll_s))
