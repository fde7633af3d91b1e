"""Polling for a condition with a deadline (tests never assert wall-clock times; they wait for what
they need, failing with what they waited for)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
