"""Peak replay: the running total of allocations and frees, maximised over time (and per window).

Pure functions on event lists (no torch): what the meter (:mod:`.meter`) feeds them is the CPU
allocator's events of a torch profile, or torch's memory-profiler timeline by category; the tests
feed them hand-computed sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from moeproxy.reproduction.errors import ReproductionError

#: torch memory-profiler categories, in the order results list them; ``unknown`` holds bytes the
#: analysis could not attribute to any tensor it saw used by an operator
CATEGORIES: tuple[str, ...] = (
    "parameter", "optimizer_state", "gradient", "activation", "temporary", "input", "autograd_detail", "unknown",
)


class InvalidMemoryRequest(ReproductionError, ValueError):
    """A memory measurement that cannot be made as asked (no prompts, a negative baseline, ...)."""


@dataclass(frozen=True)
class AllocationEvent:
    """One allocator event: ``size`` > 0 allocates ``size`` bytes at ``ptr``, < 0 frees the block."""

    time_ns: int
    size: int
    ptr: int


@dataclass(frozen=True)
class WindowPeak:
    """Live bytes at a window's start, its maximum inside the window, and at its end."""

    start_bytes: int
    peak_bytes: int
    end_bytes: int
    by_category: dict[str, int] | None = None  # split at the window's peak


@dataclass(frozen=True)
class PeakSummary:
    peak_bytes: int
    end_bytes: int
    freed_preexisting_bytes: int
    peak_time_ns: int | None
    live_at_end: dict[int, int] = field(default_factory=dict)  # ptr -> bytes of blocks still alive
    windows: dict[str, WindowPeak] = field(default_factory=dict)


class _Windows:
    """Per-window start / peak / end of a running total that changes at increasing times."""

    def __init__(self, windows: Mapping[str, tuple[int, int]] | None):
        self.bounds = dict(windows or {})
        for name, (lo, hi) in self.bounds.items():
            if hi < lo:
                raise InvalidMemoryRequest(f"window {name!r} ends ({hi}) before it starts ({lo})")
        self.open: dict[str, list] = {}  # name -> [start, peak, split]
        self.done: dict[str, WindowPeak] = {}

    def before(self, t: int, current: int, split) -> None:
        """Called before the changes at time ``t`` are applied."""
        for name, (lo, hi) in self.bounds.items():
            if name in self.done:
                continue
            if name not in self.open and t >= lo:
                self.open[name] = [current, current, split()]
            if name in self.open and t > hi:
                self._close(name, current)

    def after(self, t: int, current: int, split) -> None:
        for name, w in self.open.items():
            if current > w[1] and t <= self.bounds[name][1]:
                w[1], w[2] = current, split()

    def finish(self, current: int, split) -> dict[str, WindowPeak]:
        for name in self.bounds:
            if name not in self.done:
                self.open.setdefault(name, [current, current, split()])
                self._close(name, current)
        return {name: self.done[name] for name in self.bounds}

    def _close(self, name: str, current: int) -> None:
        start, peak, split = self.open.pop(name)
        self.done[name] = WindowPeak(start, peak, current, split)


def peak_from_events(
    events: Iterable[AllocationEvent],
    *,
    live_at_start: int = 0,
    windows: Mapping[str, tuple[int, int]] | None = None,
) -> PeakSummary:
    """The running sum of in-window allocations and frees, maximised over time.

    Events are taken in time order (stable for equal times, so pass them in the order they were
    recorded).  A free whose block was not allocated in the window is reported, not subtracted.
    ``windows`` (name -> (start_ns, end_ns), inclusive) also gives each interval's own peak, with
    everything allocated before it still counted.
    """
    if live_at_start < 0:
        raise InvalidMemoryRequest(f"live_at_start={live_at_start}: bytes alive at the start cannot be negative")
    live: dict[int, int] = {}
    current = peak = int(live_at_start)
    peak_time: int | None = None
    freed_pre = 0
    tracker = _Windows(windows)
    no_split = lambda: None
    for ev in sorted(events, key=lambda e: e.time_ns):
        tracker.before(ev.time_ns, current, no_split)
        if ev.size > 0:
            live[ev.ptr] = live.get(ev.ptr, 0) + ev.size
            current += ev.size
            if current > peak:
                peak, peak_time = current, ev.time_ns
        elif ev.size < 0:
            size = live.pop(ev.ptr, None)
            if size is None:
                freed_pre += -ev.size
            else:
                current -= size
        tracker.after(ev.time_ns, current, no_split)
    return PeakSummary(peak, current, freed_pre, peak_time, live, tracker.finish(current, no_split))


def categorised_peak(
    timeline: Iterable[tuple[int, str, int]],
    *,
    live_at_start: int = 0,
    windows: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[int, dict[str, int], dict[str, WindowPeak]]:
    """Peak total and its split, from ``(time_ns, category, delta_bytes)`` changes (and per window).

    ``live_at_start`` bytes are counted as ``parameter`` (what is alive before a block that loads
    nothing is, in this project's uses, the weights).  Changes at one timestamp are applied
    together before the total is compared, so a same-instant create/destroy pair is no peak.
    """
    sums = dict.fromkeys(CATEGORIES, 0)
    sums["parameter"] += int(live_at_start)
    total = sum(sums.values())
    best_total, best = total, dict(sums)
    tracker = _Windows(windows)
    split = lambda: dict(sums)
    pending: int | None = None
    for t, category, delta in sorted(timeline, key=lambda x: x[0]):
        if t != pending:
            if pending is not None:
                tracker.after(pending, total, split)
                if total > best_total:
                    best_total, best = total, dict(sums)
            tracker.before(t, total, split)
            pending = t
        sums[category] += int(delta)
        total += int(delta)
    if pending is not None:
        tracker.after(pending, total, split)
        if total > best_total:
            best_total, best = total, dict(sums)
    return best_total, best, tracker.finish(total, split)
