"""``moeproxy tail``: follow a growing log file into the service, for jobs that cannot reach it
from inside the cluster but write a file logger to shared storage.

The file is read through the importers registry's line-based formats (``Format.parse_line``:
verl's file logger and console log); the following is :class:`moeproxy.importers.follow.LogFollower`
and the sending :func:`moeproxy.importers.upload.tail_run`. Ctrl-C or SIGTERM stops it after the
lines written so far are sent.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import typer

from moeproxy.cli.fingerprints import _fail
from moeproxy.importers import FORMATS

LINE_FORMATS = tuple(name for name, f in FORMATS.items() if f.parse_line is not None)


def _line_format(path: Path, format: str | None) -> str:
    from moeproxy.importers import InvalidSource, detect_format

    if format is None:
        if not path.exists() or path.stat().st_size == 0:
            raise _fail(f"{path} is {'empty' if path.exists() else 'not there yet'}: "
                        f"give --format ({', '.join(LINE_FORMATS)}) to wait for it")
        try:
            format = detect_format(path)
        except InvalidSource as exc:
            raise _fail(str(exc)) from None
        if format is None:
            raise _fail(f"{path}: not a format moeproxy can follow (give --format, one of {', '.join(LINE_FORMATS)})")
    if format not in LINE_FORMATS:
        raise _fail(f"{path}: tail follows a format of one record a line ({', '.join(LINE_FORMATS)}), "
                    f"not {format!r}; use moeproxy import for a finished file")
    return format


def tail_command(
    file: Path = typer.Argument(..., help="The log file to follow (verl's file logger or console log)."),  # noqa: B008
    run_name: str | None = typer.Option(None, "--run-name", help="Run name in the service (default: the file's stem)."),
    format: str | None = typer.Option(None, "--format", help=f"{', '.join(LINE_FORMATS)} (default: detected)."),
    framework: str | None = typer.Option(None, "--framework", help="verl, trl, openrlhf, ... (default: detected)."),
    project: str | None = typer.Option(None, "--project", help="Refuse unless the token belongs to this project."),
    from_start: bool = typer.Option(False, "--from-start",
                                    help="Send every line again, also points the run already holds (they are "
                                         "overwritten); by default those are skipped."),
    poll_s: float = typer.Option(1.0, "--poll-s", min=0.05, help="Seconds between reads of the file."),
    url: str | None = typer.Option(None, "--url", help="Service URL (default MOEPROXY_URL)."),
    token: str | None = typer.Option(None, "--token", help="Bearer token (default MOEPROXY_TOKEN)."),
) -> None:
    """Follow a log file as it grows and post each new step; Ctrl-C or SIGTERM stops after a flush."""
    from moeproxy.client import service_endpoint
    from moeproxy.importers.follow import BadLine
    from moeproxy.importers.upload import ImportFailed, tail_run

    url, token = service_endpoint(url, token)
    if not url or not token:
        raise _fail("tail needs the service: --url and --token (or MOEPROXY_URL and MOEPROXY_TOKEN)")
    format = _line_format(file, format)
    name = run_name or file.stem
    stop = threading.Event()

    def _stop(signum, _frame) -> None:
        if not stop.is_set():
            typer.echo(f"{signal.Signals(signum).name}: sending what is left, then stopping", err=True)
        stop.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    typer.echo(f"following {file} ({format}) into run {name!r} at {url}; Ctrl-C stops")
    try:
        report = tail_run(
            file, FORMATS[format].parse_line, url=url, token=token, run_name=name, stop=stop,
            framework=framework, project=project, from_start=from_start, poll_s=poll_s,
            on_sent=lambda first, last, points: typer.echo(
                f"steps {first}-{last}: {points} points" if first != last else f"step {first}: {points} points"),
            on_notice=lambda text: typer.echo(text, err=True))
    except (BadLine, ImportFailed) as exc:
        raise _fail(f"{exc}{'; the lines before it were sent' if isinstance(exc, BadLine) else ''}") from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    typer.echo(f"stopped: run {report.run_id} {report.run_name!r} (framework {report.framework or 'unknown'}): "
               f"{report.points_sent} points of {report.steps_sent} steps sent, "
               f"{report.points_already_stored} already stored")
    if report.undelivered_path is not None:
        raise _fail(f"the service did not take every batch before the stop; they wait in "
                    f"{report.undelivered_path}: run the same tail again to send them")


def register(app: typer.Typer) -> None:
    app.command("tail", help="Follow a growing log file (verl's file logger) into the service.")(tail_command)
