"""``moeproxy db``: database migrations (Alembic, configured in code)."""

from __future__ import annotations

import json

import typer

db_app = typer.Typer(help="Manage the service database (MOEPROXY_DATABASE_URL).", no_args_is_help=True)

UrlOption = typer.Option(None, "--url", help="database URL (default: MOEPROXY_DATABASE_URL or the SQLite file)")


def resolve_url(url: str | None) -> str:
    from moeproxy.config import get_settings

    return url or get_settings().database_url


def upgrade_database(url: str) -> None:
    """Bring ``url`` to the newest schema; user-facing failures exit 2 with a message, not a traceback."""
    from sqlalchemy.exc import OperationalError

    from moeproxy.migrations import upgrade

    try:
        upgrade(url)
    except OperationalError as exc:
        typer.echo(f"error: cannot reach the database {_safe(url)}: {exc.orig}", err=True)
        raise typer.Exit(code=2) from None


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@db_app.command("upgrade")
def upgrade_cmd(
    url: str | None = UrlOption,
    revision: str = typer.Option("head", help="target revision"),
) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    from alembic import command

    from moeproxy.migrations import alembic_config

    url = resolve_url(url)
    if revision == "head":
        upgrade_database(url)
    else:
        command.upgrade(alembic_config(url), revision)
    typer.echo(f"database {_safe(url)} is at revision {revision}")


@db_app.command("current")
def current_cmd(url: str | None = UrlOption, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show the database's revision and the newest one shipped."""
    from moeproxy.migrations import current_revision, head_revision

    url = resolve_url(url)
    current, head = current_revision(url), head_revision()
    if as_json:
        typer.echo(json.dumps({"url": _safe(url), "current": current, "head": head}))
    else:
        typer.echo(f"{_safe(url)}: current {current or '(empty)'}, head {head}")


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
