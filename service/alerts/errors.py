"""Named alert errors."""

from __future__ import annotations


class AlertError(Exception):
    """Base class of alert errors."""


class UnknownChannel(AlertError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(f"unknown alert channel {name!r}; known: {', '.join(sorted(known))}")
