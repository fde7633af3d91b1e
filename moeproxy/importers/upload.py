"""Post an imported run to the service, resuming where an earlier import of it stopped; and follow
a growing log into the service (``moeproxy tail``).

The run is found or created by name (``POST /api/v1/runs`` returns the existing run), the points it
already holds are read back (``GET /api/v1/runs/{id}/metrics``), and only the missing ones go
through :class:`moeproxy.client.MetricsClient`. Re-sending a point would be harmless (ingest is
idempotent on run, metric and step: the point is overwritten) but skipping it makes a repeated import
cost one read. :func:`tail_run` skips the same way what the file held when it started, so a
restarted tail sends only what the last one missed.
"""

from __future__ import annotations

import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import httpx
import orjson

from moeproxy.client import MetricsClient
from moeproxy.importers import ImportedRun, detect_framework
from moeproxy.importers.base import Record
from moeproxy.importers.follow import BadLine, LineParser, LogFollower
from moeproxy.integrations._common import numeric_metrics


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


def _checked_status(response: httpx.Response, what: str) -> None:
    if response.status_code >= 400:
        raise ImportFailed(f"{what}: HTTP {response.status_code} {response.text[:200]}")


def _checked(response: httpx.Response, what: str) -> dict:
    _checked_status(response, what)
    return response.json()


def stored_points(http: httpx.Client, run_id: int) -> set[tuple[str, int]]:
    """(metric, step) pairs the service holds for the run."""
    response = http.get(f"/api/v1/runs/{run_id}/metrics")
    _checked_status(response, f"reading run {run_id}")
    body = orjson.loads(response.content)  # a whole run: orjson parses it ~4x faster than json
    return {(name, step) for name, series in body["metrics"].items() for step in series["steps"]}


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
    if stored:
        missing = [(step, {k: v for k, v in values.items() if (k, step) not in stored}) for step, values in run.steps]
        missing = [(step, values) for step, values in missing if values]
    else:  # a new run (the usual case): nothing to filter point by point
        missing = [(step, values) for step, values in run.steps if values]
    sent = sum(len(values) for _, values in missing)
    if missing:
        _send(missing, url=url, token=token, name=name, framework=framework, timeout_s=timeout_s)
        _verify(run, run_id, stored, url=url, headers=headers, name=name)
    return ImportReport(run_id, name, framework, run.n_points, run.n_points - sent, sent)


def _send(steps: list[tuple[int, dict[str, float]]], *, url: str, token: str, name: str, framework: str | None, timeout_s: float) -> None:
    # A spill file of its own: what did not arrive is read again from the source on the next
    # import, so nothing is left behind for a later MetricsClient to replay.
    with tempfile.TemporaryDirectory(prefix="moeproxy-import-") as spool:
        spill = Path(spool) / "spill.jsonl"
        client = MetricsClient(url, token, name, framework=framework, batch_steps=5000,
                               spill_path=spill, close_timeout_s=timeout_s, register_atexit=False)
        for step, values in steps:
            client.log(step, values)
        client.close()


def _verify(run: ImportedRun, run_id: int, before: set[tuple[str, int]], *, url: str, headers: dict,
            name: str) -> None:
    """An import is done when the service holds every point of the source. Checked by counts first
    (one grouped query, ``GET .../metrics/names``): each metric must hold at least what it held
    before plus the source's points it lacked. Only where one holds fewer is the run read back, to
    say how many points are missing. (A count reached with a point missing would need another
    writer adding points to the same metric of the same run during the import.)"""
    expected = Counter(chain.from_iterable(values for _, values in run.steps))  # every source point
    if before:
        expected.update(metric for metric, step in before)
        # A point both held before and in the source is one point, not two.
        expected.subtract(metric for step, values in run.steps for metric in values if (metric, step) in before)
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as http:
            listed = _checked(http.get(f"/api/v1/runs/{run_id}/metrics/names"), f"reading run {run_id}")["names"]
            held = {n["name"]: n["points"] for n in listed}
            if all(held.get(metric, 0) >= count for metric, count in expected.items()):
                return
            stored = stored_points(http, run_id)
    except httpx.HTTPError as exc:
        raise ImportFailed(f"cannot reach {url}: {exc}") from None
    lost = sum(1 for step, values in run.steps for k in values if (k, step) not in stored)
    if lost:
        raise ImportFailed(f"run {name!r}: {lost} points did not reach {url}; run the same import again "
                           "to send them (points already stored are skipped)")


@dataclass(frozen=True)
class TailReport:
    run_id: int
    run_name: str
    framework: str | None
    points_sent: int
    points_already_stored: int
    steps_sent: int
    #: Batches the service did not take before the stop, left in the client's spill file.
    undelivered_path: Path | None


class _LiveRun:
    """The sending side of a tail: the MetricsClient, made when the first points arrive (their names
    tell the framework), and the points the service held when the tail started."""

    def __init__(self, *, url: str, token: str, name: str, framework: str | None, stored: set[tuple[str, int]]):
        self.url, self.token, self.name, self.framework = url, token, name, framework
        self.stored = stored
        self.client: MetricsClient | None = None
        self.sent = self.skipped = self.steps = 0

    def send(self, records: list[Record]) -> tuple[int, int, int] | None:
        """Queue the records' points not stored yet; (first step, last step, points) queued, or None."""
        if records and self.framework is None:
            self.framework = detect_framework(k for _, values in records for k in values)
        batch = []
        for step, values in records:
            numbers = {k: float(v) for k, v in numeric_metrics(values).items()}
            fresh = {k: v for k, v in numbers.items() if (k, step) not in self.stored}
            self.skipped += len(numbers) - len(fresh)
            if fresh:
                batch.append((step, fresh))
        if not batch:
            return None
        if self.client is None:
            self.client = MetricsClient(self.url, self.token, self.name, framework=self.framework,
                                        register_atexit=False)
        for step, values in batch:
            self.client.log(step, values)
        points = sum(len(values) for _, values in batch)
        self.sent += points
        self.steps += len(batch)
        return batch[0][0], batch[-1][0], points

    def close(self) -> Path | None:
        """Flush and stop; the spill file's path if batches are left in it."""
        if self.client is None:
            return None
        self.client.close()
        spill = self.client.spill_path
        return spill if spill.exists() and spill.stat().st_size > 0 else None


def tail_run(path: Path, parse_line: LineParser, *, url: str, token: str, run_name: str, stop: threading.Event,
             framework: str | None = None, project: str | None = None, from_start: bool = False,
             poll_s: float = 1.0, on_sent: Callable[[int, int, int], None] = lambda *_: None,
             on_notice: Callable[[str], None] = lambda _: None) -> TailReport:
    """Follow ``path`` into run ``run_name`` until ``stop`` is set, then send what is left and flush.

    The points the run holds when the tail starts are skipped in what the file holds then (unless
    ``from_start``: every line is sent again, overwriting); lines written later are all sent. A line
    that does not parse stops the tail with :class:`BadLine` once the lines before it are flushed.
    """
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as http:
            run_id = _open_run(http, run_name, framework, project)
            stored = set() if from_start else stored_points(http, run_id)
    except httpx.HTTPError as exc:
        raise ImportFailed(f"cannot reach {url}: {exc}") from None
    live = _LiveRun(url=url, token=token, name=run_name, framework=framework, stored=stored)
    follower = LogFollower(path, parse_line, on_notice)
    undelivered = None
    try:
        while True:
            stopping = stop.is_set()
            try:
                records = follower.finish() if stopping else follower.read_new()
            except BadLine as exc:
                live.send(exc.records)
                raise
            if (sent := live.send(records)) is not None:
                on_sent(*sent)
            if follower.is_open:
                # What the file held at the start is compared with the service once; later lines are
                # new (a rewritten step after a truncation overwrites what the service holds).
                live.stored = set()
            if stopping:
                break
            stop.wait(poll_s)
    finally:
        follower.close()
        undelivered = live.close()
    return TailReport(run_id, run_name, live.framework, live.sent, live.skipped, live.steps, undelivered)
