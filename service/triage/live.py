"""Live evaluation: the post-ingest event pokes a run; a background thread evaluates it, at most
once per ``MOEPROXY_TRIAGE_INTERVAL_S`` per run, never on the ingest request's thread.

Debouncing is leading- and trailing-edge: the first poke of a quiet run is evaluated at once;
pokes within the interval after an evaluation are merged into one more evaluation when the
interval has passed, so the last metrics of a burst are always evaluated.  Across processes
(several uvicorn workers) the stored ``evaluated_at`` is checked before each evaluation, so
workers that each saw part of the ingest do not evaluate one run more often than the interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from moeproxy.service import events
from moeproxy.service.alerts.channels import channel_urls
from moeproxy.service.alerts.outbox import OutboxWorker, resolver_from_urls
from moeproxy.service.db import Database, utcnow
from moeproxy.service.runs.models import Run
from moeproxy.service.triage import repository
from moeproxy.service.triage.engine import SignatureEngine
from moeproxy.service.triage.errors import LibraryUnavailable
from moeproxy.service.triage.service import compute, load_input, save
from sqlalchemy import Connection

log = logging.getLogger(__name__)


class LiveTriage:
    MAX_TRACKED_RUNS = 10_000

    def __init__(
        self,
        database: Database,
        engine: SignatureEngine,
        settings: Any,
        *,
        interval_s: float | None = None,
        on_alerts: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.database, self.engine, self.settings = database, engine, settings
        self.interval_s = settings.triage_interval_s if interval_s is None else interval_s
        self.on_alerts = on_alerts
        self.clock = clock
        self.evaluations = 0  # evaluations run (not counting those skipped for another worker's)
        self._due: dict[int, float] = {}  # run id -> monotonic time it may be evaluated
        self._last: dict[int, float] = {}  # run id -> monotonic time of its last evaluation start
        self._busy: set[int] = set()
        self._stored_at: dict[int, datetime] = {}  # run id -> evaluated_at of our own last evaluation
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the event side (must be quick: it runs on the events thread) --------------------------

    def on_ingested(self, event: events.MetricsIngested) -> None:
        self.poke(event.run_id)

    def poke(self, run_id: int) -> None:
        with self._cond:
            due = max(self.clock(), self._last.get(run_id, float("-inf")) + self.interval_s)
            if run_id not in self._due or due < self._due[run_id]:
                self._due[run_id] = due
            self._cond.notify()

    # -- the worker side -----------------------------------------------------------------------

    def start(self) -> LiveTriage:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="moeproxy-live-triage", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def idle(self) -> bool:
        with self._cond:
            return not self._due and not self._busy

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.01)
        return False

    def _next(self) -> int | None:
        with self._cond:
            while not self._stop:
                now = self.clock()
                ready = [
                    (due, run_id)
                    for run_id, due in self._due.items()
                    if due <= now and run_id not in self._busy
                ]
                if ready:
                    _due, run_id = min(ready)
                    del self._due[run_id]
                    self._last[run_id] = now
                    if len(self._last) > self.MAX_TRACKED_RUNS:  # forget runs quiet for an interval
                        self._last = {r: t for r, t in self._last.items() if t > now - self.interval_s}
                    self._busy.add(run_id)
                    return run_id
                waits = [due - now for run_id, due in self._due.items() if run_id not in self._busy]
                self._cond.wait(timeout=min(waits) if waits else None)
            return None

    def _loop(self) -> None:
        self._warm()
        while (run_id := self._next()) is not None:
            ran = False
            try:
                ran = self.evaluate(run_id)
            except LibraryUnavailable as exc:  # a configuration problem, not a bug: say it once per run
                log.warning("live triage of run %s skipped: %s", run_id, exc.detail)
            except Exception:  # one run's failure must not stop live triage for the others
                log.exception("live triage of run %s failed", run_id)
            finally:
                with self._cond:
                    self._busy.discard(run_id)
                    self.evaluations += int(ran)
                    self._cond.notify_all()

    def _warm(self) -> None:
        """Load the library and compile DTW now, at start-up, rather than inside the first
        evaluation: the compile holds the GIL for seconds, and the first evaluation comes right
        after a job's first batch (an import of 1,000,000 points waited 3.4 s on its second
        request for it). Until it is done, evaluations wait; ingest does not."""
        try:
            self.engine.warm()
        except LibraryUnavailable as exc:
            log.warning("live triage could not load its library at start-up: %s", exc.detail)
        except Exception:  # evaluations will try again and say what is wrong, run by run
            log.exception("live triage warm-up failed")

    def evaluate(self, run_id: int) -> bool:
        """Evaluate one run now; False when skipped (evaluated elsewhere within the interval, or gone).

        No transaction is held while the engine computes (see service.py).
        """
        with self.database.scope() as session:
            stored = repository.latest_evaluated_at(session, run_id)
            ours = self._stored_at.get(run_id)
            if stored is not None and self.interval_s > 0 and (ours is None or stored > ours):
                age_s = (utcnow() - stored).total_seconds()
                if 0 <= age_s < self.interval_s:  # another worker evaluated it just now
                    with self._cond:
                        self._due[run_id] = self.clock() + (self.interval_s - age_s)
                    return False
            run = session.get(Run, run_id)
            if run is None:
                return False
            data = load_input(session, run)
        result = compute(self.engine, data)
        with self.database.scope() as session:
            if session.get(Run, run_id) is None:  # deleted while we computed
                return False
            alerts = save(session, result, data, self.settings)
        self._stored_at[run_id] = result.evaluated_at
        if alerts and self.on_alerts is not None:
            self.on_alerts()
        return True


def get_engine(app: FastAPI) -> SignatureEngine:
    engine = getattr(app.state, "triage_engine", None)
    if engine is None:
        engine = app.state.triage_engine = SignatureEngine(app.state.settings.fingerprints)
    return engine


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start live triage and the alert outbox with the app (``LIFESPAN_HOOKS`` in service/app.py).

    Both are off when the app's Database is bound to one open connection (the tests' rolled-back
    transaction): a connection cannot be shared with background threads.  DTW compiles (seconds,
    SPEC section 8) on the live-triage thread as it starts, before any evaluation.
    """
    database = app.state.database
    if isinstance(database.bind, Connection):
        log.info("live triage and alert delivery are off: the database is one shared connection")
        app.state.live_triage = app.state.alert_outbox = None
        yield
        return
    settings = app.state.settings
    urls = channel_urls(settings)
    outbox = OutboxWorker(database, resolver_from_urls(urls)).start() if urls else None
    live = LiveTriage(database, get_engine(app), settings, on_alerts=outbox.wake if outbox else None).start()
    app.state.live_triage, app.state.alert_outbox = live, outbox
    events.on_metrics_ingested(live.on_ingested)
    try:
        yield
    finally:
        events.remove_callback(live.on_ingested)
        live.stop()
        if outbox is not None:
            outbox.stop()
