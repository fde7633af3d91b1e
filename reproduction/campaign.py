"""Fingerprint campaigns: which fault runs make a library, and running them on any backend.

A campaign is data (this module imports no torch until a job runs): fault entries (class, variant,
parameters, an onset rule) × seeds, for a number of steps, under one engine configuration. It
expands into :class:`CampaignJob` s, one GRPO run each; every seed's healthy run is a job too
(it is the twin of every fault run of that seed: the engine is deterministic on CPU for a seed).

:func:`run_job` is the unit any backend runs: a pure function of (model, engine config, fault
spec, seed, steps) that returns the run's raw trace (everything the engine recorded; a framework
view is projected by whoever reads it). :func:`run_campaign` drives a backend over the jobs and
keeps the campaign directory::

    OUT/manifest.json                         every job: spec, seed, onset, state, wall time, trace hash
    OUT/<split>/<entry slug>/manifest.json    a reproduction-style manifest per entry (seeds, onsets)
    OUT/<split>/<entry slug>/<class>-seed<k>.jsonl

``split`` is ``library`` (the seeds the fingerprints are built from) or ``heldout`` (calibration).
A finished job is never rerun: the manifest is rewritten after each job, so a campaign stopped at
any point picks up where it stopped. A mid-run onset is drawn from the job's own key and seed
(SHA-256, not Python's salted ``hash``) and recorded, so a resumed campaign draws the same step.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from moeproxy.reproduction.catalogue import FAULT_CLASSES, variant_kind
from moeproxy.reproduction.errors import ReproductionError, UnknownBackend

CAMPAIGN_FORMAT = "moeproxy.reproduction.campaign/1"
SPLITS = ("library", "heldout")

#: A code bug's mid-run onset is drawn from this fraction of the run (issue 20: 20-60%).
MID_RUN = (0.2, 0.6)


class CampaignError(ReproductionError, ValueError):
    """A campaign that cannot be run (bad file, unknown class, a directory of another campaign)."""


# --- the data model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OnsetRule:
    """When a fault starts: at a fixed step, or at a step drawn per seed from a fraction of the run."""

    step: int | None = 0
    within: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if (self.step is None) == (self.within is None):
            raise CampaignError("an onset is either a step or a range of fractions of the run, not both")
        if self.step is not None and self.step < 0:
            raise CampaignError(f"onset {self.step}: must be >= 0")
        if self.within is not None:
            lo, hi = self.within
            if not 0.0 <= lo <= hi < 1.0:
                raise CampaignError(f"onset range {self.within}: needs 0 <= from <= to < 1")

    def resolve(self, key: str, seed: int, steps: int) -> int:
        """The onset step of one run; a drawn one depends only on (key, seed, steps)."""
        if self.step is not None:
            return self.step
        lo, hi = (int(round(f * steps)) for f in self.within)
        digest = hashlib.sha256(f"{key}|seed={seed}|steps={steps}".encode()).digest()
        return lo + int.from_bytes(digest[:8], "big") % (hi - lo + 1)

    @property
    def label(self) -> str:
        if self.step is not None:
            return f"onset-{self.step}"
        return f"onset-{round(self.within[0] * 100)}to{round(self.within[1] * 100)}pct"

    def to_json(self) -> int | list[float]:
        return self.step if self.step is not None else list(self.within)

    @classmethod
    def from_json(cls, value: Any) -> OnsetRule:
        if value == "mid":
            return cls(step=None, within=MID_RUN)
        if isinstance(value, bool):
            raise CampaignError(f"onset {value!r}: a step, [from, to] fractions of the run, or 'mid'")
        if isinstance(value, int):
            return cls(step=value)
        if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int | float) for v in value):
            return cls(step=None, within=(float(value[0]), float(value[1])))
        raise CampaignError(f"onset {value!r}: a step, [from, to] fractions of the run, or 'mid'")


@dataclass(frozen=True)
class FaultEntry:
    """One (class, variant, parameters, onset rule) of a campaign: one fingerprint once run."""

    fault_class: str
    variant: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    onset: OnsetRule = OnsetRule(0)
    #: Seeds of this entry when it needs more than the campaign's (classes confused with each other).
    seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.fault_class not in FAULT_CLASSES:
            raise CampaignError(f"unknown fault class {self.fault_class!r} (SPEC section 3)")
        variants = FAULT_CLASSES[self.fault_class].variants
        variant = self.variant or variants[0]
        if variant not in variants:
            raise CampaignError(f"{self.fault_class} has no variant {variant!r}; variants: {list(variants)}")
        object.__setattr__(self, "variant", variant)
        if "onset" in self.params or "variant" in self.params:
            raise CampaignError(f"{self.fault_class}: give onset and variant as fields, not parameters")
        if self.kind == "configuration" and self.onset != OnsetRule(0):
            raise CampaignError(
                f"{self.fault_class}/{variant} is a configuration fault: it is there from step 0 (onset 0 only)")

    @property
    def kind(self) -> str:
        return variant_kind(self.fault_class, self.variant)

    @property
    def slug(self) -> str:
        if self.fault_class == "healthy":
            return "healthy"
        params = "_".join(f"{k}-{v}" for k, v in sorted(self.params.items()))
        parts = [self.fault_class, self.variant, params, "" if self.kind == "configuration" else self.onset.label]
        return re.sub(r"[^A-Za-z0-9_.=-]+", "-", "__".join(p for p in parts if p))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fault_class": self.fault_class, "variant": self.variant, "params": dict(self.params),
                             "onset": self.onset.to_json()}
        if self.seeds is not None:
            d["seeds"] = list(self.seeds)
        return d


HEALTHY = FaultEntry("healthy")


@dataclass(frozen=True)
class CampaignJob:
    """One GRPO run of a campaign: an entry, a seed, a length, and the split it serves."""

    entry: FaultEntry
    seed: int
    steps: int
    split: str = "library"

    @property
    def id(self) -> str:
        return f"{self.split}/{self.entry.slug}/seed{self.seed}"

    @property
    def onset(self) -> int | None:
        """The step the fault starts at (drawn from the seed for a mid-run rule); None when healthy."""
        if self.entry.fault_class == "healthy":
            return None
        return self.entry.onset.resolve(self.entry.slug, self.seed, self.steps)

    def fault(self) -> dict[str, Any]:
        """The fault as the engine takes it (``FaultSpec.from_dict``): a code bug gets its onset."""
        params = dict(self.entry.params)
        if self.entry.kind == "code" and self.entry.fault_class != "healthy":
            params["onset"] = self.onset
        return {"class": self.entry.fault_class, "variant": self.entry.variant, "params": params}


@dataclass(frozen=True)
class Campaign:
    """Fault entries × seeds × steps; ``jobs()`` lists every run, healthy twins first."""

    entries: tuple[FaultEntry, ...]
    steps: int = 120
    seeds: tuple[int, ...] = (0, 1)
    heldout_seeds: tuple[int, ...] = ()
    #: Engine options of every run (``EngineConfig`` fields), on top of the model's own RL setting.
    engine: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.steps < 8:
            raise CampaignError("a campaign needs at least 8 steps per run")
        if not self.seeds:
            raise CampaignError("a campaign needs at least one library seed")
        if set(self.seeds) & set(self.heldout_seeds):
            raise CampaignError("held-out seeds must differ from the library seeds")
        slugs = [e.slug for e in self.entries]
        dup = sorted({s for s in slugs if slugs.count(s) > 1})
        if dup:
            raise CampaignError(f"entries given twice: {', '.join(dup)}")

    def jobs(self) -> list[CampaignJob]:
        entries = [HEALTHY, *(e for e in self.entries if e.fault_class != "healthy")]
        # Every seed any entry uses needs its healthy twin.
        extra = sorted({s for e in entries if e.seeds for s in e.seeds} - set(self.seeds))
        out = []
        for split, seeds in (("library", self.seeds), ("heldout", self.heldout_seeds)):
            for entry in entries:
                if entry is HEALTHY:
                    own = tuple(seeds) + (tuple(extra) if split == "library" else ())
                else:
                    own = entry.seeds if (entry.seeds is not None and split == "library") else seeds
                out += [CampaignJob(entry, int(s), self.steps, split) for s in own]
        return out

    def override(self, *, classes: Sequence[str] | None = None, steps: int | None = None,
                 seeds: Sequence[int] | None = None, heldout_seeds: Sequence[int] | None = None) -> Campaign:
        if classes is not None:
            unknown = set(classes) - set(FAULT_CLASSES)
            if unknown:
                raise CampaignError(f"unknown fault classes: {', '.join(sorted(unknown))}")
        entries = self.entries if classes is None else tuple(e for e in self.entries if e.fault_class in classes)
        return replace(self, entries=entries, steps=steps or self.steps,
                       seeds=tuple(seeds) if seeds is not None else self.seeds,
                       heldout_seeds=tuple(heldout_seeds) if heldout_seeds is not None else self.heldout_seeds)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "seeds": list(self.seeds), "heldout_seeds": list(self.heldout_seeds),
                "engine": dict(self.engine), "faults": [e.to_dict() for e in self.entries]}


def load_campaign(path: str | Path) -> Campaign:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CampaignError(f"{path}: cannot read campaign ({exc})") from None
    try:
        return campaign_from_dict(doc)
    except CampaignError as exc:
        raise CampaignError(f"{path}: {exc}") from None


def campaign_from_dict(doc: Any) -> Campaign:
    """A campaign file: ``{"steps", "seeds", "heldout_seeds", "engine", "faults": [...]}``.

    A fault is ``{"fault_class", "variant"?, "params"?, "onset"?, "seeds"?}``, ``onset`` a step, a
    ``[from, to]`` range of fractions of the run, or ``"mid"`` (20-60%). The first format's
    ``"jobs"`` list (variant and onset among the parameters) is read too.
    """
    if not isinstance(doc, Mapping):
        raise CampaignError("a campaign is a JSON object")
    items = doc.get("faults", doc.get("jobs"))
    if not isinstance(items, list):
        raise CampaignError("a campaign needs a 'faults' list")
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("fault_class"), str):
            raise CampaignError(f"faults[{i}]: needs 'fault_class'")
        params = dict(item.get("params") or {})
        variant = item.get("variant", params.pop("variant", None))
        onset = item.get("onset", params.pop("onset", 0))
        seeds = item.get("seeds")
        try:
            entries.append(FaultEntry(item["fault_class"], variant, params, OnsetRule.from_json(onset),
                                      None if seeds is None else tuple(int(s) for s in seeds)))
        except (CampaignError, TypeError, ValueError) as exc:
            raise CampaignError(f"faults[{i}]: {exc}") from None
    kwargs: dict[str, Any] = {}
    if "steps" in doc:
        kwargs["steps"] = int(doc["steps"])
    for k in ("seeds", "heldout_seeds"):
        if k in doc:
            kwargs[k] = tuple(int(s) for s in doc[k])
    if "engine" in doc:
        if not isinstance(doc["engine"], Mapping):
            raise CampaignError("'engine' is an object of engine options")
        kwargs["engine"] = dict(doc["engine"])
    return Campaign(tuple(entries), **kwargs)


#: Classes whose runs are confused with each other today: a third seed each (issue 20).
CONFUSED_CLASSES = ("rollout_logp_precision", "operator_numeric_noise", "stale_weight_sync",
                    "routing_mismatch", "router_corruption")

#: A second magnitude for the variants that take one: far enough from the default that a class
#: matches a production fault of either size (or in between).
SECOND_MAGNITUDE = 3.0


def default_campaign(*, steps: int = 120, seeds: Sequence[int] = (0, 1),
                     confused_seeds: Sequence[int] = (0, 1, 2)) -> Campaign:
    """Every variant of every class (SPEC section 3): code bugs at onset 0 and at a mid-run onset,
    configuration faults at onset 0; a second magnitude where a variant takes one."""
    entries = []
    for name, fc in FAULT_CLASSES.items():
        if name == "healthy":
            continue
        own_seeds = tuple(confused_seeds) if name in CONFUSED_CLASSES else None
        for variant in fc.variants:
            sizes: list[dict[str, Any]] = [{}]
            second = scaled_params(name, variant, SECOND_MAGNITUDE)
            if second:
                sizes.append(second)
            for params in sizes:
                for onset in onset_rules(name, variant):
                    entries.append(FaultEntry(name, variant, params, onset, own_seeds))
    return Campaign(tuple(entries), steps=steps, seeds=tuple(seeds))


def onset_rules(fault_class: str, variant: str | None) -> tuple[OnsetRule, ...]:
    """When a variant's fault starts in a campaign: a configuration fault is there from step 0 (as
    in production, where a wrong setting is set before the run); a code bug at step 0 and at a
    mid-run onset drawn per job (a bug can also arrive with a code change mid-run)."""
    if variant_kind(fault_class, variant) == "configuration":
        return (OnsetRule(0),)
    return (OnsetRule(0), OnsetRule(step=None, within=MID_RUN))


def scaled_params(fault_class: str, variant: str | None, factor: float) -> dict[str, Any]:
    """The variant's default magnitude times ``factor`` as fault params ({} for a variant without one)."""
    from moeproxy.reproduction.faults import injector_class  # the injectors' defaults (torch)

    defaults = injector_class(fault_class, variant).defaults
    return {"magnitude": _scaled(defaults["magnitude"], factor)} if "magnitude" in defaults else {}


def _scaled(value: Any, factor: float) -> Any:
    # A fraction (of rows, of layers) stays below 1; a count stays an integer.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, int):
        return int(value * factor)
    scaled = value * factor
    return round(min(scaled, 0.9), 4) if value < 1.0 and scaled >= 1.0 else round(scaled, 6)


# --- one job ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobInput:
    """Everything a worker needs to run one job; plain data, so a backend can ship it anywhere."""

    model_path: str
    engine: Mapping[str, Any]
    fault: Mapping[str, Any]
    seed: int
    steps: int
    device: str = "cpu"


@dataclass(frozen=True)
class JobOutput:
    trace: list[dict]
    cost: dict[str, Any]
    model: dict[str, Any]


def run_job(job: JobInput) -> JobOutput:
    """Run one job: the raw trace of a GRPO run of ``job.fault`` (a pure function of the input)."""
    from moeproxy.reproduction.backend import LocalTorchBackend, ModelSpec
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.faults import FaultSpec

    trace, info = LocalTorchBackend().run_one(
        ModelSpec(job.model_path), FaultSpec.from_dict(job.fault), job.seed, job.steps,
        config=EngineConfig.from_dict(dict(job.engine)), device=job.device)
    return JobOutput(trace, {**info["cost"], "threads": int(job.engine.get("threads", 1))}, info["model"])


# --- backends ---------------------------------------------------------------------------------------


class CampaignBackend(Protocol):
    """Runs ``fn`` over job inputs, yielding ``(index, output or exception)`` as each finishes."""

    name: str

    def map(self, fn: Callable[[JobInput], JobOutput],
            inputs: Sequence[JobInput]) -> Iterator[tuple[int, JobOutput | BaseException]]: ...


#: What a job's own failure raises (recorded on the job, retried on the next run); anything else is
#: the driver's failure and stops the campaign.
JOB_FAILURES: tuple[type[BaseException], ...] = (ReproductionError, RuntimeError, ValueError)


class InProcessBackend:
    """One job after the other in this process (the CPU default: each job uses the engine's threads)."""

    name = "local"

    def map(self, fn, inputs):
        for i, inp in enumerate(inputs):
            try:
                yield i, fn(inp)
            except JOB_FAILURES as exc:
                yield i, exc


class ProcessPoolBackend:
    """Jobs side by side in ``workers`` local processes, each with ``threads`` threads.

    The proxies are small: a job's matrices are too small to keep two threads busy, so on a
    two-core machine two one-thread jobs side by side finish in about the wall time of one
    two-thread job (measured: 11.4 and 11.6 s against 11.0 s for 12 steps). The thread count is
    an execution setting (it changes the order of float sums, not the run), so the backend sets it
    per job and the manifest records it per job.
    """

    name = "processes"

    def __init__(self, workers: int | None = None, threads: int = 1):
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.threads = max(1, int(threads))

    def inputs_for(self, inputs: Sequence[JobInput]) -> list[JobInput]:
        return [replace(inp, engine={**inp.engine, "threads": self.threads}) for inp in inputs]

    def map(self, fn, inputs):
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        # spawn, not fork: a forked child inherits the parent's torch thread pool and locks.
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
        try:
            pending = {pool.submit(fn, inp): i for i, inp in enumerate(self.inputs_for(inputs))}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    exc = fut.exception()
                    # A broken pool (a killed worker) is the driver's failure, not the job's.
                    if isinstance(exc, BrokenProcessPool) or (
                            exc is not None and not isinstance(exc, JOB_FAILURES)):
                        raise exc
                    yield i, exc if exc is not None else fut.result()
        finally:
            # Stopped early (a driver failure, or the caller left the loop): the jobs not started
            # are dropped, not run to the end; the running ones finish, their results unread.
            pool.shutdown(wait=True, cancel_futures=True)


def _ray_backend() -> CampaignBackend:
    from moeproxy.reproduction.pool import RayBackend  # the pool module imports ray only when it runs

    return RayBackend()


#: name -> backend factory. ``ray`` with its defaults (the cluster Ray finds, else a local one);
#: pass a configured ``pool.RayBackend`` for accelerators per job or an address.
CAMPAIGN_BACKENDS: dict[str, Callable[[], CampaignBackend]] = {
    "local": InProcessBackend, "processes": ProcessPoolBackend, "ray": _ray_backend}


def get_campaign_backend(backend: str | CampaignBackend) -> CampaignBackend:
    if not isinstance(backend, str):
        return backend
    try:
        return CAMPAIGN_BACKENDS[backend]()
    except KeyError:
        raise UnknownBackend(f"unknown campaign backend {backend!r}; known: {sorted(CAMPAIGN_BACKENDS)}") from None


# --- the driver -------------------------------------------------------------------------------------


@dataclass
class CampaignResult:
    out: Path
    manifest: dict[str, Any]
    ran: list[str]
    skipped: list[str]
    failed: dict[str, str]

    def entry_dirs(self, split: str) -> list[Path]:
        """The per-entry trace directories of a split, healthy first (``load_trace_dir`` reads them)."""
        seen: dict[str, Path] = {}
        for j in self.manifest["jobs"]:
            if j["split"] == split and j["state"] == "finished":
                seen.setdefault(j["entry"], self.out / split / j["entry"])
        return sorted(seen.values(), key=lambda p: (p.name != "healthy", p.name))


def run_campaign(model: str | Path, jobs: Sequence[CampaignJob], engine_config: Any, out: str | Path, *,
                 backend: str | CampaignBackend = "local", device: str = "cpu", progress: bool = True,
                 on_job: Callable[[CampaignJob, dict[str, Any]], None] | None = None) -> CampaignResult:
    """Run every job not finished yet in ``out`` and keep ``out/manifest.json`` current.

    ``engine_config`` is an ``EngineConfig`` or a dict of its fields. A directory that holds a
    campaign of another model or engine configuration is refused rather than mixed into.
    """
    from moeproxy.reproduction.config import EngineConfig

    config = engine_config if isinstance(engine_config, EngineConfig) else EngineConfig.from_dict(dict(engine_config))
    engine = config.to_dict()
    model_path = str(Path(model).resolve())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out)
    if manifest is None:
        manifest = {"format": CAMPAIGN_FORMAT, "created_at": _now(), "model": {"path": model_path,
                    "weights_sha256": weights_hash(Path(model_path))}, "engine": engine, "device": device,
                    "host": {"platform": platform.platform(), "cpu_count": os.cpu_count()}, "jobs": []}
    else:
        _check_same_campaign(out, manifest, model_path, engine)
        manifest["model"]["path"] = model_path  # the same weights, wherever they are now
    impl = get_campaign_backend(backend)
    manifest["backend"] = impl.name
    records = {j["id"]: j for j in manifest["jobs"]}
    plan = {j.id: j for j in jobs}
    if len(plan) != len(jobs):
        raise CampaignError("the job list names a job twice")
    for job in jobs:  # every job listed from the start, so the manifest says what is still to run
        rec = records.get(job.id)
        if rec is None or rec["fault"] != job.fault() or rec["steps"] != job.steps:
            records[job.id] = _record(job)
    manifest["jobs"] = list(records.values())
    todo = [j for j in jobs if not _finished(out, records[j.id])]
    skipped = [j.id for j in jobs if j not in todo]
    _write_manifest(out, manifest)
    # An entry's manifest is what readers of its directory need (load_trace_dir); finished traces
    # restored from elsewhere (a committed copy) arrive without it.
    for job in {(j.split, j.entry.slug): j for j in jobs if j not in todo}.values():
        if not (out / job.split / job.entry.slug / "manifest.json").exists():
            _write_entry_manifest(out, job, manifest)

    inputs = [JobInput(model_path, engine, j.fault(), j.seed, j.steps, device) for j in todo]
    ran: list[str] = []
    failed: dict[str, str] = {}
    with _progress(progress, len(todo)) as advance:
        for i, result in impl.map(run_job, inputs):
            job = todo[i]
            rec = records[job.id]
            if isinstance(result, BaseException):
                rec.update(state="failed", error=f"{type(result).__name__}: {result}", finished_at=_now())
                failed[job.id] = rec["error"]
            else:
                path = _write_trace(out, job, result.trace)
                rec.update(state="finished", error=None, finished_at=_now(), trace=str(path.relative_to(out)),
                           trace_sha256=_sha256(path), wall_time_s=round(result.cost["wall_time_s"], 3),
                           step_time_s_median=round(result.cost["step_time_s_median"], 4),
                           peak_memory_mb=round(result.cost["peak_memory_mb"], 1),
                           threads=result.cost.get("threads"))
                manifest.setdefault("model_description", result.model)
                _write_entry_manifest(out, job, manifest)
                ran.append(job.id)
            manifest["updated_at"] = _now()
            _write_manifest(out, manifest)
            if on_job is not None:
                on_job(job, rec)
            advance(job.id)
    return CampaignResult(out, manifest, ran, skipped, failed)


def _record(job: CampaignJob) -> dict[str, Any]:
    return {"id": job.id, "split": job.split, "entry": job.entry.slug, "fault_class": job.entry.fault_class,
            "variant": job.entry.variant, "kind": job.entry.kind, "onset_rule": job.entry.onset.to_json(),
            "onset": job.onset, "seed": job.seed, "steps": job.steps, "fault": job.fault(),
            "state": "pending", "error": None, "trace": None, "trace_sha256": None, "wall_time_s": None}


def _finished(out: Path, rec: Mapping[str, Any]) -> bool:
    if rec.get("state") != "finished" or not rec.get("trace"):
        return False
    path = out / rec["trace"]
    return path.is_file() and _sha256(path) == rec.get("trace_sha256")


def _check_same_campaign(out: Path, manifest: Mapping[str, Any], model_path: str, engine: Mapping[str, Any]) -> None:
    known = manifest.get("model", {})
    if known.get("path") != model_path and not (known.get("weights_sha256")
                                                and weights_hash(model_path) == known["weights_sha256"]):
        raise CampaignError(f"{out} holds a campaign of the model {known.get('path')}, not of {model_path} "
                            "(other weights); give another output directory")
    if manifest.get("engine") != engine:
        changed = sorted(k for k in set(engine) | set(manifest.get("engine", {}))
                         if engine.get(k) != manifest.get("engine", {}).get(k))
        raise CampaignError(f"{out} holds a campaign run with other engine settings ({', '.join(changed)}); "
                            "give another output directory")


def _trace_path(out: Path, job: CampaignJob) -> Path:
    return out / job.split / job.entry.slug / f"{job.entry.fault_class}-seed{job.seed}.jsonl"


def _write_trace(out: Path, job: CampaignJob, trace: Sequence[dict]) -> Path:
    from moeproxy.reproduction.backend import write_trace

    path = _trace_path(out, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    write_trace(tmp, trace)
    os.replace(tmp, path)
    return path


#: What an entry's manifest (and so each fingerprint built from it) keeps of the proxy's report: which
#: proxy of which model made the runs. The per-layer clusters, the view-weight search and the memory
#: plan stay in the proxy's own proxy_report.json (40 KB, which a library of 74 fingerprints would
#: otherwise carry 74 times); ``sha256`` names that file.
PROXY_REPORT_KEYS = ("format_version", "source_model", "architecture", "method", "view_weights",
                     "view_weights_mode", "representative", "seed", "num_experts", "keep", "top_k", "moe_layers",
                     "group_routing", "config_changes", "calibration")


def proxy_report_summary(model_path: str | Path) -> dict[str, Any] | None:
    """The :data:`PROXY_REPORT_KEYS` of ``model_path/proxy_report.json`` and the file's SHA-256;
    None for a model that is not a proxy (no report)."""
    path = Path(model_path) / "proxy_report.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    return {**{k: report[k] for k in PROXY_REPORT_KEYS if k in report}, "sha256": _sha256(path)}


def _write_entry_manifest(out: Path, job: CampaignJob, manifest: Mapping[str, Any]) -> None:
    """The entry's directory as ``moeproxy reproduce`` would write it, plus each seed's onset."""
    from moeproxy.reproduction.backend import MANIFEST_FORMAT

    done = [r for r in manifest["jobs"] if r["entry"] == job.entry.slug and r["split"] == job.split
            and r["state"] == "finished"]
    params = dict(job.entry.params)
    doc = {
        "format": MANIFEST_FORMAT,
        "backend": f"campaign:{manifest.get('backend', 'local')}",
        "campaign": "../../manifest.json",
        "model": {**manifest.get("model", {}), **manifest.get("model_description", {})},
        "proxy_report": proxy_report_summary(manifest["model"]["path"]),
        "fault": {"class": job.entry.fault_class, "variant": job.entry.variant,
                  "family": FAULT_CLASSES[job.entry.fault_class].family, "params": params},
        "onset_rule": job.entry.onset.to_json() if job.entry.fault_class != "healthy" else None,
        "onsets": {str(r["seed"]): r["onset"] for r in done},
        "seeds": sorted(r["seed"] for r in done),
        "steps": job.steps,
        "with_healthy": False,
        "view": "raw",
        "engine": manifest.get("engine"),
        "traces": {f"{job.entry.fault_class}-seed{r['seed']}": Path(r["trace"]).name for r in done},
    }
    path = out / job.split / job.entry.slug / "manifest.json"
    _atomic_write(path, json.dumps(doc, indent=1, allow_nan=True) + "\n")


def _load_manifest(out: Path) -> dict[str, Any] | None:
    path = out / "manifest.json"
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CampaignError(f"{path}: cannot read the campaign manifest ({exc})") from None
    if doc.get("format") != CAMPAIGN_FORMAT:
        raise CampaignError(f"{path}: format {doc.get('format')!r}, expected {CAMPAIGN_FORMAT!r}")
    return doc


def _write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    _atomic_write(out / "manifest.json", json.dumps(manifest, indent=1, allow_nan=True) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    # A campaign can be stopped at any moment: never leave half a manifest behind.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_hash(model_dir: str | Path) -> str | None:
    """A checkpoint's identity: the SHA-256 over its weight files' names and contents, so the same
    weights under another path hash alike and a retrained model does not (None: no weight files)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(_sha256(f).encode())
    return h.hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar over the jobs still to run (nothing for ``progress=False``)."""
    if not (enabled and total):
        yield lambda job_id: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("campaign"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  TextColumn("{task.description}")) as bar:
        task = bar.add_task("", total=total)
        yield lambda job_id: bar.update(task, advance=1, description=job_id)
