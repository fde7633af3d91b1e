"""Helpers shared by the triage/page tests (a module name of its own: tests/ has several conftest.py)."""

from __future__ import annotations


def ingest_body(run, *, start: int = 0, stop: int | None = None) -> dict:
    """The REST ingest body of a signatures RunMetrics (steps in [start, stop))."""
    steps = [s for s in run.to_steps() if s["step"] >= start and (stop is None or s["step"] < stop)]
    return {"steps": steps}
