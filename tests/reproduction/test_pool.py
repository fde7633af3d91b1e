"""The Ray campaign backend (issue 18, item 1): what a job asks the pool for, a real local Ray with
a custom ``NPU`` resource on this CPU-only machine, job failures kept to their job, and a campaign
on the pool equal to the same campaign in process."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from moeproxy.reproduction.pool import PoolError, RayBackend, accelerators_for

ray = pytest.importorskip("ray")


def test_a_job_asks_for_the_accelerator_its_device_implies():
    b = RayBackend(accelerators_per_job=2, cpus_per_job=1)
    assert b.task_options("npu") == {"num_cpus": 1, "max_retries": 0, "resources": {"NPU": 2}}
    assert b.task_options("npu:1") == {"num_cpus": 1, "max_retries": 0, "resources": {"NPU": 2}}
    assert b.task_options("cuda", {"threads": 4}) == {"num_cpus": 4, "max_retries": 0, "num_gpus": 2}
    assert b.task_options("cpu", {"threads": 2}) == {"num_cpus": 2, "max_retries": 0}
    # The NPU scheduling path on a CPU-only machine: the resource named, the device left as it is.
    assert RayBackend(accelerator="NPU").task_options("cpu")["resources"] == {"NPU": 1.0}
    with pytest.raises(PoolError, match="no pool resource for device 'tpu'"):
        b.task_options("tpu")
    with pytest.raises(PoolError, match="must be > 0"):
        RayBackend(accelerators_per_job=0)


def test_accelerators_come_from_the_planner_figure_in_the_proxy_report(tmp_path):
    (tmp_path / "proxy_report.json").write_text('{"memory": {"devices": {"original": 8, "proxy": 3}}}')
    assert accelerators_for(tmp_path) == 3
    (tmp_path / "proxy_report.json").write_text('{"memory": {}}')
    with pytest.raises(PoolError, match="memory.devices.proxy"):
        accelerators_for(tmp_path)
    with pytest.raises(PoolError, match="cannot read"):
        accelerators_for(tmp_path / "missing")


def test_without_ray_the_backend_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(PoolError, match=r"\[ray\] extra"):
        list(RayBackend().map(_probe, [_Input()]))


@dataclass(frozen=True)
class _Input:
    device: str = "cpu"
    engine: dict[str, Any] = field(default_factory=dict)
    fail: bool = False
    hold_s: float = 0.0


def _probe(inp: _Input) -> dict[str, Any]:
    """A job that reports where it ran (a module-level function: Ray pickles it by reference)."""
    if inp.fail:
        raise ValueError("injected failure")
    start = time.time()
    time.sleep(inp.hold_s)
    return {"visible": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), "pid": os.getpid(), "start": start,
            "end": time.time()}


@pytest.fixture(scope="module")
def local_pool():
    """A real local Ray instance with two NPUs that exist only as a resource (CPU-only machine)."""
    # More CPUs than NPUs, so the NPUs are what limits the jobs. The probe jobs live in this test
    # module: the workers need its folder on their path.
    here = os.path.dirname(__file__)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=4, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def test_npu_tasks_get_their_devices_and_the_pool_limits_how_many_run_at_once(local_pool):
    backend = RayBackend(accelerator="NPU", accelerators_per_job=1)
    results = dict(backend.map(_probe, [_Input(hold_s=1.0) for _ in range(3)]))
    assert sorted(results) == [0, 1, 2]
    assert {r["visible"] for r in results.values()} <= {"0", "1"}  # Ray set the NPU ids itself
    # Two NPUs, one per job: never three jobs at the same time.
    spans = sorted((r["start"], r["end"]) for r in results.values())
    overlapping_all = spans[2][0] < spans[0][1] and spans[2][0] < spans[1][1]
    assert not overlapping_all
    assert ray.is_initialized()  # a pool the caller started is left running


def test_a_failing_job_fails_alone(local_pool):
    backend = RayBackend()
    results = dict(backend.map(_probe, [_Input(), _Input(fail=True), _Input()]))
    assert isinstance(results[1], ValueError) and "injected failure" in str(results[1])
    assert all(isinstance(results[i], dict) for i in (0, 2))


def test_a_job_the_pool_can_never_hold_is_refused(local_pool):
    backend = RayBackend(accelerator="NPU", accelerators_per_job=3)
    with pytest.raises(PoolError, match="cannot hold one job: it asks one node for CPU 1, NPU 3; the largest "
                                        "node has CPU 4, NPU 2"):
        list(backend.map(_probe, [_Input()]))


def test_a_job_fits_only_where_one_node_holds_all_it_asks_for():
    from moeproxy.reproduction.pool import _check_fits

    two_small = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]
    _check_fits(two_small, {"CPU": 1.0, "GPU": 1.0})
    with pytest.raises(PoolError, match="largest node has CPU 8, GPU 1 \\(2 nodes alive\\)"):
        _check_fits(two_small, {"CPU": 1.0, "GPU": 2.0})  # the cluster's sum is 2, no node's is
    with pytest.raises(PoolError, match="0 nodes alive"):
        _check_fits([], {"CPU": 1.0})


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from repro_models import cached_warm_tiny, small_config


def test_a_campaign_on_the_pool_equals_the_same_campaign_in_process(local_pool, tmp_path_factory):
    from moeproxy.reproduction.backend import read_trace, traces_equal
    from moeproxy.reproduction.campaign import Campaign, FaultEntry, run_campaign

    torch.set_num_threads(1)
    warm = cached_warm_tiny(tmp_path_factory.getbasetemp() / "repro-models")
    jobs = Campaign((FaultEntry("gradient_overflow", "inject_nonfinite"),), steps=8, seeds=(0,)).jobs()
    here = run_campaign(warm, jobs, small_config(), tmp_path_factory.mktemp("local"), progress=False)
    pool = run_campaign(warm, jobs, small_config(), tmp_path_factory.mktemp("pool"), progress=False,
                        backend=RayBackend(accelerator="NPU"))
    assert sorted(pool.ran) == sorted(j.id for j in jobs) and not pool.failed
    assert pool.manifest["backend"] == "ray"
    for job in jobs:
        a = {r["id"]: r for r in here.manifest["jobs"]}[job.id]
        b = {r["id"]: r for r in pool.manifest["jobs"]}[job.id]
        assert traces_equal(read_trace(here.out / a["trace"]), read_trace(pool.out / b["trace"])), job.id
