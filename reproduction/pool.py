"""The accelerator pool: campaign jobs as Ray tasks (issue 18, item 1).

:class:`RayBackend` is a campaign backend (:mod:`moeproxy.reproduction.campaign`): ``map`` submits
every job as one Ray task and yields each result as it finishes, in whatever order the pool
finishes them. A task asks the pool for what its job needs:

- Ascend NPUs as Ray's ``NPU`` resource (Ray >= 2.10 knows it and sets ``ASCEND_RT_VISIBLE_DEVICES``
  for the task itself, as it sets ``CUDA_VISIBLE_DEVICES`` for GPUs),
- CUDA GPUs as ``num_gpus``,
- CPU threads as ``num_cpus`` (at least the engine's ``threads``, so two jobs never oversubscribe a
  node's cores).

How many accelerators a job takes comes from the caller: the resource planner applied to the proxy
(``accelerators_for``), which is the point of the method — a proxy needs fewer devices than the
original. ``address=None`` joins the cluster Ray itself finds (``RAY_ADDRESS``, or a running local
one) and otherwise starts a local instance for the campaign, with ``local_resources`` as its custom
resources: ``{"NPU": 2}`` on a CPU-only machine is how the tests run the NPU path without an NPU.

Ray is the ``[ray]`` extra; nothing here imports it until a campaign runs on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeproxy.reproduction.errors import ReproductionError

#: Ray's resource for each accelerator kind of ``JobInput.device`` (cpu asks for none).
ACCELERATOR_RESOURCE: dict[str, str | None] = {"npu": "NPU", "cuda": "GPU", "cpu": None}


class PoolError(ReproductionError, RuntimeError):
    """The pool cannot run the campaign (Ray missing, an unknown accelerator, a cluster that cannot
    ever hold one job)."""


@dataclass(frozen=True)
class RayBackend:
    """Campaign jobs as Ray tasks. ``accelerator`` overrides the resource the device kind implies
    (``"NPU"`` with ``device="cpu"`` runs the NPU scheduling path on a CPU-only machine)."""

    address: str | None = None
    accelerators_per_job: float = 1.0
    cpus_per_job: float = 1.0
    accelerator: str | None = None
    local_resources: Mapping[str, float] = field(default_factory=dict)
    local_cpus: int | None = None
    #: Refuse a job no node could ever hold instead of waiting forever; switch off on an autoscaling
    #: cluster (KubeRay), whose resources grow when tasks wait.
    check_capacity: bool = True
    name: str = "ray"

    def __post_init__(self) -> None:
        if not self.accelerators_per_job > 0 or not self.cpus_per_job > 0:
            raise PoolError("accelerators_per_job and cpus_per_job must be > 0")

    def task_options(self, device: str, engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What one job's task asks the pool for (``ray.remote(...).options(**this)``)."""
        kind = device.partition(":")[0]
        if kind not in ACCELERATOR_RESOURCE:
            raise PoolError(f"no pool resource for device {device!r}; known kinds: {', '.join(ACCELERATOR_RESOURCE)}")
        resource = self.accelerator or ACCELERATOR_RESOURCE[kind]
        threads = int((engine or {}).get("threads") or 1)
        options: dict[str, Any] = {"num_cpus": max(self.cpus_per_job, threads), "max_retries": 0}
        if resource == "GPU":
            options["num_gpus"] = self.accelerators_per_job
        elif resource is not None:
            options["resources"] = {resource: self.accelerators_per_job}
        return options

    def map(self, fn: Callable[[Any], Any], inputs: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        ray = _import_ray()
        started = self._connect(ray)
        try:
            if not inputs:
                return
            task = ray.remote(fn)
            options = [self.task_options(inp.device, inp.engine) for inp in inputs]
            if self.check_capacity:  # the nodes are read once; every distinct request is checked
                nodes = _node_resources(ray)
                for wants in {json.dumps(_wanted(o), sort_keys=True) for o in options}:
                    _check_fits(nodes, json.loads(wants))
            pending = {task.options(**o).remote(inp): i for i, (inp, o) in enumerate(zip(inputs, options, strict=True))}
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    try:
                        yield i, ray.get(ref)
                    except (ray.exceptions.RayTaskError, ray.exceptions.WorkerCrashedError,
                            ray.exceptions.NodeDiedError) as exc:
                        # The job's own failure (or its worker's death) fails that job only; the
                        # campaign records it and runs it again next time.
                        cause = getattr(exc, "cause", None)
                        yield i, cause if isinstance(cause, BaseException) else exc
        finally:
            if started:
                ray.shutdown()

    def _connect(self, ray) -> bool:
        """Join the pool; True when this call started a local instance (shut down afterwards)."""
        if ray.is_initialized():
            return False
        if self.address is not None:
            ray.init(address=self.address, log_to_driver=False)
            return True
        try:
            ray.init(address="auto", log_to_driver=False)  # RAY_ADDRESS or a running local cluster
        except ConnectionError:
            ray.init(num_cpus=self.local_cpus, resources=dict(self.local_resources) or None,
                     include_dashboard=False, log_to_driver=False)
        return True


def _wanted(options: Mapping[str, Any]) -> dict[str, float]:
    return {"CPU": options["num_cpus"], **({"GPU": options["num_gpus"]} if "num_gpus" in options else {}),
            **options.get("resources", {})}


def _node_resources(ray) -> list[dict[str, float]]:
    return [dict(n.get("Resources") or {}) for n in ray.nodes() if n.get("Alive")]


def _check_fits(nodes: Sequence[Mapping[str, float]], wants: Mapping[str, float]) -> None:
    """Refuse a job no node of the pool could ever hold, instead of waiting for it forever: Ray
    places a task on one node, so a request that only the cluster's sum could meet never runs."""
    if any(all(node.get(k, 0.0) >= v for k, v in wants.items()) for node in nodes):
        return
    best = {k: max((node.get(k, 0.0) for node in nodes), default=0.0) for k in wants}
    raise PoolError(f"the pool cannot hold one job: it asks one node for "
                    f"{', '.join(f'{k} {v:g}' for k, v in wants.items())}; the largest node has "
                    f"{', '.join(f'{k} {best[k]:g}' for k in wants)} ({len(nodes)} nodes alive)")


def accelerators_for(proxy_dir: str | Path) -> int:
    """Accelerators one reproduction of a proxy needs: the planner's device count for it, from its
    ``proxy_report.json`` (the builder writes the planner's estimate there), at least 1."""
    path = Path(proxy_dir) / "proxy_report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PoolError(f"{path}: cannot read the proxy report ({exc})") from None
    devices = ((report.get("memory") or {}).get("devices") or {}).get("proxy")
    if not isinstance(devices, int | float) or isinstance(devices, bool) or not math.isfinite(devices):
        raise PoolError(f"{path}: no memory.devices.proxy (the planner's device count) in the report")
    return max(1, math.ceil(devices))


def _import_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise PoolError("the ray campaign backend needs the [ray] extra: pip install 'moeproxy[ray]' "
                        "(from a checkout: pip install -e '.[ray]')") from None
    return ray
