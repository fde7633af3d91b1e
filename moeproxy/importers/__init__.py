"""Readers of past runs from the loggers users already have (issue 19): client side.

``read_source(path, format=None)`` reads a file or directory into an :class:`ImportedRun` (steps
with their numeric values under the source's own names, and the framework those names reveal);
``moeproxy import`` posts it to the service (:mod:`moeproxy.importers.upload`) and
``moeproxy triage`` ranks it locally. ``FORMATS`` is the registry: a format is a name, a detector
and a reader, so adding one is adding an entry. Detectors are tried in the table's order. A source
that is not a path (an MLflow run of a tracking server, ``mlflow:<tracking-uri>#<run-id>``) is a
string with its format's ``uri_prefix``.

This package reads files and speaks HTTP; it imports nothing from ``moeproxy.service`` (the
framework names come from the signature library's alias table, which is plain data).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from moeproxy.importers import hf_console, mlflow_run, table, tensorboard, trainer_state, verl, wandb_run
from moeproxy.importers.base import InvalidSource, Record, Records
from moeproxy.importers.framework import detect_framework
from moeproxy.integrations._common import numeric_metrics

__all__ = ["FORMATS", "Format", "ImportedRun", "InvalidSource", "detect_format", "detect_framework", "is_uri",
           "read_source"]

#: A source as given: a path, or for a format with a ``uri_prefix`` a string.
Source = Path | str

# Enough of a file to tell its format from its first lines.
HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    detect: Callable[[Path, str | None], bool]
    read: Callable[[Source], Records]
    #: Sources of this format that are not paths start with it (``mlflow:``).
    uri_prefix: str | None = None
    #: The run's own name where the source holds one (an MLflow run's run_name); else from the path.
    run_name: Callable[[Source], str] | None = None
    #: A format of one record a line: the line's record (None for a line that holds none), for
    #: ``moeproxy tail``, which follows a growing file line by line.
    parse_line: Callable[[str, str], Record | None] | None = None
    #: Its reader yields only Python floats (TensorBoard's scalars): nothing to filter or convert,
    #: which on a million points is a second saved.
    floats_only: bool = False


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("trainer_state", "transformers / TRL trainer_state.json (log_history)",
               trainer_state.detect, trainer_state.read),
        Format("verl_file", "verl file logger, JSON lines of {step, data}", verl.detect_file_logger,
               verl.read_file_logger, parse_line=verl.file_logger_line),
        Format("verl_console", "verl console log, step:N - key:value lines", verl.detect_console,
               verl.read_console, parse_line=verl.console_line),
        Format("hf_console", "transformers / TRL console log, one {'loss': ...} dict a logging step (steps in log order)",
               hf_console.detect, hf_console.read),
        # Before csv: a W&B export is a CSV whose own columns (_runtime, ...) are not metrics.
        Format("wandb_csv", "W&B CSV export: history (_step column) or a line plot panel's (Step, <run> - <metric>)",
               wandb_run.detect_csv, wandb_run.read_csv, run_name=wandb_run.csv_run_name),
        Format("csv", "CSV or TSV with a step column", table.detect_csv, table.read_csv),
        Format("parquet", "Parquet with a step column (needs pyarrow)", table.detect_parquet, table.read_parquet),
        Format("wandb", "W&B offline or synced run directory, run-*.wandb (needs wandb)", wandb_run.detect_run,
               wandb_run.read_run, run_name=wandb_run.run_name),
        # Before TensorBoard: an MLflow run may keep event files among its artifacts.
        Format("mlflow", "MLflow run: mlflow:<tracking-uri>#<run-id>, or a local mlruns folder (needs mlflow)",
               mlflow_run.detect, mlflow_run.read, uri_prefix=mlflow_run.URI_PREFIX, run_name=mlflow_run.run_name),
        Format("tensorboard", "TensorBoard event file or run folder (needs tensorboard)", tensorboard.detect,
               tensorboard.read, floats_only=True),
    )
}


@dataclass(frozen=True)
class ImportedRun:
    """A past run as read: ``steps`` ascending, each with the numeric values logged at it."""

    source: Source
    format: str
    name: str
    framework: str | None
    steps: tuple[tuple[int, dict[str, float]], ...]

    @property
    def n_points(self) -> int:
        return sum(len(values) for _, values in self.steps)

    def metric_names(self) -> set[str]:
        return {name for _, values in self.steps for name in values}


def _head(path: Path) -> str | None:
    if path.is_dir():
        return None
    try:
        with path.open("rb") as handle:
            return handle.read(HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InvalidSource(f"{path}: {exc.strerror or exc}") from None


def _run_name(path: Source, format: str) -> str:
    """A default run name: the source's own (``Format.run_name``), the file's stem, or for
    trainer_state.json the output folder's name (the file sits in ``<output_dir>/`` or
    ``<output_dir>/checkpoint-N/``)."""
    if FORMATS[format].run_name is not None:
        return FORMATS[format].run_name(path)
    if path.is_dir() or format != "trainer_state":
        return path.name if path.is_dir() else path.stem
    folder = path.resolve().parent
    if folder.name.startswith("checkpoint-"):
        folder = folder.parent
    return folder.name or path.stem


def detect_format(path: Path) -> str | None:
    """The first format of ``FORMATS`` whose detector accepts ``path``; None when none does."""
    head = _head(path)
    return next((f.name for f in FORMATS.values() if f.detect(path, head)), None)


def uri_format(source: Source) -> str | None:
    """The format whose ``uri_prefix`` the source string starts with, else None (a path)."""
    if not isinstance(source, str):
        return None
    return next((f.name for f in FORMATS.values() if f.uri_prefix and source.startswith(f.uri_prefix)), None)


def is_uri(source: Source) -> bool:
    return uri_format(source) is not None


def read_source(source: Source, format: str | None = None) -> ImportedRun:
    """Read ``source`` in ``format`` (detected when None); raises InvalidSource naming file and line."""
    by_uri = uri_format(source)
    if by_uri is not None:
        if format not in (None, by_uri):
            raise InvalidSource(f"{source}: a {by_uri} source, not {format!r}")
        return _read(source, by_uri)
    path = Path(source)
    if not path.exists():
        raise InvalidSource(f"{path}: no such file or directory")
    if format is None:
        format = detect_format(path)
        if format is None:
            raise InvalidSource(f"{path}: not a format moeproxy can read (give --format, one of {', '.join(FORMATS)})")
    elif format not in FORMATS:
        raise InvalidSource(f"unknown format {format!r} (one of {', '.join(FORMATS)})")
    return _read(path, format)


def _read(path: Source, format: str) -> ImportedRun:
    fmt = FORMATS[format]
    merged: dict[int, dict[str, float]] = {}
    for step, values in fmt.read(path):
        # A step logged twice (train and eval entries, a resumed job) keeps the later values.
        merged.setdefault(step, {}).update(values if fmt.floats_only else numeric_metrics(values))
    if fmt.floats_only:
        steps = tuple((s, merged[s]) for s in sorted(merged) if merged[s])
    else:
        steps = tuple((s, {k: float(v) for k, v in merged[s].items()}) for s in sorted(merged) if merged[s])
    name = _run_name(path, format)
    framework = detect_framework({name for _, values in steps for name in values})
    return ImportedRun(path, format, name, framework, steps)
