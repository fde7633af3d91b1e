"""``moeproxy serve``: upgrade the database, then run the service under uvicorn."""

from __future__ import annotations

import os
import threading
import time

import typer


def _wait_ready(base_url: str, timeout_s: float) -> bool:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}/readyz", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _post_demo_when_ready(base_url: str, database_url: str, public_ui: bool) -> None:
    """Runs beside the server: wait for /readyz, create a `demo` token, post the demo runs over
    REST, then print a one-time login link to the demo project's pages."""
    from moeproxy.demo import DEMO_PROJECT, post_demo
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository
    from moeproxy.service.ui.auth import create_login_link

    if not _wait_ready(base_url, 60.0):
        typer.echo(f"demo: the service did not become ready at {base_url}; no demo posted", err=True)
        return
    database = Database(database_url)
    try:
        with database.scope() as session:
            _, secret = repository.create_token(session, DEMO_PROJECT, label="serve --demo")
    finally:
        database.dispose()
    try:
        runs = post_demo(base_url, secret, progress=lambda m: typer.echo(f"demo: {m}"))
    except Exception as exc:  # the server keeps running; say what went wrong
        typer.echo(f"demo: posting failed: {exc}", err=True)
        return
    for run in runs:
        typer.echo(f"demo: {run['name']}: {base_url}/runs/{run['id']}")
    typer.echo(f"demo: token for project '{DEMO_PROJECT}': {secret}")
    if public_ui:
        typer.echo(f"Open {base_url}/  (demo: two recorded engine runs; Ctrl-C stops the service)")
        return
    database = Database(database_url)
    try:
        with database.scope() as session:
            code = create_login_link(session, DEMO_PROJECT, label="serve --demo")
    finally:
        database.dispose()
    # The code rides in the fragment, which the browser keeps to itself: no access log sees it.
    typer.echo(
        f"Open {base_url}/login#code={code}  (a one-time login to the demo project's two recorded "
        "engine runs; log in later with the token above; Ctrl-C stops the service)"
    )


def serve(
    host: str = typer.Option("127.0.0.1", envvar="MOEPROXY_HOST", help="interface to bind (0.0.0.0 in a container)"),
    port: int = typer.Option(8000, envvar="MOEPROXY_PORT", help="TCP port"),
    workers: int = typer.Option(
        1, min=1, envvar="MOEPROXY_WORKERS", help="uvicorn worker processes (PostgreSQL: about one per core)"
    ),
    database_url: str | None = typer.Option(
        None, "--database-url", help="overrides MOEPROXY_DATABASE_URL (default: a SQLite file in the user data dir)"
    ),
    demo: bool = typer.Option(False, "--demo", help="once ready, post two recorded demo runs (healthy, bf16 rollout) through the REST API"),
    public_ui: bool = typer.Option(
        False, "--public-ui", envvar="MOEPROXY_PUBLIC_UI",
        help="pages without a login, every project visible to anyone who reaches the port (a laptop only)",
    ),
    upgrade: bool = typer.Option(True, "--upgrade/--no-upgrade", help="apply database migrations before starting"),
    log_level: str = typer.Option("info", envvar="MOEPROXY_LOG_LEVEL", help="uvicorn log level"),
) -> None:
    """Run the REST API, OpenAPI docs (/docs) and triage pages."""
    import uvicorn

    from moeproxy.cli.db import resolve_url, upgrade_database
    from moeproxy.config import get_settings

    if database_url:
        os.environ["MOEPROXY_DATABASE_URL"] = database_url  # worker processes read it too
    if public_ui:
        os.environ["MOEPROXY_PUBLIC_UI"] = "1"
    # glibc gives threads that allocate their own malloc arenas (up to 8 per core), and freed memory
    # stays spread over them: capped at 2, a 10-minute soak of two workers grew +8.2 % and +11.2 %
    # after warm-up against +13.0 % uncapped (docs/reliability.md). glibc reads the variable when a
    # process starts, so it reaches the worker processes started below; one in-process worker needs
    # it in the environment already (the Docker image sets it). A value the user set wins.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    get_settings.cache_clear()
    url = resolve_url(database_url)
    if upgrade:
        upgrade_database(url)
    # The address to print and to post the demo to: a wildcard bind is reached on loopback.
    base_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"  # nosec B104
    if demo:
        threading.Thread(target=_post_demo_when_ready, args=(base_url, url, public_ui), daemon=True).start()
    typer.echo(f"moeproxy serving on {base_url} (database: {url.split('@')[-1]})")
    if public_ui:
        typer.echo("warning: --public-ui: the pages need no login and show every project", err=True)
    uvicorn.run(
        "moeproxy.service.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
