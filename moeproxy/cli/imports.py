"""``moeproxy import``: post a past run from a logger's files to the service.

The readers are :mod:`moeproxy.importers` (the format registry); the upload, which resumes an
interrupted import, is :func:`moeproxy.importers.upload.import_run`. The service comes from
``--url``/``--token`` or ``MOEPROXY_URL``/``MOEPROXY_TOKEN``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from moeproxy.cli.fingerprints import _fail
from moeproxy.importers import FORMATS

# The registry imports nothing heavy: pyarrow, tensorboard and mlflow load when a source of theirs is read
# (wandb runs as its own process).
FORMAT_HELP = f"{', '.join(FORMATS)} (default: detected from the file)"


def read_imported(source: str | Path, format: str | None):
    """The source through the importers registry; a bad file becomes a clean exit naming it."""
    from moeproxy.importers import InvalidSource, read_source

    try:
        return read_source(source, format)
    except InvalidSource as exc:
        raise _fail(str(exc)) from None


def import_command(
    source: str = typer.Argument(..., help="A file or folder (trainer_state.json, verl log, CSV, Parquet, TensorBoard, "
                                 "mlruns, a W&B run directory or CSV export), or an MLflow run: "
                                 "mlflow:<tracking-uri>#<run-id>."),
    format: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    run_name: str | None = typer.Option(None, "--run-name", help="Run name in the service (default: from the source)."),
    framework: str | None = typer.Option(None, "--framework", help="verl, trl, openrlhf, ... (default: detected)."),
    project: str | None = typer.Option(None, "--project", help="Refuse unless the token belongs to this project."),
    url: str | None = typer.Option(None, "--url", help="Service URL (default MOEPROXY_URL)."),
    token: str | None = typer.Option(None, "--token", help="Bearer token (default MOEPROXY_TOKEN)."),
) -> None:
    """Import a past run into the service; a repeated or interrupted import sends only what is missing."""
    from moeproxy.client import service_endpoint
    from moeproxy.importers.upload import ImportFailed, import_run

    url, token = service_endpoint(url, token)
    if not url or not token:
        raise _fail("import needs the service: --url and --token (or MOEPROXY_URL and MOEPROXY_TOKEN)")
    run = read_imported(source, format)
    if not run.steps:
        raise _fail(f"{source}: no numeric metrics with a step")
    try:
        report = import_run(run, url=url, token=token, run_name=run_name, framework=framework, project=project)
    except ImportFailed as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"read {report.points_read} points of {len(run.steps)} steps from {source} ({run.format})")
    typer.echo(f"run {report.run_id} {report.run_name!r} (framework {report.framework or 'unknown'}): "
               f"{report.points_sent} points sent, {report.points_already_stored} already stored")


def register(app: typer.Typer) -> None:
    app.command("import", help="Import a past run (trainer_state.json, verl logs, CSV, Parquet, TensorBoard, "
                               "MLflow, W&B).")(
        import_command)
