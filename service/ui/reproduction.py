"""The reproduced traces beside the run (issue 18, item 5): the reproduction a job's re-triage
matched, read from the data directory and written in the run's own framework view, so that the
run page can draw it on the run's plots.

The worker records the trace it checked against the run (``result.consistency.reproduction``, a
file under the data directory the service shares with the workers). It is a proxy's run of the
job's length: it is drawn on its own steps, never stretched to the run's.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moeproxy.reproduction.views import VIEWS, project

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReproductionOverlay:
    job_id: int
    label: str  # the legend entry
    series: Mapping[str, tuple[list[int], list[float]]]  # the run's metric name -> (steps, values)


def _read_trace(path: Path) -> list[dict]:
    """The engine's raw trace (JSON lines; json reads its NaN / Infinity literals back as floats)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reproduction_overlay(jobs: Iterable, run_metrics: Mapping[str, str], *, framework: str | None, data_dir: Path,
                         canonical_of: Callable[[Sequence[str]], Mapping[str, str]]) -> ReproductionOverlay | None:
    """The newest job's checked reproduction as series keyed by the run's metric names.

    ``run_metrics``: the run's metric names -> their canonical names (the page has them already).
    ``canonical_of(names)`` maps the reproduction's names the same way (the project's aliases, for
    the run's framework), so that a reproduction metric meets the run's metric of the same meaning
    even where the names differ. None when no job holds a readable reproduction trace.
    """
    root = Path(data_dir).resolve()
    for job in jobs:  # newest first
        check = (job.result or {}).get("consistency") or {}
        if not check.get("reproduction"):
            continue
        path = Path(check["reproduction"]).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            # Only files the workers wrote into the shared data directory are read.
            log.info("job %s: reproduction trace %s is not in the data directory %s", job.id, path, root)
            continue
        view = framework if framework in VIEWS else "verl"
        try:
            records = project(_read_trace(path), view)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("job %s: unreadable reproduction trace %s: %s", job.id, path, exc)
            continue
        names = sorted({k for r in records for k in r["values"]})
        theirs = canonical_of(names)
        by_canonical = {theirs.get(n, n): n for n in names}
        series = {}
        for metric, canonical in run_metrics.items():
            source = metric if metric in names else by_canonical.get(canonical)
            if source is None:
                continue
            # Finite points only, as the run's own line (its NaN markers are the run's).
            points = [(int(r["step"]), float(r["values"][source])) for r in records
                      if isinstance(r["values"].get(source), int | float) and math.isfinite(r["values"][source])]
            series[metric] = ([s for s, _ in points], [v for _, v in points])
        return ReproductionOverlay(job.id, f"reproduction: job {job.id} (proxy)", series)
    return None
