"""Client for training loops: send metrics to the moeproxy service without slowing the step.

::

    from moeproxy.client import MetricsClient

    with MetricsClient("http://moeproxy:8000", token, run_name="grpo-qwen3-30b-a3b-0412",
                       framework="verl", model="Qwen3-30B-A3B", config=cfg) as metrics:
        for step in range(n_steps):
            ...
            metrics.log(step, trainer_metrics)   # a verl/TRL-style dict, as is

Guarantees:

* :meth:`MetricsClient.log` never blocks on the network: it converts the values
  and puts them on a queue.  A background thread batches them (by
  ``batch_steps`` or every ``flush_interval_s``) and posts them.
* Connection errors, timeouts, 429 and 5xx are retried with exponential backoff
  and jitter, waiting at least what a ``Retry-After`` header asks (up to 300 s).  When the server stays unreachable the batches are appended to a
  local JSONL spill file (``spill_path``) and replayed, in order, once the server
  answers again.  Re-sending is safe: ingestion is idempotent on
  (run, metric, step).
* :meth:`close` (also run at interpreter exit and by ``with``) flushes what is
  queued and spilled, waiting up to ``close_timeout_s``; whatever could not be
  delivered stays in the spill file, whose path is logged.  Passing the same
  ``spill_path`` to a later client (e.g. the restarted job) replays it.
* Values: ints, floats, numpy and torch scalars (anything ``float()`` accepts,
  bools as 0/1) are sent; NaN and ±inf are sent as data (as the strings
  ``"NaN"``/``"Infinity"``/``"-Infinity"``, which strict JSON parsers accept).
  Other values (strings, lists, None, multi-element tensors) are skipped, with
  one warning per metric name.

This module talks to the service over HTTP only and imports nothing from the
service.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import random
import re
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson

log = logging.getLogger("moeproxy.client")

# The client's copy of moeproxy.signatures.values.NONFINITE_SPELLINGS (lower-cased spelling -> the
# string the server stores it as); tests/service/test_service_client.py holds the two equal.
NONFINITE_SPELLINGS: dict[str, str] = {
    "nan": "NaN",
    "infinity": "Infinity",
    "+infinity": "Infinity",
    "inf": "Infinity",
    "+inf": "Infinity",
    "-infinity": "-Infinity",
    "-inf": "-Infinity",
}
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
#: The longest ``Retry-After`` the client waits as told; a longer one is cut to this (the batch is
#: kept either way: it waits in memory, or spills to disk once the retries are spent).
RETRY_AFTER_MAX_S = 300.0
#: Steps kept in memory when the spill file cannot be written (about 100 MB at 100 metrics a step).
MAX_HELD_STEPS = 100_000


def retry_after_s(response: httpx.Response) -> float | None:
    """The wait a 429/503 asks for (``Retry-After`` in seconds or as an HTTP date), or None."""
    if response.status_code not in (429, 503):
        return None
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when.timestamp() - time.time()), RETRY_AFTER_MAX_S)

#: Where client-side commands and integrations find the service when not told (SPEC section 5).
URL_ENV = "MOEPROXY_URL"
TOKEN_ENV = "MOEPROXY_TOKEN"


def service_endpoint(url: str | None = None, token: str | None = None) -> tuple[str | None, str | None]:
    """The service URL and token: the values given, else ``MOEPROXY_URL`` / ``MOEPROXY_TOKEN``
    (the one place the client side reads them)."""
    return url or os.environ.get(URL_ENV) or None, token or os.environ.get(TOKEN_ENV) or None
_STOP = object()


class ServerUnavailable(Exception):
    """The service could not be reached (or answered 5xx/429) after the retries of one attempt."""


class BatchRejected(Exception):
    """The service refused a batch with a 4xx that re-sending will not fix."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


# A bad or revoked token, or a run this token cannot see: the data is fine, keep it on disk.
_KEEP_ON_REJECT = frozenset({401, 403, 404})


#: The server stores steps as 64-bit integers (service.limits.INT64_MAX, which the client may not
#: import); a larger one is refused at log(), where the caller sees it, not by the sending thread,
#: and by the importers' step parser (importers.base.as_step), which names the file and line.
MAX_STEP = 2**63 - 1


def encode_value(value: float) -> float | str:
    """The REST body form of a number: non-finite values as "NaN" / "Infinity" / "-Infinity"."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _storable_name(name: str) -> bool:
    """The client-side copy of the server's name check (service.metrics.codec._check_name)."""
    if "\x00" in name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _default_spill_path(run_name: str) -> Path:
    from moeproxy.config import default_data_dir

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_name)[:100] or "run"
    return default_data_dir() / "spool" / f"{safe}.{os.getpid()}.jsonl"


class MetricsClient:
    """Non-blocking metric logger for one run (created or resumed by name on the server)."""

    def __init__(
        self,
        url: str,
        token: str,
        run_name: str,
        framework: str | None = None,
        model: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        tags: list[str] | None = None,
        batch_steps: int = 100,
        max_points_per_request: int = 100_000,
        flush_interval_s: float = 2.0,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        spill_path: str | os.PathLike | None = None,
        close_timeout_s: float = 30.0,
        register_atexit: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not run_name or not run_name.strip():
            raise ValueError("run_name must not be empty")
        if batch_steps < 1 or max_points_per_request < 1:
            raise ValueError("batch_steps and max_points_per_request must be >= 1")
        self.url = url.rstrip("/")
        self.run_name = run_name
        self.run_spec: dict[str, Any] = {"name": run_name, "tags": list(tags or []), "config": _jsonable(config or {})}
        if framework:
            self.run_spec["framework"] = framework
        if model:
            self.run_spec["model"] = model
        self.batch_steps = batch_steps
        self.max_points_per_request = max_points_per_request
        self.flush_interval_s = flush_interval_s
        self.retries = retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.close_timeout_s = close_timeout_s
        self.spill_path = Path(spill_path) if spill_path is not None else _default_spill_path(run_name)
        self.run_id: int | None = None

        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "moeproxy-client"},
            timeout=timeout_s,
            transport=transport,
        )
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0  # steps logged and not yet delivered or spilled
        self._pending_lock = threading.Condition()
        self._warned: set[str] = set()
        self._closed = False
        self._down_until = 0.0  # while now < this, batches go straight to the spill file
        self._down_failures = 0
        self._flush_now = threading.Event()
        self._deadline: float | None = None  # set by close(): stop retrying after it
        self.stats = {"points_sent": 0, "batches_sent": 0, "batches_spilled": 0, "points_skipped": 0,
                      "steps_held_in_memory": 0, "steps_dropped": 0}
        # Batches the spill file could not take (a read-only or full disk): held here, oldest first,
        # up to MAX_HELD_STEPS, and replayed with the file once the server answers.
        self._held: list[tuple[int, dict]] = []

        self._thread = threading.Thread(target=self._worker, name=f"moeproxy-client-{run_name}", daemon=True)
        self._thread.start()
        if register_atexit:
            ref = weakref.ref(self)
            self._atexit = lambda: (c := ref()) is not None and c.close()
            atexit.register(self._atexit)
        else:
            self._atexit = None

    # ----------------------------------------------------------------- public API

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        """Queue ``values`` for ``step`` (an int >= 0).  Returns at once."""
        if self._closed:
            raise RuntimeError("MetricsClient is closed")
        if isinstance(step, bool) or not isinstance(step, int):
            try:
                step = int(step.__index__())  # numpy / torch integer scalars
            except (AttributeError, TypeError):
                raise TypeError(f"step must be an integer, got {type(step).__name__}") from None
        if not 0 <= step <= MAX_STEP:
            raise ValueError(f"step must be an integer in [0, 2**63 - 1] (the server's 64-bit steps), got {step}")
        clean = self._convert(values)
        if not clean:
            return
        with self._pending_lock:
            self._pending += 1
        self._queue.put((step, clean))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything logged so far is delivered or spilled; False on timeout."""
        self._flush_now.set()
        self._queue.put(None)  # wake the worker
        with self._pending_lock:
            return self._pending_lock.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def close(self, status: str | None = None, timeout_s: float | None = None) -> None:
        """Flush, replay the spill file if the server is back, and stop the thread.

        ``status`` ("finished", "failed", ...) is set on the run when given and the server answers.
        """
        if self._closed:
            return
        self._closed = True
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._queue.put(_STOP)
        self._thread.join(timeout=timeout_s + 1.0)
        if status is not None and self.run_id is not None:
            try:
                self._http.patch(f"/api/v1/runs/{self.run_id}", json={"status": status}, timeout=5.0)
            except httpx.HTTPError:
                log.warning("could not set the status of run %s to %s", self.run_name, status)
        if self._held:
            log.error(
                "moeproxy: %d steps of run %s could not be delivered nor written to %s; they are lost",
                len(self._held), self.run_name, self.spill_path,
            )
        if self.spill_path.exists() and self.spill_path.stat().st_size > 0:
            log.warning(
                "moeproxy: %s undelivered batches remain in %s; pass spill_path=%r to a new MetricsClient to send them",
                self.run_name,
                self.spill_path,
                str(self.spill_path),
            )
        self._http.close()
        if self._atexit is not None:
            atexit.unregister(self._atexit)

    def __enter__(self) -> MetricsClient:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(status="failed" if exc_type is not None else "finished")

    # ----------------------------------------------------------------- conversion

    def _convert(self, values: Mapping[str, Any]) -> dict[str, float | str]:
        clean: dict[str, float | str] = {}
        for name, value in values.items():
            if not isinstance(name, str) or not name.strip():
                self._warn_once(repr(name), "metric names must be non-empty strings")
                continue
            if not _storable_name(name):
                # The server refuses these names (422); dropping the one metric here keeps the rest
                # of the batch, and every later batch, flowing (issue 16).
                self._warn_once(repr(name), "a name with a NUL character or a lone surrogate")
                continue
            if isinstance(value, str):
                spelled = NONFINITE_SPELLINGS.get(value.lower()) if len(value) <= 9 else None
                if spelled is not None:
                    clean[name] = spelled
                    continue
                self._warn_once(name, "a string is not a number")
                continue
            try:
                number = float(value)
            except (TypeError, ValueError, RuntimeError):
                # RuntimeError/ValueError: a tensor or array with more than one element
                self._warn_once(name, f"{type(value).__name__} is not a number")
                continue
            clean[name] = encode_value(number)
        return clean

    def _warn_once(self, name: str, what: str) -> None:
        self.stats["points_skipped"] += 1
        if name not in self._warned:
            self._warned.add(name)
            log.warning("moeproxy: skipping metric %s (%s); warned once per name", name, what)

    # ----------------------------------------------------------------- worker

    def _worker(self) -> None:
        batch: list[tuple[int, dict]] = []
        batch_started = 0.0
        stopping = False
        while True:
            timeout = self.flush_interval_s if not batch else max(0.0, batch_started + self.flush_interval_s - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                stopping = True
            elif item is not None:
                if not batch:
                    batch_started = time.monotonic()
                batch.append(item)
            # Drain whatever else is already queued, without waiting.
            while len(batch) < self.batch_steps:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stopping = True
                elif more is not None:
                    batch.append(more)
            due = (
                stopping
                or len(batch) >= self.batch_steps
                or self._flush_now.is_set()
                or (batch and time.monotonic() - batch_started >= self.flush_interval_s)
            )
            if batch and due:
                try:
                    self._handle(batch)
                except Exception:  # never let the thread die: flush() and close() wait on it
                    log.exception("moeproxy: unexpected error sending run %s; keeping the batch on disk", self.run_name)
                    self._spill_quietly(batch)
                self._settle(len(batch))
                batch = []
            if self._flush_now.is_set() and self._queue.empty():
                self._flush_now.clear()
            if not batch and (stopping or self._spill_due()):
                try:
                    self._replay_spill()
                except Exception:
                    log.exception("moeproxy: unexpected error replaying %s", self.spill_path)
                    self._mark_down()
            if stopping and self._queue.empty() and not batch:
                return

    def _settle(self, n: int) -> None:
        with self._pending_lock:
            self._pending -= n
            self._pending_lock.notify_all()

    def _handle(self, batch: list[tuple[int, dict]]) -> None:
        """Deliver a batch, or spill it; spilled batches are replayed first so order is kept."""
        if self._is_down() or self._has_spill():
            if not self._replay_spill():
                self._spill(batch)
                return
        try:
            self._send(batch)
        except ServerUnavailable:
            self._spill(batch)
            self._mark_down()
        except BatchRejected as exc:
            if exc.status_code in _KEEP_ON_REJECT:
                log.error("moeproxy: the server refused run %s: %s (kept in %s)", self.run_name, exc, self.spill_path)
                self._spill(batch)
                self._mark_down()
            else:
                log.error("moeproxy: the server rejected a batch of run %s: %s (dropped)", self.run_name, exc)

    def _is_down(self) -> bool:
        return time.monotonic() < self._down_until and self._deadline is None

    def _spill_due(self) -> bool:
        return self._has_spill() and time.monotonic() >= self._down_until

    def _mark_down(self) -> None:
        self._down_failures += 1
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** min(self._down_failures, 16))
        self._down_until = time.monotonic() + delay * (0.5 + random.random() / 2)

    def _mark_up(self) -> None:
        self._down_failures = 0
        self._down_until = 0.0

    # ----------------------------------------------------------------- HTTP

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One call with retries on connection errors, timeouts, 429 and 5xx."""
        attempt = 0
        while True:
            told: float | None = None
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                problem: str = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in _RETRY_STATUS:
                    return response
                problem = f"HTTP {response.status_code}"
                told = retry_after_s(response)
            attempt += 1
            if attempt > self.retries or self._past_deadline():
                raise ServerUnavailable(problem)
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            if told is not None:  # the server said how long: a rate limit, a restart
                delay = max(delay, told)
            if self._deadline is not None:
                delay = min(delay, max(0.0, self._deadline - time.monotonic()))
            time.sleep(delay)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _ensure_run(self) -> int:
        if self.run_id is None:
            response = self._request("POST", "/api/v1/runs", json=self.run_spec)
            if response.status_code >= 400:
                raise BatchRejected(
                    f"creating run {self.run_name!r}: HTTP {response.status_code} {response.text[:200]}",
                    response.status_code,
                )
            self.run_id = int(response.json()["id"])
        return self.run_id

    def _send(self, batch: list[tuple[int, dict]]) -> None:
        run_id = self._ensure_run()
        for chunk in self._chunks(batch):
            # orjson: ~6x faster than json.dumps on a 100,000-point batch (17 vs 106 ms), on the
            # client's own thread. Every value is a finite float or a "NaN"/"Infinity" string by now
            # (_convert), so nothing reaches it that json's allow_nan=False would have refused.
            body = orjson.dumps({"steps": [{"step": s, "values": v} for s, v in chunk]})
            response = self._request(
                "POST", f"/api/v1/runs/{run_id}/metrics", content=body, headers={"Content-Type": "application/json"}
            )
            if response.status_code >= 400:
                if response.status_code == 404:
                    self.run_id = None  # the run was deleted: recreate it on the next attempt
                raise BatchRejected(f"HTTP {response.status_code} {response.text[:300]}", response.status_code)
            self.stats["points_sent"] += int(response.json().get("accepted", 0))
            self.stats["batches_sent"] += 1
        self._mark_up()

    def _chunks(self, batch: list[tuple[int, dict]]):
        chunk: list[tuple[int, dict]] = []
        points = 0
        for step, values in batch:
            if chunk and (len(chunk) >= self.batch_steps or points + len(values) > self.max_points_per_request):
                yield chunk
                chunk, points = [], 0
            chunk.append((step, values))
            points += len(values)
        if chunk:
            yield chunk

    # ----------------------------------------------------------------- spill file

    def _has_spill(self) -> bool:
        if self._held:
            return True
        try:
            return self.spill_path.stat().st_size > 0
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _spill(self, batch: list[tuple[int, dict]]) -> None:
        try:
            self.spill_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spill_path.open("a", encoding="utf-8") as f:
                for step, values in batch:
                    f.write(json.dumps({"step": step, "values": values}, allow_nan=False))
                    f.write("\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # read-only, full, or not a directory: training goes on regardless
            self._hold(batch, exc)
            return
        self.stats["batches_spilled"] += 1
        if self.stats["batches_spilled"] == 1 or self._down_failures <= 1:
            log.warning("moeproxy: server %s unreachable; spilling run %s to %s", self.url, self.run_name, self.spill_path)

    def _hold(self, batch: list[tuple[int, dict]], exc: OSError) -> None:
        if not self.stats["steps_held_in_memory"]:
            log.warning(
                "moeproxy: cannot write the spill file %s (%s: %s); holding up to %d steps of run %s in "
                "memory until the server answers", self.spill_path, type(exc).__name__, exc,
                MAX_HELD_STEPS, self.run_name,
            )
        room = max(0, MAX_HELD_STEPS - len(self._held))
        self._held.extend(batch[:room])
        self.stats["steps_held_in_memory"] += min(room, len(batch))
        dropped = len(batch) - min(room, len(batch))
        if dropped:
            if not self.stats["steps_dropped"]:
                log.error("moeproxy: %d steps held in memory for run %s: dropping newer ones", MAX_HELD_STEPS, self.run_name)
            self.stats["steps_dropped"] += dropped

    def _spill_quietly(self, batch: list[tuple[int, dict]]) -> None:
        try:
            self._spill(batch)
        except OSError:
            log.exception("moeproxy: could not write %s; %d steps of run %s are lost", self.spill_path, len(batch), self.run_name)

    def _replay_spill(self) -> bool:
        """Send the held steps and the spill file; True when nothing is left afterwards."""
        if not self._has_spill():
            return True
        if self._is_down():
            return False
        try:
            lines = self.spill_path.read_text(encoding="utf-8").splitlines()
        except (FileNotFoundError, NotADirectoryError):
            lines = []
        batch: list[tuple[int, dict]] = list(self._held)
        for line in lines:
            try:
                entry = json.loads(line)
                batch.append((int(entry["step"]), dict(entry["values"])))
            except (ValueError, KeyError, TypeError):
                log.warning("moeproxy: skipping a damaged line in %s", self.spill_path)
        try:
            self._send(batch)
        except ServerUnavailable:
            self._mark_down()
            return False
        except BatchRejected as exc:
            log.error("moeproxy: the server rejected spilled points of run %s: %s", self.run_name, exc)
            return False
        self._held.clear()
        if lines:
            self.spill_path.unlink(missing_ok=True)
        log.info("moeproxy: replayed %d spilled steps of run %s", len(batch), self.run_name)
        return True


def _jsonable(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (OmegaConf, dataclasses, paths...) turned into strict JSON (non-finite floats as strings)."""

    def strict(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return encode_value(value)
        if isinstance(value, dict):
            return {str(k): strict(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strict(v) for v in value]
        return value

    return strict(json.loads(json.dumps(dict(config), default=str)))
