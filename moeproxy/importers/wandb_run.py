"""W&B runs: an offline (or synced) run directory, and the CSV a run's history is exported to.

* A run directory (``wandb/offline-run-<date>-<id>/`` or ``wandb/run-<date>-<id>/``, its
  ``run-<id>.wandb`` file, or the ``wandb/`` folder when it holds one run) is read by W&B's own reader
  of its transaction log, ``wandb leet inspect --json`` (wandb-core, shipped in the ``wandb`` wheel;
  wandb 0.31 has no Python reader of the file left), one JSON record a line. Each ``history`` record
  is one ``wandb.log`` step: ``{"item": {name: value}, "step": {"num": N}}``, non-finite values as
  "NaN"/"Infinity"/"-Infinity", nested dicts flattened with dots. A run cut off mid-write is read up to
  its last whole record (the reader says so on stderr).
* A CSV export: the history table (``run.history()`` / ``scan_history`` written out, or the run
  page's export) with its ``_step`` column, or a line plot panel's export (``Step``,
  ``<run> - <metric>``, ``<run> - <metric>__MIN``/``__MAX``: the bounds of a sampled bucket, left out).

Names starting with ``_`` (``_step``, ``_runtime``, ``_timestamp``, ``_wandb``) are W&B's own, not
the run's metrics. The ``wandb`` package comes with the ``[dev]`` extra and is started as a separate
process, only when a run directory is read.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from moeproxy.importers import table
from moeproxy.importers.base import InvalidSource, Records, as_step

RUN_FILE_GLOB = "run-*.wandb"
MISSING_PACKAGE = ("reading a W&B run directory needs the wandb package, which the [dev] extra brings: "
                   "pip install 'moeproxy[dev]' (or pip install wandb)")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_PANEL_STEP = "Step"
_PANEL_SEPARATOR = " - "
_PANEL_BOUNDS = ("__MIN", "__MAX")


def _is_wandb_own(name: str) -> bool:
    return name.startswith("_")


# --- run directories ---------------------------------------------------------------------------

def run_files(path: Path) -> list[Path]:
    """The ``run-*.wandb`` files of ``path``: the file itself, a run directory's, or a wandb folder's."""
    if path.is_file():
        return [path] if path.match(RUN_FILE_GLOB) else []
    if not path.is_dir():
        return []
    found = sorted(path.glob(RUN_FILE_GLOB)) or sorted(path.glob(f"*/{RUN_FILE_GLOB}"))
    # wandb/latest-run is a link to one of the run directories: count each run once.
    return sorted({f.resolve() for f in found if f.is_file()})


def detect_run(path: Path, head: str | None) -> bool:
    return bool(run_files(path))


def _run_file(path: Path) -> Path:
    files = run_files(path)
    if not files:
        raise InvalidSource(f"{path}: no W&B run file ({RUN_FILE_GLOB})")
    if len(files) > 1:
        listed = ", ".join(str(f.parent) for f in files[:5])
        raise InvalidSource(f"{path}: {len(files)} W&B runs ({listed}); give one run's directory")
    return files[0]


def _records(path: Path) -> Iterator[Mapping[str, Any]]:
    """The records of a run's transaction log, as W&B's reader prints them."""
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise InvalidSource(f"{path}: {MISSING_PACKAGE}")
    run_file = _run_file(path)
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)]
    with tempfile.TemporaryFile(mode="w+") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                                   env=_offline_env())
        try:
            for number, line in enumerate(process.stdout, start=1):
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    raise InvalidSource(f"{run_file}: record {number}: the W&B reader printed {line[:80]!r}") from None
        finally:
            process.stdout.close()
            if process.poll() is None:  # the caller stopped early (the run name is the second record)
                process.terminate()
            returncode = process.wait()
        if returncode not in (0, -15):
            errors.seek(0)
            message = errors.read().strip().splitlines()
            raise InvalidSource(f"{run_file}: not a readable W&B run file ({message[-1] if message else returncode})")


def _offline_env() -> dict[str, str]:
    # Reading a local file: nothing to upload, nothing to print.
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def _value(raw: Any) -> Any:
    return _NON_FINITE.get(raw, raw) if isinstance(raw, str) else raw


def read_run(path: Path) -> Records:
    for number, record in enumerate(_records(path), start=1):
        history = record.get("history")
        if record.get("type") != "history" or not isinstance(history, Mapping):
            continue
        item = history.get("item") or {}
        raw_step = (history.get("step") or {}).get("num", item.get("_step"))
        step = as_step(raw_step, f"{path}: record {record.get('num', number)}")
        yield step, {name: _value(v) for name, v in item.items() if not _is_wandb_own(name)}


def run_name(path: Path) -> str:
    """The run's display name (``wandb.init(name=...)``), else its id, else the directory's name."""
    for record in _records(path):
        if record.get("type") == "run":
            run = record.get("run") or {}
            return run.get("display_name") or run.get("run_id") or path.name
    return path.name


# --- CSV exports -------------------------------------------------------------------------------

def _header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def _is_panel_export(header: list[str]) -> bool:
    return (bool(header) and header[0] == _PANEL_STEP
            and any(_PANEL_SEPARATOR in name and name.endswith(_PANEL_BOUNDS) for name in header))


def detect_csv(path: Path, head: str | None) -> bool:
    if not table.detect_csv(path, head):
        return False
    header = [name.strip() for name in _header(path)]
    return "_step" in header or _is_panel_export(header)


def _panel_names(header: list[str], path: Path) -> dict[str, str]:
    """Column -> metric of a panel export: ``<run> - <metric>``, one run, the bucket bounds left out."""
    columns = [c for c in header[1:] if _PANEL_SEPARATOR in c]
    runs = sorted({c.partition(_PANEL_SEPARATOR)[0] for c in columns})
    if len(runs) > 1:
        raise InvalidSource(f"{path}: a panel export of {len(runs)} runs ({', '.join(runs[:5])}); "
                            "export one run's panel")
    return {c: c.partition(_PANEL_SEPARATOR)[2] for c in columns if not c.endswith(_PANEL_BOUNDS)}


def read_csv(path: Path) -> Records:
    header = _header(path)
    if _is_panel_export(header):
        return table.read_csv(path, metric_name=_panel_names(header, path).get)
    return table.read_csv(path, metric_name=lambda name: None if _is_wandb_own(name) else name)


def csv_run_name(path: Path) -> str:
    """A panel export's run name (what precedes `` - `` in its columns), else the file's stem."""
    header = _header(path)
    if _is_panel_export(header):
        return next(c.partition(_PANEL_SEPARATOR)[0] for c in header[1:] if _PANEL_SEPARATOR in c)
    return path.stem
