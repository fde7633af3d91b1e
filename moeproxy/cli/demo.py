"""``moeproxy demo``: post the synthetic demo runs to a running service over REST."""

from __future__ import annotations

import os

import typer


def demo(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="the service's base URL"),
    token: str | None = typer.Option(
        None, "--token", help="a token of the project to post into (default: $MOEPROXY_TOKEN)"
    ),
    steps: int = typer.Option(200, min=10, max=10_000, help="steps per run"),
    seed: int = typer.Option(0, help="seed of the synthetic model"),
) -> None:
    """Post two SYNTHETIC verl-style runs (healthy, and rollout_logp_precision from step 60)."""
    import httpx

    from moeproxy.demo import post_demo

    token = token or os.environ.get("MOEPROXY_TOKEN")
    if not token:
        typer.echo("error: give --token (from `moeproxy token create --project demo`) or set MOEPROXY_TOKEN", err=True)
        raise typer.Exit(code=2)
    try:
        runs = post_demo(url, token, n_steps=steps, seed=seed, progress=typer.echo)
    except httpx.HTTPStatusError as exc:
        typer.echo(f"error: the service answered {exc.response.status_code}: {exc.response.text[:300]}", err=True)
        raise typer.Exit(code=2) from None
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach {url}: {exc}", err=True)
        raise typer.Exit(code=2) from None
    base = url.rstrip("/")
    for run in runs:
        typer.echo(f"{run['name']}: {base}/runs/{run['id']}")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
