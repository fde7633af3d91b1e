"""When an alert is due: one per (run, class) when the class becomes strong, again only on escalation.

Levels (ordered; an alert goes out when a class reaches a level above the highest already alerted):

1. the class is ``strong``;
2. the class is ``strong`` and ranked first (it is the run's verdict).

A class that drops back to weak and becomes strong again does not alert again: the level already
alerted is the high-water mark.  ``healthy`` never alerts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from moeproxy.service.triage.schemas import TriageCandidate

NEVER_ALERT = frozenset({"healthy"})
LEVEL_STRONG = 1
LEVEL_TOP = 2


def alert_level(candidate: TriageCandidate, rank: int) -> int:
    if candidate.fault_class in NEVER_ALERT or candidate.strength != "strong":
        return 0
    return LEVEL_TOP if rank == 0 else LEVEL_STRONG


@dataclass(frozen=True, slots=True)
class DueAlert:
    candidate: TriageCandidate
    rank: int
    level: int


def due_alerts(candidates: Sequence[TriageCandidate], alerted: Mapping[str, int]) -> list[DueAlert]:
    """Candidates (ranked, best first) whose level exceeds the level already alerted for their class."""
    due = []
    for rank, candidate in enumerate(candidates):
        level = alert_level(candidate, rank)
        if level > alerted.get(candidate.fault_class, 0):
            due.append(DueAlert(candidate, rank, level))
    return due
