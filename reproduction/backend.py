"""The backend interface of the reproduction engine, and the local torch backend.

A backend runs a fault and its healthy twin on a model for a set of seeds and returns the metric
traces plus a manifest.  Fault definitions (:mod:`.faults`) and metric names (:mod:`.metrics`)
do not depend on the backend, so a backend that drives verl on an accelerator pool can be added
to :data:`BACKENDS` without touching either.

Trace format (one file per run, JSON Lines): ``{"step": int, "values": {name: number}}`` per
line — the shape of the REST ingest body's ``steps`` — with NaN/±inf written as the JSON literals
``NaN``/``Infinity``/``-Infinity``.  Files: ``<fault>-seed<k>.jsonl`` and ``healthy-seed<k>.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from moeproxy.reproduction.config import EngineConfig
from moeproxy.reproduction.errors import InvalidManifest, UnknownBackend
from moeproxy.reproduction.faults import FaultSpec

MANIFEST_FORMAT = "moeproxy.reproduction.manifest/1"

#: on_step(run_label, seed, step, values) — progress and live streaming
StepListener = Callable[[str, int, int, dict[str, float]], None]


@dataclass(frozen=True)
class ModelSpec:
    path: str
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or Path(self.path).name

    def proxy_report(self) -> dict | None:
        f = Path(self.path) / "proxy_report.json"
        if not f.is_file():
            return None
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            return {"unreadable": str(f)}


@dataclass
class RunResult:
    """``traces[(label, seed)]`` with label ``healthy`` or the fault class; ``manifest`` as written."""

    traces: dict[tuple[str, int], list[dict]]
    manifest: dict[str, Any]
    files: dict[tuple[str, int], Path] = field(default_factory=dict)

    def trace(self, label: str, seed: int) -> list[dict]:
        return self.traces[(label, seed)]


class Backend(Protocol):
    name: str

    def run(
        self,
        model: ModelSpec,
        fault: FaultSpec,
        seeds: Sequence[int],
        steps: int,
        *,
        config: EngineConfig | None = None,
        device: str = "cpu",
        out_dir: str | Path | None = None,
        with_healthy: bool = True,
        on_step: StepListener | None = None,
        view: str = "verl",
    ) -> RunResult: ...


# --- trace files ----------------------------------------------------------------------------------------

def trace_filename(label: str, seed: int) -> str:
    return f"{label}-seed{seed}.jsonl"


def write_trace(path: str | Path, trace: Sequence[dict]) -> Path:
    path = Path(path)
    with path.open("w") as fh:
        for rec in trace:
            # allow_nan (the default) writes NaN / Infinity / -Infinity literals, which the service accepts
            fh.write(json.dumps({"step": int(rec["step"]), "values": rec["values"]}, allow_nan=True) + "\n")
    return path


def read_trace(path: str | Path) -> list[dict]:
    out = []
    with Path(path).open() as fh:
        for line in fh:
            if line.strip():
                out.append(json.loads(line))  # json reads NaN / Infinity literals back as floats
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def traces_equal(a: Sequence[dict], b: Sequence[dict], *, ignore_prefixes: Sequence[str] | None = None) -> bool:
    """Equal step for step on every computed metric (timings and memory excluded by default)."""
    from moeproxy.reproduction.metrics import NONDETERMINISTIC_PREFIXES

    skip = tuple(NONDETERMINISTIC_PREFIXES if ignore_prefixes is None else ignore_prefixes)
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b):
        if ra["step"] != rb["step"]:
            return False
        ka = {k for k in ra["values"] if not k.startswith(skip)}
        kb = {k for k in rb["values"] if not k.startswith(skip)}
        if ka != kb or not all(_same(ra["values"][k], rb["values"][k]) for k in ka):
            return False
    return True


# --- the local torch backend ------------------------------------------------------------------------------

def _versions() -> dict[str, str]:
    import torch
    import transformers

    from moeproxy import __version__ as moeproxy_version

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "moeproxy": moeproxy_version,
    }


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


class LocalTorchBackend:
    """Runs the in-process GRPO engine (:class:`~moeproxy.reproduction.engine.GRPOEngine`)."""

    name = "local"

    def run_one(
        self,
        model: ModelSpec,
        fault: FaultSpec,
        seed: int,
        steps: int,
        *,
        config: EngineConfig | None = None,
        device: str = "cpu",
        on_step: Callable[[int, dict[str, float]], None] | None = None,
    ) -> tuple[list[dict], dict[str, Any]]:
        """One run; returns its trace and its cost/description."""
        from moeproxy.reproduction.engine import GRPOEngine
        from moeproxy.reproduction.faults import make_injector

        t0 = time.perf_counter()
        engine = GRPOEngine(model.path, config=config, injector=make_injector(fault), seed=seed, device=device)
        t_load = time.perf_counter() - t0
        trace = engine.run(steps, on_step=on_step)
        wall = time.perf_counter() - t0
        step_times = [r["values"].get("timing_s/step", float("nan")) for r in trace]
        peaks = [r["values"].get("perf/peak_memory_mb", float("nan")) for r in trace]
        cost = {
            "wall_time_s": wall,
            "load_time_s": t_load,
            "step_time_s_median": _median(step_times),
            "peak_memory_mb": max(peaks) if peaks else float("nan"),
            "peak_memory_mb_median": _median(peaks),
            # CPU: peak RSS minus the RSS before the three copies were loaded (the run's own memory)
            "peak_memory_above_baseline_mb": (max(peaks) if peaks else float("nan")) - engine.baseline_rss_mb,
        }
        return trace, {"cost": cost, "model": engine.describe(), "device": engine.device}

    def run(
        self,
        model: ModelSpec,
        fault: FaultSpec,
        seeds: Sequence[int],
        steps: int,
        *,
        config: EngineConfig | None = None,
        device: str = "cpu",
        out_dir: str | Path | None = None,
        with_healthy: bool = True,
        on_step: StepListener | None = None,
        view: str = "verl",
    ) -> RunResult:
        """Each seed's fault run and healthy twin; traces (in memory and on disk) written as the
        framework ``view`` logs them (:mod:`moeproxy.reproduction.views`; ``raw`` keeps everything)."""
        from moeproxy.reproduction.errors import UnknownView
        from moeproxy.reproduction.views import VIEWS, project

        if view not in VIEWS:
            raise UnknownView(f"unknown view {view!r}; known: {sorted(VIEWS)}")
        config = config or EngineConfig()
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        out = Path(out_dir) if out_dir is not None else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        runs: list[tuple[str, FaultSpec]] = [(fault.fault_class, fault)]
        if with_healthy and fault.fault_class != "healthy":
            runs.append(("healthy", FaultSpec("healthy")))
        traces: dict[tuple[str, int], list[dict]] = {}
        files: dict[tuple[str, int], Path] = {}
        per_run = []
        described: dict[str, Any] = {}
        for seed in seeds:
            for label, spec in runs:
                listener = None
                if on_step is not None:
                    listener = lambda k, v, _l=label, _s=seed: on_step(_l, _s, k, v)
                trace, info = self.run_one(model, spec, seed, steps, config=config, device=device, on_step=listener)
                described = info
                trace = project(trace, view)
                traces[(label, seed)] = trace
                per_run.append({"run": label, "seed": seed, **info["cost"]})
                if out is not None:
                    files[(label, seed)] = write_trace(out / trace_filename(label, seed), trace)
        dev = described.get("device")
        manifest = {
            "format": MANIFEST_FORMAT,
            "backend": self.name,
            "created_at": started.isoformat(),
            "model": {"path": str(Path(model.path).resolve()), "name": model.label, **described.get("model", {})},
            "proxy_report": model.proxy_report(),
            "fault": fault.to_dict(),
            "seeds": [int(s) for s in seeds],
            "steps": int(steps),
            "with_healthy": bool(with_healthy),
            "view": view,
            "engine": config.to_dict(),
            "device": {"requested": device, "kind": dev.kind, "name": dev.name} if dev else {"requested": device},
            "threads": int(config.threads),
            "versions": _versions(),
            "host": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
            "traces": {f"{label}-seed{seed}": trace_filename(label, seed) for (label, seed) in traces},
            "cost": {
                "wall_time_s": time.perf_counter() - t0,
                "peak_memory_mb": max((r["peak_memory_mb"] for r in per_run), default=float("nan")),
                "step_time_s_median": _median([r["step_time_s_median"] for r in per_run]),
                "runs": per_run,
            },
        }
        if out is not None:
            (out / "manifest.json").write_text(json.dumps(manifest, indent=2, allow_nan=True) + "\n")
        return RunResult(traces, manifest, files)


BACKENDS: dict[str, Callable[[], Backend]] = {"local": LocalTorchBackend}


def get_backend(name: str = "local") -> Backend:
    try:
        return BACKENDS[name]()
    except KeyError:
        raise UnknownBackend(f"unknown backend {name!r}; known: {sorted(BACKENDS)}") from None


# --- manifests ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunRequest:
    """Everything needed to run again what a manifest describes."""

    model: ModelSpec
    fault: FaultSpec
    seeds: tuple[int, ...]
    steps: int
    config: EngineConfig
    device: str
    backend: str
    with_healthy: bool
    view: str = "verl"


def load_manifest(path: str | Path) -> RunRequest:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidManifest(f"cannot read manifest {path}: {exc}") from exc
    if data.get("format") != MANIFEST_FORMAT:
        raise InvalidManifest(f"{path}: format {data.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    try:
        return RunRequest(
            model=ModelSpec(data["model"]["path"], data["model"].get("name")),
            fault=FaultSpec.from_dict(data["fault"]),
            seeds=tuple(int(s) for s in data["seeds"]),
            steps=int(data["steps"]),
            config=EngineConfig.from_dict(data["engine"]),
            device=str(data.get("device", {}).get("requested", "cpu")),
            backend=str(data.get("backend", "local")),
            with_healthy=bool(data.get("with_healthy", True)),
            view=str(data.get("view", "verl")),
        )
    except (KeyError, TypeError) as exc:
        raise InvalidManifest(f"{path}: missing or malformed field {exc}") from exc
