"""Tables with a step column: CSV (the standard library's reader) and Parquet (through pyarrow).

One row is one step; every other column is a metric under its own name. Empty cells are points
not logged; cells that are not numbers (a run name, a timestamp) are not metrics and are left out.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

from moeproxy.importers.base import InvalidSource, Records, as_step

#: Step column names, in order of preference (compared without case): the common one,
#: transformers' ``global_step``, and W&B's history export ``_step``.
STEP_COLUMNS: tuple[str, ...] = ("step", "global_step", "_step")
PARQUET_MAGIC = b"PAR1"
# Columns that hold a table's row labels, not a metric: pandas' to_csv(index=True) writes one with
# an empty header, to_parquet one named __index_level_0__ when the index is not the default.
_INDEX_COLUMN_PREFIX = "__index_level_"


def _is_metric_column(name: str, step_name: str) -> bool:
    return name != step_name and bool(name.strip()) and not name.startswith(_INDEX_COLUMN_PREFIX)


def step_column(columns: Sequence[str], path: Path) -> str:
    lowered = {c.strip().lower(): c for c in columns}
    for name in STEP_COLUMNS:
        if name in lowered:
            return lowered[name]
    raise InvalidSource(f"{path}: no step column (one of {', '.join(STEP_COLUMNS)}) among {list(columns)[:20]}")


def _number(cell: object) -> float | None:
    if cell is None or cell == "":
        return None
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def detect_csv(path: Path, head: str | None) -> bool:
    return head is not None and path.suffix.lower() in (".csv", ".tsv")


def read_csv(path: Path, metric_name: Callable[[str], str | None] | None = None) -> Records:
    """Rows of a CSV; ``metric_name`` maps a column to the metric it holds, or None to leave it out
    (a W&B export's own columns), and by default keeps every column under its header."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InvalidSource(f"{path}: {exc.strerror or exc}") from None
    with handle:
        dialect = "excel-tab" if path.suffix.lower() == ".tsv" else "excel"
        reader = csv.reader(handle, dialect=dialect)
        header = next(reader, None)
        if not header:
            raise InvalidSource(f"{path}: empty file (expected a header row)")
        step_index = header.index(step_column(header, path))
        names = {i: metric_name(name) if metric_name else name for i, name in enumerate(header)
                 if _is_metric_column(name, header[step_index])}
        names = {i: name for i, name in names.items() if name}
        try:
            for row in reader:
                if not row:
                    continue
                where = f"{path}: line {reader.line_num}"
                if len(row) != len(header):
                    raise InvalidSource(f"{where}: {len(row)} cells, the header has {len(header)}")
                step = as_step(row[step_index], where)
                yield step, {name: v for i, name in names.items() if (v := _number(row[i])) is not None}
        except csv.Error as exc:
            raise InvalidSource(f"{path}: line {reader.line_num}: {exc}") from None


def detect_parquet(path: Path, head: str | None) -> bool:
    if path.is_dir():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def read_parquet(path: Path) -> Records:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidSource(f"{path}: reading Parquet needs the pyarrow package (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid for a bad file, ArrowIOError is an OSError
        raise InvalidSource(f"{path}: not a readable Parquet file ({exc})") from None
    step_name = step_column(table.column_names, path)
    steps = table.column(step_name).to_pylist()
    columns = {name: table.column(name).to_pylist() for name in table.column_names
               if _is_metric_column(name, step_name)}
    for row, raw in enumerate(steps):
        step = as_step(raw, f"{path}: row {row}")
        yield step, {name: v for name, cells in columns.items() if (v := _number(cells[row])) is not None}
