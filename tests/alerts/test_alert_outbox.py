"""The outbox end to end against a real local receiver: sent once, 429/500 retried, no duplicate."""

from __future__ import annotations

import time
from datetime import timedelta

from moeproxy.service.alerts.models import AlertOutbox, OutboxStatus
from moeproxy.service.alerts.outbox import (
    OutboxWorker,
    RetryPolicy,
    as_utc,
    deliver_due,
    enqueue_due,
    resolver_from_urls,
)
from moeproxy.service.db import utcnow
from moeproxy.service.triage.schemas import TriageCandidate, TriageResponse
from sqlalchemy import select

FAST = RetryPolicy(base_s=0.01, max_backoff_s=0.05)


def triage(run_id: int, *ranked: tuple[str, float, str]) -> TriageResponse:
    return TriageResponse(
        run_id=run_id,
        evaluated_at=utcnow(),
        last_step=50,
        verdict=ranked[0][0],
        candidates=[
            TriageCandidate(
                fault_class=c, family="x", score=score, strength=strength, evidence=[f"{c} evidence"]
            )
            for c, score, strength in ranked
        ],
    )


def enqueue(db, t: TriageResponse, channels=("slack",)):
    with db.scope() as s:
        return len(
            enqueue_due(
                s, t, run_name="qwen3-grpo", project="rl-team", channels=channels, public_url="http://ui"
            )
        )


def rows(db):
    with db.scope() as s:
        return list(s.scalars(select(AlertOutbox).order_by(AlertOutbox.id)))


def drive(db, resolve, until, policy=FAST, tries=50):
    for _ in range(tries):
        deliver_due(db, resolve, policy=policy)
        if until():
            return
        time.sleep(0.02)
    raise AssertionError("outbox did not settle")


def test_alert_delivered_once_through_429_and_500(alerts_db, run_id, receiver):
    receiver.script = [(429, {"Retry-After": "1"}), (500, {})]
    resolve = resolver_from_urls({"slack": receiver.url})
    weak = triage(run_id, ("rollout_logp_precision", 0.4, "weak"), ("healthy", 0.3, "weak"))
    strong = triage(run_id, ("healthy", 0.8, "strong"), ("rollout_logp_precision", 0.7, "strong"))

    assert enqueue(alerts_db, weak) == 0  # weak classes and healthy never alert
    assert enqueue(alerts_db, strong) == 1
    assert enqueue(alerts_db, strong) == 0  # re-evaluation with the same outcome: no second row
    drive(alerts_db, resolve, until=lambda: len(receiver.accepted) == 1)

    assert [s.status for s in receiver.seen] == [429, 500, 200]
    assert receiver.seen[1].at - receiver.seen[0].at >= 1.0
    (row,) = rows(alerts_db)
    assert (row.status, row.attempts, row.fault_class, row.level) == ("sent", 2, "rollout_logp_precision", 1)
    assert receiver.accepted[0].body["blocks"][0]["text"]["text"] == "Likely fault: rollout_logp_precision"

    # Nothing is due any more: more evaluations and deliveries send nothing.
    assert enqueue(alerts_db, strong) == 0
    deliver_due(alerts_db, resolve, policy=FAST)
    assert len(receiver.accepted) == 1

    # Escalation: the class becomes the verdict -> exactly one more alert; dropping back does not re-alert.
    top = triage(run_id, ("rollout_logp_precision", 0.9, "strong"), ("healthy", 0.2, "weak"))
    assert enqueue(alerts_db, top) == 1
    assert enqueue(alerts_db, top) == 0
    assert enqueue(alerts_db, strong) == 0
    drive(alerts_db, resolve, until=lambda: len(receiver.accepted) == 2)
    assert (
        receiver.accepted[1]
        .body["text"]
        .startswith("rollout_logp_precision (0.90, strong) is now the most likely")
    )


def test_long_retry_after_is_honoured_by_the_schedule(alerts_db, run_id, receiver):
    receiver.script = [(429, {"Retry-After": "30"})]
    resolve = resolver_from_urls({"webhook": receiver.url})
    enqueue(alerts_db, triage(run_id, ("gradient_overflow", 0.95, "strong")), channels=("webhook",))
    t0 = utcnow()
    assert deliver_due(alerts_db, resolve, policy=FAST, now=lambda: t0) == 1
    (row,) = rows(alerts_db)
    assert row.status == OutboxStatus.pending.value and row.last_status_code == 429
    assert as_utc(row.next_attempt_at) - t0 >= timedelta(seconds=30)
    # Not due before Retry-After has passed ...
    assert deliver_due(alerts_db, resolve, policy=FAST, now=lambda: t0 + timedelta(seconds=29)) == 0
    # ... and delivered after.
    assert deliver_due(alerts_db, resolve, policy=FAST, now=lambda: t0 + timedelta(seconds=31)) == 1
    assert len(receiver.accepted) == 1 and rows(alerts_db)[0].status == "sent"


def test_permanent_refusal_is_not_retried(alerts_db, run_id, receiver):
    receiver.script = [(404, {})]
    resolve = resolver_from_urls({"webhook": receiver.url})
    enqueue(alerts_db, triage(run_id, ("gradient_overflow", 0.95, "strong")), channels=("webhook",))
    deliver_due(alerts_db, resolve, policy=FAST)
    deliver_due(alerts_db, resolve, policy=FAST)
    assert len(receiver.seen) == 1 and rows(alerts_db)[0].status == "dead"


def test_expired_lease_is_picked_up_again(alerts_db, run_id, receiver):
    """A worker that died holding a claim does not lose the alert."""
    from moeproxy.service.alerts.outbox import claim_due

    enqueue(alerts_db, triage(run_id, ("gradient_overflow", 0.95, "strong")))
    now = utcnow()
    with alerts_db.scope() as s:
        assert len(claim_due(s, now=now, limit=5, lease_s=60)) == 1  # ... and this "worker" dies
    resolve = resolver_from_urls({"slack": receiver.url})
    assert deliver_due(alerts_db, resolve, now=lambda: now + timedelta(seconds=30)) == 0
    assert deliver_due(alerts_db, resolve, now=lambda: now + timedelta(seconds=61)) == 1
    assert len(receiver.accepted) == 1


def test_worker_thread_delivers_after_wake(alerts_db, run_id, receiver):
    receiver.script = [(500, {})]
    worker = OutboxWorker(
        alerts_db, resolver_from_urls({"slack": receiver.url}), policy=FAST, idle_poll_s=5
    ).start()
    try:
        enqueue(alerts_db, triage(run_id, ("lr_misconfiguration", 0.99, "strong")))
        worker.wake()
        deadline = time.monotonic() + 10
        while not receiver.accepted and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        worker.stop()
    assert [s.status for s in receiver.seen] == [500, 200]
    assert rows(alerts_db)[0].status == "sent"
