"""Post an imported run to the service, resuming where an earlier import of it stopped.

The run is found or created by name (``POST /api/v1/runs`` returns the existing run), the points it
already holds are read back (``GET /api/v1/runs/{id}/metrics``), and only the missing ones go
through :class:`moeproxy.client.MetricsClient`. Re-sending a point would be harmless (ingest is
idempotent on run, metric and step) but skipping it makes a repeated import cost one read.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from moeproxy.client import MetricsClient
from moeproxy.importers import ImportedRun


class ImportFailed(RuntimeError):
    """The service refused the import or could not be reached; the message says what to do."""


@dataclass(frozen=True)
class ImportReport:
    run_id: int
    run_name: str
    framework: str | None
    points_read: int
    points_already_stored: int
    points_sent: int


def _checked(response: httpx.Response, what: str) -> dict:
    if response.status_code >= 400:
        raise ImportFailed(f"{what}: HTTP {response.status_code} {response.text[:200]}")
    return response.json()


def stored_points(http: httpx.Client, run_id: int) -> set[tuple[str, int]]:
    """(metric, step) pairs the service holds for the run."""
    body = _checked(http.get(f"/api/v1/runs/{run_id}/metrics"), f"reading run {run_id}")
    return {(name, int(step)) for name, series in body["metrics"].items() for step in series["steps"]}


def _open_run(http: httpx.Client, run_name: str, framework: str | None, project: str | None) -> int:
    if project is not None:
        who = _checked(http.get("/api/v1/whoami"), "checking the token")
        if who["project"] != project:
            raise ImportFailed(f"the token belongs to project {who['project']!r}, not {project!r}")
    spec = {"name": run_name, **({"framework": framework} if framework else {})}
    return int(_checked(http.post("/api/v1/runs", json=spec), f"creating run {run_name!r}")["id"])


def import_run(run: ImportedRun, *, url: str, token: str, run_name: str | None = None,
               framework: str | None = None, project: str | None = None,
               timeout_s: float = 300.0) -> ImportReport:
    """Store ``run`` as ``run_name`` (default: the source's name); returns what was sent."""
    name = run_name or run.name
    framework = framework or run.framework
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as http:
            run_id = _open_run(http, name, framework, project)
            stored = stored_points(http, run_id)
    except httpx.HTTPError as exc:
        raise ImportFailed(f"cannot reach {url}: {exc}") from None
    missing = [(step, {k: v for k, v in values.items() if (k, step) not in stored}) for step, values in run.steps]
    missing = [(step, values) for step, values in missing if values]
    sent = sum(len(values) for _, values in missing)
    if missing:
        _send(missing, url=url, token=token, name=name, framework=framework, timeout_s=timeout_s)
        _verify(run, run_id, url=url, headers=headers, name=name)
    return ImportReport(run_id, name, framework, run.n_points, run.n_points - sent, sent)


def _send(steps: list[tuple[int, dict[str, float]]], *, url: str, token: str, name: str, framework: str | None, timeout_s: float) -> None:
    # A spill file of its own: what did not arrive is read again from the source on the next
    # import, so nothing is left behind for a later MetricsClient to replay.
    with tempfile.TemporaryDirectory(prefix="moeproxy-import-") as spool:
        spill = Path(spool) / "spill.jsonl"
        client = MetricsClient(url, token, name, framework=framework, batch_steps=1000,
                               spill_path=spill, close_timeout_s=timeout_s, register_atexit=False)
        for step, values in steps:
            client.log(step, values)
        client.close()


def _verify(run: ImportedRun, run_id: int, *, url: str, headers: dict, name: str) -> None:
    """Read the run back: an import is done when the service holds every point of the source."""
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as http:
            stored = stored_points(http, run_id)
    except httpx.HTTPError as exc:
        raise ImportFailed(f"cannot reach {url}: {exc}") from None
    lost = sum(1 for step, values in run.steps for k in values if (k, step) not in stored)
    if lost:
        raise ImportFailed(f"run {name!r}: {lost} points did not reach {url}; run the same import again "
                           "to send them (points already stored are skipped)")
