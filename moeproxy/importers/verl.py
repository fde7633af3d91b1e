"""verl's two local logs: the file logger (JSON lines) and the console logger.

Both formats are read from verl's source (volcengine/verl at b178a3cd, January 2026):

* ``verl/utils/tracking.py`` ``FileLogger.log`` writes ``orjson.dumps({"step": step, "data": data})``
  and a newline per call (``trainer.logger=[file]``; ``VERL_FILE_LOGGER_PATH`` or
  ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``);
* ``verl/utils/logger/aggregate_logger.py`` ``concat_dict_to_str`` prints
  ``step:N - key:value - ...`` with each number through ``pprint.pformat`` (so numpy scalars read
  ``np.float64(0.5)``); a console log holds other lines too (Ray's ``(TaskRunner pid=…)`` prefix,
  warnings), which are skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from moeproxy.importers.base import InvalidSource, Record, Records, as_step, read_text

_CONSOLE_STEP = re.compile(r"(?:^|\s)step:(\d+)((?: - [^\n]*)?)$")
# pprint of a numpy scalar under numpy 2: np.float64(0.5), np.int64(3).
_NUMPY_REPR = re.compile(r"^np\.\w+\((.*)\)$")


def _first_line(head: str | None) -> str | None:
    if head is None:
        return None
    return next((line for line in head.splitlines() if line.strip()), None)


def detect_file_logger(path: Path, head: str | None) -> bool:
    line = _first_line(head)
    try:
        first = json.loads(line) if line else None
    except json.JSONDecodeError:
        return False
    return isinstance(first, Mapping) and set(first) == {"step", "data"} and isinstance(first["data"], Mapping)


def file_logger_line(line: str, where: str) -> Record | None:
    """One line of the file logger as a record; None for a blank line."""
    if not line.strip():
        return None
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidSource(f"{where}: not JSON ({exc.msg})") from None
    if not isinstance(entry, Mapping) or "step" not in entry or not isinstance(entry.get("data"), Mapping):
        raise InvalidSource(f"{where}: expected {{\"step\": N, \"data\": {{...}}}}")
    return as_step(entry["step"], where), entry["data"]


def read_file_logger(path: Path) -> Records:
    return _read_lines(path, file_logger_line)


def detect_console(path: Path, head: str | None) -> bool:
    return head is not None and any(_CONSOLE_STEP.search(line) for line in head.splitlines())


def console_line(line: str, where: str) -> Record | None:
    """One console line as a record; None for the other output (Ray's, warnings)."""
    match = _CONSOLE_STEP.search(line.rstrip())
    if match is None:
        return None
    values = {}
    for field in match.group(2).split(" - ")[1:]:
        name, sep, raw = field.rpartition(":")
        if not sep or not name:
            raise InvalidSource(f"{where}: expected key:value, got {field!r}")
        values[name] = _console_number(raw.strip(), f"{where}: {name}")
    return as_step(match.group(1), where), values


def read_console(path: Path) -> Records:
    return _read_lines(path, console_line)


def _read_lines(path: Path, parse_line: Callable[[str, str], Record | None]) -> Records:
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        if (record := parse_line(line, f"{path}: line {lineno}")) is not None:
            yield record


def _console_number(raw: str, where: str) -> float:
    numpy = _NUMPY_REPR.match(raw)
    try:
        return float(numpy.group(1) if numpy else raw)
    except ValueError:
        raise InvalidSource(f"{where}: not a number: {raw!r}") from None
