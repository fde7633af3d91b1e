"""What every reader shares: the record type it yields and the error it raises."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from moeproxy.client import MAX_STEP

#: One logged step as a reader yields it: (step, {name: value}); values may be anything the source
#: holds (the registry keeps the numbers).
Record = tuple[int, Mapping[str, Any]]
Records = Iterator[Record]


class InvalidSource(ValueError):
    """A source that cannot be read; the message names the file and the line or record."""


def as_step(raw: Any, where: str) -> int:
    """A step from a source: an integer >= 0 (a float with no fraction, as CSV/Parquet hold it)."""
    if isinstance(raw, bool):
        raise InvalidSource(f"{where}: step must be an integer >= 0, got {raw!r}")
    try:
        step = int(raw)
        exact = step == float(raw)
    except (TypeError, ValueError, OverflowError):
        raise InvalidSource(f"{where}: step must be an integer >= 0, got {raw!r}") from None
    if not exact or step < 0:
        raise InvalidSource(f"{where}: step must be an integer >= 0, got {raw!r}")
    if step > MAX_STEP:
        raise InvalidSource(f"{where}: step {step} is above 2**63 - 1, the largest step the service stores")
    return step


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSource(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
