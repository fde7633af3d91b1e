"""Post-commit hooks: tell other parts of the service that metrics arrived.

Live triage (a background job debounced per run) subscribes here::

    from moeproxy.service import events

    @events.on_metrics_ingested
    def wake_triage(event: events.MetricsIngested) -> None:
        scheduler.poke(event.run_id)

Contract:

* A repository calls :func:`defer` inside the unit of work; the event is
  handed to callbacks only after that unit of work has **committed** (a rolled
  back ingest fires nothing), by :meth:`moeproxy.service.db.Database.scope`.
* Callbacks run on one background thread (a single-worker executor), in
  commit order, never on the request's thread: a slow callback delays later
  callbacks, not responses.  They must be quick (enqueue, set a flag) and
  thread-safe with respect to the rest of the app.  An exception in a callback
  is logged and swallowed.
* Events are per process: with several uvicorn workers each worker sees the
  ingests it served.  Anything that must see every ingest across processes
  should read the database (the event only says *which run* to look at).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

_PENDING_KEY = "moeproxy.pending_events"


@dataclass(frozen=True, slots=True)
class MetricsIngested:
    project_id: int
    run_id: int
    first_step: int
    last_step: int
    points: int
    names: tuple[str, ...]


MetricsCallback = Callable[[MetricsIngested], None]

_callbacks: list[MetricsCallback] = []
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def on_metrics_ingested(callback: MetricsCallback) -> MetricsCallback:
    """Register ``callback`` (usable as a decorator); returns it unchanged."""
    with _lock:
        if callback not in _callbacks:
            _callbacks.append(callback)
    return callback


def remove_callback(callback: MetricsCallback) -> None:
    with _lock:
        if callback in _callbacks:
            _callbacks.remove(callback)


def defer(session: Session, event: MetricsIngested) -> None:
    """Queue ``event`` to fire once ``session``'s unit of work commits."""
    session.info.setdefault(_PENDING_KEY, []).append(event)


def discard_pending(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)


def dispatch_pending(session: Session) -> list[Future]:
    """Hand the session's committed events to the callbacks (non-blocking)."""
    pending = session.info.pop(_PENDING_KEY, None)
    if not pending:
        return []
    with _lock:
        callbacks = list(_callbacks)
    if not callbacks:
        return []
    executor = _get_executor()
    return [executor.submit(_run, cb, ev) for ev in pending for cb in callbacks]


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moeproxy-events")
        return _executor


def _run(callback: MetricsCallback, event: MetricsIngested) -> None:
    try:
        callback(event)
    except Exception:  # a subscriber's bug must not break ingestion
        log.exception("metrics-ingested callback %r failed", callback)


def drain(timeout_s: float | None = 10.0) -> None:
    """Wait until every event dispatched so far has been handled (tests, shutdown)."""
    executor = _executor
    if executor is None:
        return
    executor.submit(lambda: None).result(timeout=timeout_s)
