"""MLflow runs, read through the ``mlflow`` client (``MlflowClient.get_metric_history``), never from
the store's files by hand.

A run is named one of two ways:

* ``mlflow:<tracking-uri>#<run-id>``: a run of any store the client reaches
  (``mlflow:http://mlflow.internal:5000#3f2a…``, ``mlflow:sqlite:///mlflow.db#3f2a…``);
  ``mlflow:#<run-id>`` takes the tracking URI the client itself would (``MLFLOW_TRACKING_URI``);
* a local file store folder: one run's folder (``mlruns/<experiment-id>/<run-id>``), an experiment
  folder or the ``mlruns`` folder itself when it holds one run (more than one, and the user picks).

The client is imported when a run is read: it comes with the ``[dev]`` extra (``mlflow-skinny``),
and the light install never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from moeproxy.importers.base import InvalidSource, Records, as_step

URI_PREFIX = "mlflow:"
MISSING_CLIENT = ("reading an MLflow run needs the mlflow client, which the [dev] extra brings: "
                  "pip install 'moeproxy[dev]' (or pip install mlflow-skinny)")
# MLflow 3 refuses to open a file store unless this is set (the store is in maintenance mode);
# reading a run a user already has is what the store still serves.
_ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
_RESERVED_FOLDERS = frozenset({".trash", "models", "datasets", "traces", "tags"})


def parse_uri(source: str) -> tuple[str | None, str]:
    """(tracking URI or None for the client's default, run id) of ``mlflow:<tracking-uri>#<run-id>``."""
    tracking_uri, sep, run_id = source.removeprefix(URI_PREFIX).rpartition("#")
    if not sep or not run_id.strip():
        raise InvalidSource(f"{source}: expected mlflow:<tracking-uri>#<run-id> (or mlflow:#<run-id> "
                            "for MLFLOW_TRACKING_URI)")
    return tracking_uri.strip() or None, run_id.strip()


def _is_run_folder(folder: Path) -> bool:
    return (folder / "meta.yaml").is_file() and (folder / "metrics").is_dir()


def run_folders(path: Path) -> list[Path]:
    """The run folders of a file store at ``path``: itself, its runs, or its experiments' runs."""
    if not path.is_dir():
        return []
    if _is_run_folder(path):
        return [path]
    found = []
    for depth in ("*", "*/*"):
        found += [p for p in path.glob(depth) if p.is_dir() and _is_run_folder(p)
                  and not _RESERVED_FOLDERS & set(p.relative_to(path).parts)]
        if found:
            break
    return sorted(found)


def detect(path: Path, head: str | None) -> bool:
    return bool(run_folders(path))


def _locate(source: str | Path) -> tuple[str | None, str]:
    """(tracking URI, run id) of a source: a ``mlflow:`` URI or a file store folder."""
    if isinstance(source, str) and source.startswith(URI_PREFIX):
        return parse_uri(str(source))
    path = Path(source)
    runs = run_folders(path)
    if not runs:
        raise InvalidSource(f"{path}: not an MLflow file store (no <experiment>/<run>/meta.yaml with metrics/)")
    if len(runs) > 1:
        listed = ", ".join(str(r) for r in runs[:5])
        raise InvalidSource(f"{path}: {len(runs)} MLflow runs ({listed}); give one run's folder")
    folder = runs[0].resolve()
    # A file store's layout is <root>/<experiment-id>/<run-id>/.
    return folder.parent.parent.as_uri(), folder.name


@contextmanager
def _client(source: str | Path, tracking_uri: str | None) -> Iterator[Any]:
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise InvalidSource(f"{source}: {MISSING_CLIENT}") from None
    before = os.environ.get(_ALLOW_FILE_STORE)
    os.environ[_ALLOW_FILE_STORE] = "true"
    try:
        yield MlflowClient(tracking_uri=tracking_uri)
    except InvalidSource:
        raise
    except (MlflowException, OSError) as exc:  # the REST store wraps connection errors in MlflowException
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        raise InvalidSource(f"{source}: {message.splitlines()[0]}") from None
    finally:
        if before is None:
            os.environ.pop(_ALLOW_FILE_STORE, None)
        else:
            os.environ[_ALLOW_FILE_STORE] = before


def run_name(source: str | Path) -> str:
    """The run's name in MLflow (``run_name``), else its id."""
    tracking_uri, run_id = _locate(source)
    with _client(source, tracking_uri) as client:
        return client.get_run(run_id).info.run_name or run_id


def read(source: str | Path) -> Records:
    tracking_uri, run_id = _locate(source)
    steps: dict[int, dict[str, float]] = {}
    with _client(source, tracking_uri) as client:
        for key in sorted(client.get_run(run_id).data.metrics):
            history = client.get_metric_history(run_id, key)
            # A step logged twice keeps the later value, as MLflow's own "latest" does.
            for point in sorted(history, key=lambda m: (m.step, m.timestamp)):
                steps.setdefault(as_step(point.step, f"{source}: metric {key!r}"), {})[key] = point.value
    yield from sorted(steps.items())
