"""Small real executors for the queue tests, and a worker process around them.

``python tests/service/job_executors.py DATABASE_URL WORKER_ID LEASE_S MARKER_FILE [wrap]`` runs a worker
whose executor appends ``job-id attempt`` to MARKER_FILE and then heartbeats forever (until the
process is killed or told to stop): the worker that dies mid-job, or stops on SIGTERM.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from moeproxy.service.jobs.spec import JobOutcome


def heartbeat_forever(marker: Path, *, wrap: bool = False):
    """``wrap``: every exception, the stop signal's included, comes out as a RuntimeError of the
    executor's own, as from a database driver whose query the signal cut off."""

    def beat(job, ctx):
        with marker.open("a") as f:
            f.write(f"{job.id} {job.attempt}\n")
        while True:
            ctx.heartbeat({"alive": True})
            time.sleep(0.05)

    def wrapped(job, ctx):
        try:
            beat(job, ctx)
        except BaseException as exc:
            raise RuntimeError(f"consuming input failed: {type(exc).__name__}") from exc

    return wrapped if wrap else beat


class Recorder:
    """Records every run of a job (thread-safe); succeeds after ``work_s`` of heartbeating."""

    def __init__(self, work_s: float = 0.0):
        self.work_s = work_s
        self.runs: list[tuple[int, int, str]] = []  # (job id, attempt, worker id)
        self._lock = threading.Lock()

    def __call__(self, job, ctx):
        with self._lock:
            self.runs.append((job.id, job.attempt, ctx.worker_id))
        deadline = time.monotonic() + self.work_s
        while time.monotonic() < deadline:
            ctx.heartbeat({"done": 0, "total": 1})
            time.sleep(0.01)
        return JobOutcome(result={"worker": ctx.worker_id, "attempt": job.attempt}, device_hours=0.01)


def main(argv: list[str]) -> None:
    from moeproxy.service.db import Database
    from moeproxy.service.jobs.worker import run_worker

    from moeproxy.config import Settings

    url, worker_id, lease_s, marker, *mode = argv
    database = Database(url)
    try:
        run_worker(
            database,
            executor=heartbeat_forever(Path(marker), wrap=mode == ["wrap"]),
            worker_id=worker_id,
            lease_s=float(lease_s),
            poll_s=0.05,
            settings=Settings(database_url=url),
            install_signal_handlers=True,
        )
    finally:
        database.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
