"""``moeproxy token``: bearer tokens for projects (SPEC section 5)."""

from __future__ import annotations

import json

import typer

from moeproxy.cli.db import UrlOption, resolve_url, upgrade_database

token_app = typer.Typer(help="Create, list and revoke API tokens (stored hashed).", no_args_is_help=True)


def _database(url: str | None):
    from moeproxy.service.db import Database

    url = resolve_url(url)
    upgrade_database(url)  # a fresh install can create its first token before `serve`
    return Database(url)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@token_app.command("create")
def create(
    project: str = typer.Option(..., "--project", "-p", help="project name (created if new)"),
    label: str | None = typer.Option(None, help="a note to tell tokens apart"),
    url: str | None = UrlOption,
) -> None:
    """Create a token; it is printed alone on the last line (take it with `tail -1`)."""
    from moeproxy.service.errors import ServiceError
    from moeproxy.service.tokens import repository

    database = _database(url)
    try:
        with database.scope() as session:
            token, secret = repository.create_token(session, project, label=label)
            token_id = token.id
    except ServiceError as exc:
        raise _fail(exc.detail) from None
    finally:
        database.dispose()
    typer.echo(f"token {token_id} for project {project!r} (shown once; only its hash is stored):")
    typer.echo(secret)


@token_app.command("list")
def list_(
    project: str | None = typer.Option(None, "--project", "-p", help="only this project"),
    all_: bool = typer.Option(False, "--all", help="include revoked tokens"),
    as_json: bool = typer.Option(False, "--json"),
    url: str | None = UrlOption,
) -> None:
    """List tokens (id, project, prefix, label, created, revoked); secrets cannot be shown."""
    from moeproxy.service.tokens import repository

    database = _database(url)
    try:
        with database.scope() as session:
            rows = [
                {
                    "id": t.id,
                    "project": t.project.name,
                    "prefix": t.prefix,
                    "label": t.label,
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in repository.list_tokens(session, project, include_revoked=all_)
            ]
    finally:
        database.dispose()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo("no tokens")
        return
    for r in rows:
        state = f"revoked {r['revoked_at']}" if r["revoked_at"] else "active"
        typer.echo(f"{r['id']:>5}  {r['project']:<24} {r['prefix']}…  {state:<10} {r['label'] or ''}")


@token_app.command("revoke")
def revoke(
    ref: str = typer.Argument(..., help="token id (from `token list`), its shown prefix, or the token itself"),
    url: str | None = UrlOption,
) -> None:
    """Revoke a token; requests carrying it get 401 from then on."""
    from moeproxy.service.errors import ServiceError
    from moeproxy.service.tokens import repository

    database = _database(url)
    try:
        with database.scope() as session:
            token = repository.revoke_token(session, ref)
            token_id, project = token.id, token.project.name
    except ServiceError as exc:
        raise _fail(exc.detail) from None
    finally:
        database.dispose()
    typer.echo(f"revoked token {token_id} of project {project!r}")


@token_app.command("login-link")
def login_link(
    project: str | None = typer.Option(
        None, "--project", "-p", help="the project whose pages it opens (default: every project, an operator's login)"
    ),
    hours: float = typer.Option(24.0, min=0.01, max=24.0 * 30, help="how long the link stays valid"),
    base_url: str | None = typer.Option(
        None, "--base-url", envvar="MOEPROXY_PUBLIC_URL", help="the pages' address (default: MOEPROXY_PUBLIC_URL)"
    ),
    url: str | None = UrlOption,
) -> None:
    """A one-time login link to the pages, printed alone on the last line.

    The code is in the URL's fragment (after ``#``), which browsers do not send: it never reaches
    an access log. It works once, within ``--hours``.
    """
    from datetime import timedelta

    from moeproxy.config import get_settings
    from moeproxy.service.errors import ServiceError
    from moeproxy.service.ui.auth import create_login_link

    database = _database(url)
    try:
        with database.scope() as session:
            code = create_login_link(session, project, label="token login-link", max_age=timedelta(hours=hours))
    except ServiceError as exc:
        raise _fail(exc.detail) from None
    finally:
        database.dispose()
    scope = f"project {project!r}" if project else "every project"
    typer.echo(f"one-time login to {scope}, valid {hours:g} h:")
    typer.echo(f"{(base_url or get_settings().public_url).rstrip('/')}/login#code={code}")


def register(app: typer.Typer) -> None:
    app.add_typer(token_app, name="token")
