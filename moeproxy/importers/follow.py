"""Follow a growing log file line by line, as ``tail -F`` does, for ``moeproxy tail``.

:class:`LogFollower` reads what was appended since its last read and parses each whole line with
its format's ``parse_line``. A last line without its newline yet is held until the rest arrives
(verl's file logger writes a line and its newline in one call, but a reader on shared storage can
see half of it). The file is followed by name: when the name points at a new file (rotation: the
old one renamed, a new one created) the rest of the old file is read first, then the new one from
its start; a file shorter than what was read (truncated in place, a job restarted with ``"wb"``)
is read again from its start. Each of these is told through ``on_notice``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from moeproxy.importers.base import InvalidSource, Record

LineParser = Callable[[str, str], Record | None]


class BadLine(InvalidSource):
    """A line that does not parse; ``records`` are the lines before it in the same read, to send."""

    def __init__(self, message: str, records: list[Record]) -> None:
        super().__init__(message)
        self.records = records


class LogFollower:
    def __init__(self, path: Path, parse_line: LineParser, on_notice: Callable[[str], None]) -> None:
        self.path = path
        self.parse_line = parse_line
        self.on_notice = on_notice
        self._handle: BinaryIO | None = None
        self._partial = b""
        self._lineno = 0
        self._offset = 0
        self._missing_told = False

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def read_new(self) -> list[Record]:
        """The records of the whole lines written since the last call (none while the file is absent)."""
        records: list[Record] = []
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            current = None
        if self._handle is None:
            if current is None:
                self._tell_missing()
                return records
            self._open()
        elif current is None or not os.path.samestat(current, os.fstat(self._handle.fileno())):
            self._read_available(records)  # what the old file got before it was moved
            if current is None:
                self._tell_missing()
                return records
            if self._partial:
                self._incomplete("the file was replaced")
            self.on_notice(f"{self.path} was replaced (rotated): following the new file from its start")
            self.close()
            self._open()
        elif current.st_size < self._offset:
            self.on_notice(f"{self.path} was truncated ({current.st_size} bytes, {self._offset} were read): "
                           "reading it again from its start")
            self._partial, self._lineno, self._offset = b"", 0, 0
            self._handle.seek(0)
        self._read_available(records)
        return records

    def finish(self) -> list[Record]:
        """At the stop: a last line without its newline is a record if it parses whole, else left out."""
        records = self.read_new()
        if not self._partial:
            return records
        line, self._partial = self._partial, b""
        try:
            record = self._parse(line, self._lineno + 1)
        except InvalidSource:
            self._incomplete("stopped", line)
            return records
        return records + ([record] if record is not None else [])

    def _open(self) -> None:
        self._handle = self.path.open("rb")
        self._partial, self._lineno, self._offset = b"", 0, 0
        self._missing_told = False

    def _tell_missing(self) -> None:
        if not self._missing_told:
            self.on_notice(f"{self.path} does not exist (yet): waiting for it")
            self._missing_told = True

    def _incomplete(self, why: str, line: bytes | None = None) -> None:
        line = self._partial if line is None else line
        self.on_notice(f"{self.path}: line {self._lineno + 1} is incomplete ({len(line)} bytes, no newline); "
                       f"{why}: it is not sent")
        self._partial = b""

    def _read_available(self, records: list[Record]) -> None:
        """Append the records of the whole lines the open file has past what was read (nothing
        while the file is not open)."""
        if self._handle is None:
            return
        chunk = self._handle.read()
        self._offset += len(chunk)
        if not chunk:
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self._lineno += 1
            try:
                record = self._parse(line, self._lineno)
            except InvalidSource as exc:
                raise BadLine(str(exc), records) from None
            if record is not None:
                records.append(record)

    def _parse(self, line: bytes, lineno: int) -> Record | None:
        where = f"{self.path}: line {lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidSource(f"{where}: not UTF-8 text") from None
        return self.parse_line(text, where)
