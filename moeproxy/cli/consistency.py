"""``moeproxy consistency A B``: is run B's anomaly signature consistent with run A's?

Each of A and B is a run file (as for ``moeproxy triage``) or, with ``--url``/``--token``, a run
id of the service. Per shared canonical metric: direction of the change against each run's own
baseline, onset steps and their offset, DTW distance of the effect traces; then an overall verdict
(consistent / partially consistent / inconsistent).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from moeproxy.cli.triage import read_run


def _read(spec: str, url, token, framework):
    p = Path(spec)
    if p.exists() or url is None:
        return read_run(p, None, None, None, framework)
    return read_run(None, spec, url, token, framework)


def consistency_command(
    a: str = typer.Argument(..., help="Run A: a file, or a run id with --url/--token."),
    b: str = typer.Argument(..., help="Run B: a file, or a run id with --url/--token."),
    url: str | None = typer.Option(None, "--url", help="Service URL, to read runs by id."),
    token: str | None = typer.Option(None, "--token", help="Bearer token (default MOEPROXY_TOKEN)."),
    framework_a: str | None = typer.Option(None, "--framework-a", help="Framework of run A's metric names."),
    framework_b: str | None = typer.Option(None, "--framework-b", help="Framework of run B's metric names."),
    tolerance: int = typer.Option(2, "--tolerance", help="Onset lags agree within this many steps."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare two runs' anomaly signatures (direction, onset, shape) metric by metric."""
    from moeproxy.signatures.consistency import consistency

    ra = _read(a, url, token, framework_a)
    rb = _read(b, url, token, framework_b)
    report = consistency(ra, rb, framework_a=framework_a, framework_b=framework_b, onset_tolerance=tolerance)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1))
        return
    typer.echo(f"{report.verdict}: {report.summary}")
    for m in report.metrics:
        if not m.changed:
            continue
        mark = "ok " if m.agrees else "DIFF"
        on = f"onset {m.onset_step_a} / {m.onset_step_b}"
        d = "" if m.dtw_distance is None else f" dtw {m.dtw_distance:.2f}"
        typer.echo(f"  {mark} {m.metric:<30} dir {m.direction_a:+d} / {m.direction_b:+d}  {on}{d}")


def register(app: typer.Typer) -> None:
    app.command("consistency", help="Check whether two runs show a consistent anomaly signature.")(
        consistency_command)
