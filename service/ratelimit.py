"""In-process sliding-window counters: the page-login lockout and the request rate limits.

Per process: with several uvicorn workers each keeps its own counts, so the effective limit is
up to ``workers`` times the configured one. That bounds guessing and floods without a shared
store; an operator who needs one global limit puts it in the proxy in front (nginx ``limit_req``).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from moeproxy.service.middleware import header, send_json


class SlidingWindow:
    """At most ``limit`` events per key in any ``window_s`` seconds.

    ``retry_after(key)`` is 0 while the key is under its limit, else the whole seconds until the
    oldest counted event leaves the window (what a 429's ``Retry-After`` says). Keys idle for a
    window are forgotten, and at most ``max_keys`` are kept (the oldest dropped first), so a
    flood of distinct addresses cannot grow the table without bound.
    """

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        if limit < 1 or window_s <= 0:
            raise ValueError("a sliding window needs limit >= 1 and window_s > 0")
        self.limit, self.window_s, self.max_keys, self.clock = limit, window_s, max_keys, clock
        self._events: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _live(self, key: str, now: float) -> deque[float] | None:
        events = self._events.get(key)
        if events is None:
            return None
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if not events:
            del self._events[key]
            return None
        return events

    def retry_after(self, key: str) -> int:
        with self._lock:
            now = self.clock()
            events = self._live(key, now)
            if events is None or len(events) < self.limit:
                return 0
            return max(1, math.ceil(events[0] + self.window_s - now))

    def _append(self, key: str, events: deque[float] | None, now: float) -> None:
        if events is None:
            if len(self._events) >= self.max_keys:
                self._events.pop(next(iter(self._events)))  # dicts keep insertion order: the oldest key
            events = self._events[key] = deque()
        events.append(now)

    def record(self, key: str) -> None:
        with self._lock:
            now = self.clock()
            self._append(key, self._live(key, now), now)

    def hit(self, key: str) -> int:
        """Count one event unless the key is at its limit: 0 if counted, else the ``retry_after``."""
        with self._lock:
            now = self.clock()
            events = self._live(key, now)
            if events is not None and len(events) >= self.limit:
                return max(1, math.ceil(events[0] + self.window_s - now))
            self._append(key, events, now)
            return 0

    def clear(self, key: str) -> None:
        with self._lock:
            self._events.pop(key, None)


# --- Request rate limits ----------------------------------------------------------------------------

#: Never limited: probes, and the pages' static files.
EXEMPT_PREFIXES = ("/healthz", "/readyz", "/static/")
MLFLOW_PREFIX = "/mlflow/"


class RateLimits:
    """ASGI middleware: at most ``per_token`` requests per credential and ``per_address`` per client
    address in any ``window_s``; over it, 429 with ``Retry-After`` before the body is read.

    The credential is the ``Authorization`` header as sent (hashed), so guessing with many made-up
    tokens is bounded by the address limit and a valid token's job by its own. MLflow routes answer
    in MLflow's shape (``REQUEST_LIMIT_EXCEEDED``), which the MLflow client retries. A limit of 0
    turns that limit off.
    """

    def __init__(self, app, *, per_token: int, per_address: int, window_s: float):
        self.app = app
        self.by_token = SlidingWindow(per_token, window_s) if per_token > 0 else None
        self.by_address = SlidingWindow(per_address, window_s) if per_address > 0 else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").startswith(EXEMPT_PREFIXES):
            await self.app(scope, receive, send)
            return
        wait = 0
        if self.by_address is not None:
            client = scope.get("client")
            wait = self.by_address.hit(client[0] if client else "unknown")
        credential = header(scope, b"authorization")
        if not wait and credential and self.by_token is not None:
            wait = self.by_token.hit(hashlib.sha256(credential).hexdigest()[:32])
        if not wait:
            await self.app(scope, receive, send)
            return
        message = f"too many requests: retry in {wait} s"
        if scope.get("path", "").startswith(MLFLOW_PREFIX):
            payload = {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": message}
        else:
            payload = {"detail": message}
        await send_json(send, 429, json.dumps(payload).encode(), ((b"retry-after", str(wait).encode()),))
