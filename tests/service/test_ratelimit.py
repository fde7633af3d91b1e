"""The sliding window behind the login lockout, on a fake clock."""

from __future__ import annotations

import pytest

from moeproxy.service.ratelimit import SlidingWindow


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_refused_at_its_limit_until_the_oldest_event_ages_out():
    clock = Clock()
    window = SlidingWindow(3, 60, clock=clock)
    for offset in (0, 10, 20):
        clock.now = 1000 + offset
        assert window.hit("a") == 0
    clock.now = 1030
    assert window.hit("a") == 30  # the event at 1000 leaves the window at 1060
    assert window.retry_after("a") == 30
    assert window.hit("b") == 0  # keys are counted apart
    clock.now = 1060
    assert window.retry_after("a") == 0 and window.hit("a") == 0
    assert window.retry_after("a") == 10  # events at 1010, 1020, 1060: the next frees at 1070


def test_record_counts_without_refusing_and_clear_forgets():
    clock = Clock()
    window = SlidingWindow(2, 10, clock=clock)
    for _ in range(5):
        window.record("k")
    assert window.retry_after("k") == 10
    window.clear("k")
    assert window.retry_after("k") == 0


def test_the_table_is_bounded():
    window = SlidingWindow(1, 3600, max_keys=100, clock=Clock())
    for i in range(1000):
        window.record(f"addr-{i}")
    assert len(window._events) == 100
    assert window.retry_after("addr-999") > 0 and window.retry_after("addr-0") == 0


@pytest.mark.parametrize(("limit", "window_s"), [(0, 10), (3, 0)])
def test_a_window_that_cannot_count_is_refused(limit, window_s):
    with pytest.raises(ValueError):
        SlidingWindow(limit, window_s)
