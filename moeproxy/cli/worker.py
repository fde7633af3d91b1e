"""``moeproxy worker``: claim reproduction jobs from the service database and run them."""

from __future__ import annotations

import logging
import os

import typer


def worker(
    once: bool = typer.Option(False, "--once", help="run at most one queued job, then exit"),
    worker_id: str | None = typer.Option(
        None, "--worker-id", envvar="MOEPROXY_WORKER_ID", help="this worker's name in job records (default: host:pid)"
    ),
    lease_s: float | None = typer.Option(
        None, "--lease-s", min=1.0, help="lease on a job; it is renewed every third of it (default: MOEPROXY_JOB_LEASE_S)"
    ),
    poll_s: float | None = typer.Option(
        None, "--poll-s", min=0.05, help="wait between looks at an empty queue (default: MOEPROXY_WORKER_POLL_S)"
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", envvar="MOEPROXY_RAY_ADDRESS",
        help="the Ray cluster the reproductions run on (default: the one Ray finds, or a local one)",
    ),
    database_url: str | None = typer.Option(
        None, "--database-url", help="overrides MOEPROXY_DATABASE_URL (the service's database)"
    ),
) -> None:
    """Run reproduction jobs: claim one, build its proxy and reproduce it, record the outcome, repeat.

    Several workers may share one PostgreSQL database (each claims a different job); on SQLite run one.
    A worker that dies leaves its job to be retried once its lease expires. SIGTERM or Ctrl-C stops
    the worker, putting a job in progress back in the queue.
    """
    from moeproxy.cli.db import resolve_url
    from moeproxy.config import get_settings
    from moeproxy.migrations import current_revision, head_revision
    from moeproxy.service.db import Database
    from moeproxy.service.jobs.worker import Worker, default_worker_id

    if database_url:
        os.environ["MOEPROXY_DATABASE_URL"] = database_url
    if ray_address:
        os.environ["MOEPROXY_RAY_ADDRESS"] = ray_address
    get_settings.cache_clear()
    settings = get_settings()
    url = resolve_url(database_url)
    # The worker does not migrate (the service's `serve` / `db upgrade` does, once, under a lock).
    current, head = current_revision(url), head_revision()
    if current != head:
        typer.echo(
            f"error: the database is at revision {current or '(empty)'}, this worker needs {head}: "
            "run `moeproxy db upgrade` first",
            err=True,
        )
        raise typer.Exit(code=2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    database = Database(url)
    name = worker_id or default_worker_id()
    try:
        runner = Worker(database, worker_id=name, lease_s=lease_s, poll_s=poll_s, settings=settings)
        runner.install_signal_handlers()
        typer.echo(f"worker {name} polling {url.split('@')[-1]} for jobs (lease {runner.lease_s:g} s)")
        ran = runner.run(once=once)
    finally:
        database.dispose()
    typer.echo(f"worker {name} stopped after {ran} job{'s' if ran != 1 else ''}")


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
