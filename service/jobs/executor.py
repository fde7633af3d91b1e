"""The default job executor (``moeproxy worker``): what a reproduction job does (issue 18).

1. Resolve the run's ``model_uri`` to a checkpoint directory this worker can read.
2. Build (or reuse) the proxy, and size a reproduction by the planner's device count for it.
3. Reproduce every variant of the candidate classes on it (``service.loop.pipeline.run_loop``) on
   the Ray pool when Ray is installed (``reproduction.pool.RayBackend``: the cluster at
   ``--ray-address``/``MOEPROXY_RAY_ADDRESS``, ``RAY_ADDRESS``, or a local one), in process
   otherwise; each finished reproduction renews the lease, and a cancel stops the job there.
4. Record the layer (``library_layers``) and re-triage the run against the base library with the
   layer over it: the stored evaluation goes through the normal alert path, so a run that now
   matches strongly alerts like any other.

The result stored on the job: the layer's version, path and size, the re-triage's top class,
score, strength and verdict, and the cost (reproduction seconds, device-hours, the planner's
device counts for the proxy and the original).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from moeproxy.service.jobs.spec import JobOutcome, JobSpec
from moeproxy.service.loop import repository as layers
from moeproxy.service.loop.pipeline import LoopError, LoopSpec, model_key, proxy_for, run_loop
from moeproxy.service.runs.models import Run

log = logging.getLogger(__name__)


def resolve_model_uri(uri: str) -> Path:
    """A local checkpoint directory from a run's ``model_uri``: a path or a ``file://`` URI (shared
    storage every worker mounts). Remote schemes need the checkpoint copied first: refused by name."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else uri).expanduser()
        if not path.is_dir():
            raise LoopError(f"model_uri {uri!r}: no such directory on this worker")
        return path
    raise LoopError(f"model_uri {uri!r}: scheme {parsed.scheme!r} is not read by the workers; register a path "
                    "or file:// URI on shared storage the workers mount")


def _backend(ctx: Any, proxy: Path) -> tuple[Any, float]:
    """The Ray pool when Ray is installed (accelerators per reproduction from the planner), else in
    process (one reproduction after the other on this worker)."""
    from moeproxy.reproduction.pool import RayBackend, accelerators_for

    if importlib.util.find_spec("ray") is None:
        return "local", 1.0
    n = accelerators_for(proxy)
    accelerator = getattr(ctx.settings, "ray_accelerator", None)
    return RayBackend(address=ctx.ray_address, accelerators_per_job=n, accelerator=accelerator), float(n)


def execute(job: JobSpec, ctx: Any) -> JobOutcome:
    from moeproxy.service.triage.engine import SignatureEngine

    settings = ctx.settings
    root = Path(settings.data_dir)
    model_dir = resolve_model_uri(job.model_uri)
    engine_options = dict(job.grid.get("engine") or {}) if isinstance(job.grid, Mapping) else {}
    spec = LoopSpec(model_dir, tuple(job.classes), steps=job.steps, seeds=tuple(job.seeds),
                    keep_ratio=job.keep_ratio, method=job.method, engine=engine_options,
                    device=settings.job_device)
    engine = SignatureEngine(settings.fingerprints)  # one read of the base library per job
    ctx.heartbeat(progress={"stage": "proxy", "done": 0, "total": 1})
    key = model_key(model_dir)
    proxy = proxy_for(spec, root, key)
    backend, accelerators = _backend(ctx, proxy)
    outcome = run_loop(spec, root, engine.library, job_id=job.id, backend=backend, accelerators_per_job=accelerators,
                       key=key, on_progress=lambda p: ctx.heartbeat(progress=dict(p)))
    with ctx.database.scope() as session:
        layers.record_layer(session, project_id=job.project_id, model_uri=job.model_uri, model_key=outcome.model_key,
                            version=outcome.version, path=str(outcome.layer_dir), job_id=job.id,
                            fingerprints=outcome.fingerprints, strong_threshold=outcome.strong_threshold)
    engine.add_layer(str(outcome.layer_dir), outcome.layer)  # the path the re-triage finds recorded
    verdict = _retriage(ctx, job, engine)
    consistency = _consistency(ctx, job, outcome.layer, (verdict.get("retriage") or {}).get("fingerprint_id"))
    planner = dict(outcome.cost.get("planner_devices") or {})
    return JobOutcome(
        result={"library_version": outcome.version, "layer": str(outcome.layer_dir),
                "fingerprints": outcome.fingerprints, "strong_threshold": outcome.strong_threshold,
                "proxy": str(outcome.proxy_dir), "cost": dict(outcome.cost), "consistency": consistency,
                **verdict},
        device_hours=outcome.cost.get("device_hours"),
        planner_estimate={"devices": planner},
    )


def _retriage(ctx: Any, job: JobSpec, engine: Any) -> dict[str, Any]:
    """Evaluate the run again, now with its model's layer; stored like any evaluation (alerts)."""
    from moeproxy.service.triage import service as triage_service

    with ctx.database.scope() as session:
        run = session.get(Run, job.run_id)
        if run is None:  # deleted while the job ran: the layer stays for the model's next runs
            return {"retriage": None}
        result, alerts = triage_service.evaluate_run(session, run, engine, ctx.settings)
    top = result.candidates[0] if result.candidates else None
    return {"retriage": {"verdict": result.verdict, "top_class": top.fault_class if top else None,
                         "score": top.score if top else None, "strength": top.strength if top else None,
                         # the matched fingerprint, as the engine records it for the page
                         "fingerprint_id": ((result.details or {}).get("candidates", {}).get(top.fault_class) or {})
                         .get("fingerprint_id") if top else None,
                         "alerts": alerts}}


def _consistency(ctx: Any, job: JobSpec, layer: Any, fingerprint_id: str | None) -> dict[str, Any] | None:
    """Is the reproduction that the run now matches consistent with the run itself (the check the
    proxy method rests on, ``signatures.consistency``)? Its first seed's trace, read as verl logs it,
    against the run's stored metrics. None when the run's top fingerprint is not one of this job's."""
    from moeproxy.reproduction.views import project
    from moeproxy.service.metrics import repository as metrics
    from moeproxy.signatures.api import RunMetrics, consistency
    from moeproxy.signatures.errors import UnknownFaultClass

    if fingerprint_id is None:
        return None
    try:
        fp = layer.get(fingerprint_id)
    except UnknownFaultClass:  # the base library's: no reproduction of it in this job
        return None
    trace_dir, runs = fp.provenance.get("trace_dir"), fp.provenance.get("runs") or []
    if not trace_dir or not runs or not (Path(trace_dir) / runs[0]).exists():
        return None
    path = Path(trace_dir) / runs[0]
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    reproduction = RunMetrics.from_steps(project(records, "verl"), framework="verl", name=path.stem)
    with ctx.database.scope() as session:
        run = session.get(Run, job.run_id)
        if run is None:
            return None
        framework = run.framework
        production = metrics.read_run_metrics(session, run.id, framework=framework, name=job.run_name)
    report = consistency(reproduction, production, framework_a="verl", framework_b=framework)
    return {"verdict": report.verdict, "summary": report.summary, "reproduction": str(path),
            "direction_agreement": report.direction_agreement, "timing_agreement": report.timing_agreement}
