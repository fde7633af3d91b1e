"""``moeproxy demo``: post the recorded demo runs to a running service over REST."""

from __future__ import annotations

import typer


def demo(
    url: str = typer.Option("http://127.0.0.1:8000", "--url", help="the service's base URL"),
    token: str | None = typer.Option(
        None, "--token", help="a token of the project to post into (default: $MOEPROXY_TOKEN)"
    ),
) -> None:
    """Post two recorded GRPO runs of the reproduction engine on the qwen3-moe-64e reference model
    (verl metric names): a healthy one, and its twin whose rollout engine computes log-probs in bf16 from
    part-way through the run."""
    import httpx

    from moeproxy.demo import post_demo

    from moeproxy.client import service_endpoint

    _, token = service_endpoint(None, token)
    if not token:
        typer.echo("error: give --token (from `moeproxy token create --project demo`) or set MOEPROXY_TOKEN", err=True)
        raise typer.Exit(code=2)
    try:
        runs = post_demo(url, token, progress=typer.echo)
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
