"""The worker: claim a job, run the executor on it while heartbeating, record the outcome.

``moeproxy worker`` runs :func:`run_worker` with the default executor,
``moeproxy.service.jobs.executor.execute``, imported only when a job is run: a worker without it
(the module missing from an install) fails each job it claims with a clear error instead of
crashing.  Tests and embedders pass their own ``executor``.

While the executor runs, a background thread heartbeats every third of the lease, so a long step
that does not call ``ctx.heartbeat()`` keeps its lease; the heartbeat reads cancel requests, which
``ctx.heartbeat()`` and ``ctx.raise_if_cancelled()`` turn into :class:`JobCancelled` on the
executor's thread.  A worker told to stop (:meth:`Worker.stop`, SIGTERM, Ctrl-C) while it runs a
job interrupts the executor and puts the job back to ``queued`` for another worker.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from moeproxy.service.db import Database
from moeproxy.service.jobs import notify, queue
from moeproxy.service.jobs.models import FINISHED_STATES, ReproductionJob
from moeproxy.service.jobs.spec import JobCancelled, JobOutcome, JobSpec, LeaseLost

from moeproxy.extras import from_import_error

log = logging.getLogger(__name__)

EXECUTOR_MODULE = "moeproxy.service.jobs.executor"
Executor = Callable[[JobSpec, "JobContext"], JobOutcome | None]


class WorkerStopping(BaseException):
    """Raised on the worker's thread while it runs a job and is told to stop (a BaseException, as
    KeyboardInterrupt is, so an executor's ``except Exception`` does not swallow it)."""


class ExecutorUnavailable(RuntimeError):
    pass


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def load_default_executor() -> Executor:
    try:
        module = importlib.import_module(EXECUTOR_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != EXECUTOR_MODULE:
            raise  # the executor exists but something it imports does not: say that, below
        raise ExecutorUnavailable(
            f"no job executor: the module {EXECUTOR_MODULE} is not installed, so this worker cannot "
            "build proxies or run reproductions"
        ) from None
    execute = getattr(module, "execute", None)
    if not callable(execute):
        raise ExecutorUnavailable(f"{EXECUTOR_MODULE} has no execute(job, ctx) function")
    return execute


class JobContext:
    """What an executor gets besides its :class:`JobSpec`: the lease, progress and cancellation.

    ``heartbeat(progress=None, *, device_hours=None, planner_estimate=None)`` extends the lease now,
    stores the figures given on the job row (``progress`` a JSON object such as
    ``{"done": 3, "total": 8}``), and raises :class:`JobCancelled` when a cancel was requested or
    :class:`LeaseLost` when the job is no longer this worker's.  ``cancelled`` / ``lost`` are the
    flags as of the last heartbeat (the background one included), without a database round trip;
    ``raise_if_cancelled()`` raises on them.  ``database`` is the worker's
    :class:`~moeproxy.service.db.Database` (``with ctx.database.scope() as session: ...``).
    """

    def __init__(self, job: JobSpec, lease: queue.Lease, *, database: Database, lease_s: float, settings: Any):
        self.job = job
        self.database = database
        self.settings = settings
        self.lease_s = lease_s
        self._lease = lease
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._lost = threading.Event()
        self._stop_beating = threading.Event()

    @property
    def worker_id(self) -> str:
        return self._lease.worker_id

    @property
    def ray_address(self) -> str | None:
        return getattr(self.settings, "ray_address", None)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    @property
    def lease(self) -> queue.Lease:
        return self._lease

    def heartbeat(
        self,
        progress: Mapping[str, Any] | None = None,
        *,
        device_hours: float | None = None,
        planner_estimate: Mapping[str, Any] | None = None,
    ) -> None:
        self._beat(progress=progress, device_hours=device_hours, planner_estimate=planner_estimate)
        self.raise_if_cancelled()

    def raise_if_cancelled(self) -> None:
        if self.lost:
            raise LeaseLost(f"job {self.job.id} is no longer worker {self.worker_id}'s")
        if self.cancelled:
            raise JobCancelled(f"job {self.job.id} was cancelled")

    def _beat(self, **figures: Any) -> None:
        with self._lock:
            if self.lost:
                return
            with self.database.scope() as session:
                beat, self._lease = queue.heartbeat(session, self._lease, self.lease_s, **figures)
            if not beat.held:
                self._lost.set()
            elif beat.cancel_requested:
                self._cancelled.set()

    def _beat_in_background(self) -> None:
        interval_s = self.lease_s / 3
        while not self._stop_beating.wait(interval_s):
            try:
                self._beat()
            except Exception:  # the database away for a moment: the next beat retries within the lease
                log.exception("job %s: heartbeat failed", self.job.id)
            if self.lost:
                return


class Worker:
    def __init__(
        self,
        database: Database,
        *,
        executor: Executor | None = None,
        worker_id: str | None = None,
        lease_s: float | None = None,
        poll_s: float | None = None,
        max_attempts: int | None = None,
        settings: Any = None,
    ):
        if settings is None:
            from moeproxy.config import get_settings

            settings = get_settings()
        self.database = database
        self.settings = settings
        self.executor = executor
        self.worker_id = worker_id or default_worker_id()
        self.lease_s = lease_s if lease_s is not None else settings.job_lease_s
        self.poll_s = poll_s if poll_s is not None else settings.worker_poll_s
        self.max_attempts = max_attempts if max_attempts is not None else settings.job_max_attempts
        self.jobs_run = 0
        self._stop = threading.Event()
        self._in_executor = threading.Event()
        self._interrupted = threading.Event()  # a signal raised WorkerStopping inside the executor
        self._thread_id: int | None = None

    # -- stopping ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop once the current job has ended (an idle worker at once).  Signals stop sooner: see
        :meth:`install_signal_handlers`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker; in a job they raise :class:`WorkerStopping` inside the
        executor, and the job is released.  Only from the main thread (Python's signal rule)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("worker %s: signal %s, stopping", self.worker_id, signum)
            self._stop.set()
            if self._in_executor.is_set():
                self._interrupted.set()
                raise WorkerStopping(signum)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Claim and run jobs until stopped (``once``: at most one job, then return); jobs run."""
        while not self._stop.is_set():
            ran = self.run_one()
            if once:
                break
            if not ran:
                self._stop.wait(self.poll_s)
        return self.jobs_run

    def run_one(self) -> bool:
        """Claim one job and run it to its end; False when none was queued."""
        with self.database.scope() as session:
            claimed = queue.claim(session, self.worker_id, self.lease_s, max_attempts=self.max_attempts)
        if claimed is None:
            return False
        lease, job = claimed
        log.info("worker %s: job %s claimed (attempt %s)", self.worker_id, job.id, lease.attempt)
        self._run(job, lease)
        self.jobs_run += 1
        return True

    def _run(self, job: JobSpec, lease: queue.Lease) -> None:
        ctx = JobContext(job, lease, database=self.database, lease_s=self.lease_s, settings=self.settings)
        beater = threading.Thread(target=ctx._beat_in_background, name=f"moeproxy-heartbeat-{job.id}", daemon=True)
        beater.start()
        try:
            ending, payload = self._execute(job, ctx)
        finally:
            ctx._stop_beating.set()
            beater.join()
        with self.database.scope() as session:
            ENDINGS[ending](session, ctx.lease, payload)
        if ending in ("succeeded", "failed", "cancelled"):
            with self.database.scope() as session:
                row = session.get(ReproductionJob, job.id)
                if row is not None and row.state in FINISHED_STATES and self.settings is not None:
                    notify.job_message(session, row, "job_finished", self.settings)

    def _execute(self, job: JobSpec, ctx: JobContext) -> tuple[str, Any]:
        """How the job ends: a key of :data:`ENDINGS` and what that ending records."""
        try:
            try:
                self._in_executor.set()
                if self._stop.is_set():
                    raise WorkerStopping("stopped before the job began")
                outcome = self._executor()(job, ctx)
            finally:
                self._in_executor.clear()
        except JobCancelled:
            return "cancelled", None
        except LeaseLost:
            log.warning("job %s: worker %s lost its lease; its outcome is not recorded", job.id, self.worker_id)
            return "lost", None
        except (WorkerStopping, KeyboardInterrupt):
            self._stop.set()
            return "released", None
        except Exception as exc:
            if self._interrupted.is_set():
                # The stop signal reached the job, and what it interrupted turned it into an error
                # of its own (a database driver whose query was cut off, an executor that wraps
                # every exception): the job did not fail, its worker stopped. It goes back to the
                # queue like any interrupted job.
                log.warning("job %s: interrupted by a stop signal (%s: %s); released", job.id,
                            type(exc).__name__, exc)
                self._stop.set()
                return "released", None
            log.exception("job %s failed", job.id)
            return "failed", _describe(exc)
        return "succeeded", outcome if outcome is not None else JobOutcome()

    def _executor(self) -> Executor:
        if self.executor is None:
            self.executor = load_default_executor()
        return self.executor


ENDINGS: dict[str, Callable[[Any, queue.Lease, Any], Any]] = {
    "succeeded": queue.complete,  # or cancelled, when a cancel was requested while it ran
    "failed": queue.fail,
    "cancelled": lambda session, lease, _payload: queue.mark_cancelled(session, lease),
    "released": lambda session, lease, _payload: queue.release(session, lease),
    "lost": lambda _session, _lease, _payload: None,
}


def _describe(exc: BaseException) -> str:
    """``Type: message`` first (what the job page shows), then the traceback."""
    head = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ExecutorUnavailable):
        return head
    missing = from_import_error(exc, "worker") if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None:  # torch or ray not installed where the worker runs: say which extra
        head = f"{type(missing).__name__}: {missing}"
    return head + "\n\n" + "".join(traceback.format_exception(exc)).rstrip()


def run_worker(
    database: Database,
    *,
    executor: Executor | None = None,
    worker_id: str | None = None,
    lease_s: float | None = None,
    poll_s: float | None = None,
    max_attempts: int | None = None,
    once: bool = False,
    stop: threading.Event | None = None,
    settings: Any = None,
    install_signal_handlers: bool = False,
) -> int:
    """Run a worker until ``stop`` is set (or after one job with ``once``); returns the jobs run.

    ``executor(job, ctx)`` does a job's work (default: ``moeproxy.service.jobs.executor.execute``,
    imported when the first job runs).  ``stop`` lets another thread end the loop: an idle worker
    returns within a poll; a job in progress runs to its end.
    """
    worker = Worker(
        database,
        executor=executor,
        worker_id=worker_id,
        lease_s=lease_s,
        poll_s=poll_s,
        max_attempts=max_attempts,
        settings=settings,
    )
    if install_signal_handlers:
        worker.install_signal_handlers()
    if stop is not None:
        worker._stop = stop
    return worker.run(once=once)
