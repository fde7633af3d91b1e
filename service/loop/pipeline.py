"""The work of one closed-loop job (issue 18): a proxy of the run's model, reproductions of the
candidate faults on it, and the fingerprints they give, stored as a new library version layered
over the shipped library for that model.

The stages are composed here because the service is the one layer that may import them all
(proxy_builder -> reproduction -> signatures -> service). Every step reuses what is on disk:

- the proxy is keyed by the model's weights hash and the proxy spec (method, keep ratio), so a
  second job on the same model builds nothing;
- the reproductions are one resumable campaign per job directory (``run_campaign``: a job retried
  after its worker died reruns only the unfinished runs), on any campaign backend — the Ray pool
  (``reproduction.pool.RayBackend``) in production, in-process in a single-machine setup;
- a layer version is written once (``v<N>/``, N one above the newest), never rewritten.

Torch and the builder are imported when a job runs, not when the service starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.fingerprint import FingerprintLibrary, load_library, save_library

#: Under the service's data directory.
PROXIES = "proxies"
LIBRARIES = "libraries"
JOB_WORK = "jobs"


class LoopError(RuntimeError):
    """A job cannot go on (no model at its URI, a candidate class the catalogue lacks, nothing
    reproduced); the message says which and is stored as the job's error."""


@dataclass(frozen=True)
class LoopSpec:
    """What one job reproduces: on which model, which classes, how long, how many seeds, and the
    proxy to build. ``engine``: engine options over the defaults (``EngineConfig`` fields)."""

    model_dir: Path
    classes: tuple[str, ...]
    steps: int = 40
    seeds: tuple[int, ...] = (0, 1)
    keep_ratio: float = 0.5
    method: str = "three_view"
    calibration: str = "synthetic:tasks"
    device: str = "cpu"
    engine: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [c for c in self.classes if c not in FAULT_CLASSES or c == "healthy"]
        if unknown or not self.classes:
            raise LoopError(f"candidate classes must be fault classes of the catalogue; got {list(self.classes)}")
        if len(set(self.seeds)) < 2:
            raise LoopError("a job needs at least two seeds: the layer is calibrated leave-one-seed-out")


@dataclass(frozen=True)
class LoopOutcome:
    model_key: str
    proxy_dir: Path
    campaign_dir: Path
    version: int
    layer_dir: Path
    layer: FingerprintLibrary  # as written to layer_dir, so the caller need not read it back
    cost: Mapping[str, Any]

    @property
    def fingerprints(self) -> int:
        return len(self.layer.fingerprints)

    @property
    def strong_threshold(self) -> float:
        return self.layer.calibration.strong_threshold


def model_key(model_dir: Path) -> str:
    """A model's identity for proxies and layers: the campaign's weights hash, shortened for paths."""
    from moeproxy.reproduction.campaign import weights_hash

    digest = weights_hash(model_dir)
    if digest is None:
        raise LoopError(f"{model_dir}: no *.safetensors weights (the job's model_uri must name a checkpoint "
                        "directory the workers can read)")
    return digest[:16]


def proxy_for(spec: LoopSpec, root: Path, key: str) -> Path:
    """The proxy of ``spec``'s model: built once per (model, method, keep ratio), then reused."""
    out = root / PROXIES / f"{key}-{spec.method}-keep{spec.keep_ratio:g}"
    if (out / "proxy_report.json").exists():
        return out
    from moeproxy.proxy_builder.build import BuildRequest, build_proxy
    from moeproxy.reproduction.tasks import register_synthetic_calibration

    register_synthetic_calibration()
    build_proxy(BuildRequest(spec.model_dir, out, keep_ratio=spec.keep_ratio, method=spec.method,
                             calibration=spec.calibration, overwrite=True))
    return out


def candidate_jobs(spec: LoopSpec) -> list:
    """Every variant of each candidate class: a code bug at onset 0 and mid-run, a configuration
    fault at onset 0 (as campaign v2 runs them), each with every seed and its healthy twins."""
    from moeproxy.reproduction.campaign import Campaign, FaultEntry, onset_rules

    entries = [FaultEntry(name, variant, {}, onset) for name in spec.classes
               for variant in FAULT_CLASSES[name].variants for onset in onset_rules(name, variant)]
    return Campaign(tuple(entries), steps=spec.steps, seeds=tuple(spec.seeds)).jobs()


def build_layer(campaign_dir: Path, entry_dirs: Sequence[Path], base: FingerprintLibrary,
                *, generator: Mapping[str, Any]) -> tuple[FingerprintLibrary, dict]:
    """The fingerprints of a job's reproductions, calibrated leave-one-seed-out for the combination
    with ``base`` (the layer is read over it, ``FingerprintLibrary.layered``)."""
    from moeproxy.signatures.build import fingerprint_from_trace_set, load_trace_dir
    from moeproxy.signatures.calibrate import cross_validated_calibration

    twins = campaign_dir / "library" / "healthy"
    sets = [load_trace_dir(d, twins_from=twins) for d in entry_dirs]
    faults = [ts for ts in sets if ts.fault_class != "healthy"]
    if not faults:
        raise LoopError(f"{campaign_dir}: no finished fault reproduction to build fingerprints from")
    fps = tuple(fingerprint_from_trace_set(ts, source="proxy") for ts in faults)
    calibration, report = cross_validated_calibration(sets, base=base)
    return FingerprintLibrary(fps, base.params, calibration, dict(generator)), report


def next_version(root: Path, key: str) -> int:
    versions = [int(p.name[1:]) for p in (root / LIBRARIES / key).glob("v*") if p.name[1:].isdigit()]
    return max(versions, default=0) + 1


def layer_path(root: Path, key: str, version: int) -> Path:
    return root / LIBRARIES / key / f"v{version}"


def version_of_job(root: Path, key: str, job_id: Any) -> int | None:
    """The layer version a job wrote, if it wrote one (a job writes at most one)."""
    for p in sorted((root / LIBRARIES / key).glob("v*/manifest.json")):
        try:
            if json.loads(p.read_text()).get("job") == job_id:
                return int(p.parent.name[1:])
        except (OSError, ValueError):
            continue
    return None


def run_loop(spec: LoopSpec, root: Path, base: FingerprintLibrary, *, job_id: Any, backend: Any = "local",
             accelerators_per_job: float = 1.0, key: str | None = None,
             on_progress: Callable[[Mapping[str, Any]], None] | None = None) -> LoopOutcome:
    """Proxy, reproductions, layer: the whole work of one job, under ``root`` (the data directory).
    ``on_progress`` gets ``{"stage", "done", "total"}`` after each step and each reproduction (the
    worker's heartbeat and progress). ``key``: the model's ``model_key`` when the caller has it
    already (hashing a full checkpoint's weights takes a while)."""
    from moeproxy.reproduction.campaign import run_campaign
    from moeproxy.reproduction.config import EngineConfig

    def report(stage: str, done: int, total: int) -> None:
        if on_progress is not None:
            on_progress({"stage": stage, "done": done, "total": total})

    t0 = time.perf_counter()
    if not Path(spec.model_dir).is_dir():
        raise LoopError(f"model {spec.model_dir}: no such directory on this worker")
    key = key or model_key(spec.model_dir)
    report("proxy", 0, 1)
    proxy = proxy_for(spec, root, key)
    report("proxy", 1, 1)
    jobs = candidate_jobs(spec)
    work = root / JOB_WORK / str(job_id) / "campaign"
    finished = 0

    def on_job(job, record) -> None:
        nonlocal finished
        finished += record.get("state") == "finished"
        report("reproduce", finished, len(jobs))

    config = EngineConfig.from_dict({**EngineConfig().to_dict(), **dict(spec.engine)})
    result = run_campaign(proxy, jobs, config, work, backend=backend, device=spec.device, progress=False,
                          on_job=on_job)
    if result.failed:
        first = next(iter(result.failed.items()))
        raise LoopError(f"{len(result.failed)} of {len(jobs)} reproductions failed (first: {first[0]}: {first[1]})")
    report("fingerprints", 0, 1)
    generator = {"job": job_id, "model_key": key, "proxy": str(proxy), "campaign": str(work / "manifest.json"),
                 "created": datetime.now(UTC).isoformat(timespec="seconds")}
    done = version_of_job(root, key, job_id)
    if done is not None:  # a retried job whose earlier attempt already wrote its layer
        layer = load_library(layer_path(root, key, done))
        manifest = json.loads((layer_path(root, key, done) / "manifest.json").read_text())
        return LoopOutcome(key, proxy, work, done, layer_path(root, key, done), layer, manifest["cost"])
    layer, cal_report = build_layer(work, result.entry_dirs("library"), base, generator=generator)
    version = next_version(root, key)
    out = layer_path(root, key, version)
    runs_s = sum(float(j.get("wall_time_s") or 0.0) for j in result.manifest["jobs"])
    proxy_report = json.loads((proxy / "proxy_report.json").read_text())
    devices = (proxy_report.get("memory") or {}).get("devices") or {}
    cost = {"wall_time_s": round(time.perf_counter() - t0, 1), "reproduction_s": round(runs_s, 1),
            "device_hours": round(runs_s * accelerators_per_job / 3600, 4), "runs": len(jobs),
            "planner_devices": {"proxy": devices.get("proxy"), "original": devices.get("original")}}
    save_library(layer, out, manifest={"job": job_id, "model_key": key, "version": version,
                                       "model_dir": str(spec.model_dir), "proxy": str(proxy),
                                       "classes": list(spec.classes), "cost": cost,
                                       "calibration": {k: cal_report[k] for k in ("threshold", "balanced_accuracy")}})
    report("fingerprints", 1, 1)
    return LoopOutcome(key, proxy, work, version, out, layer, cost)


def latest_layer(root: Path, key: str) -> tuple[int, FingerprintLibrary] | None:
    """The newest layer version written for a model, or None."""
    version = next_version(root, key) - 1
    if version < 1:
        return None
    return version, load_library(layer_path(root, key, version))
