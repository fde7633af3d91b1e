"""The whole closed loop (issue 18, done when 1), on CPU with a real tiny MoE model: a run whose
fault class the service's library lacks ends weak, so a job is made automatically and Slack
hears that a reproduction started; the worker builds the proxy and runs the
candidate reproductions as tasks on a real local Ray whose only accelerators are a custom ``NPU``
resource; the layer it writes names the class, the run is re-triaged, now strong, and Slack hears
both the job's outcome and the strong match. The run page then shows the job with its consistency
verdict and the reproduction drawn beside the run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ray = pytest.importorskip("ray")
TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "reproduction"))
sys.path.insert(0, str(TESTS / "alerts"))

from fastapi.testclient import TestClient
from http_receiver import Receiver
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.jobs.worker import run_worker
from moeproxy.service.tokens import repository as tokens
from moeproxy.signatures.fingerprint import load_library, save_library
from repro_models import cached_warm_tiny
from waiting import wait_for

from moeproxy.config import Settings

CLASS = "stale_weight_sync"  # the rollout side keeps its first weights: no NaN, only a fingerprint names it
STEPS = 20
#: The options of repro_models.small_config: the deployment's engine options for every job.
ENGINE = {"tasks": ["counting", "brackets"], "max_new_tokens": 4, "lr": 1e-4, "lr_warmup_steps": 1,
          "prompts_per_step": 8, "group_size": 4, "ppo_mini_batch_size": 2}


def _production_run(model: Path, seed: int) -> list[dict]:
    """The user's run of the original model: the rollout engine never receives the trained weights."""
    from moeproxy.reproduction.campaign import CampaignJob, FaultEntry, JobInput, OnsetRule, run_job
    from moeproxy.reproduction.views import project
    from moeproxy.signatures.values import format_value

    job = CampaignJob(FaultEntry(CLASS, "skip_from_onset", {}, OnsetRule(0)), 0, STEPS)
    trace = project(run_job(JobInput(str(model), ENGINE, job.fault(), seed, STEPS)).trace, "verl")
    return [{"step": r["step"], "values": {k: format_value(v) for k, v in r["values"].items()}} for r in trace]


@pytest.fixture
def npu_pool():
    """A real local Ray with two NPUs that exist only as a resource (this machine has none)."""
    here = str(TESTS)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


@pytest.fixture
def service(fresh_database_url, tmp_path, tmp_path_factory, npu_pool):
    torch.set_num_threads(1)
    model = cached_warm_tiny(tmp_path_factory.getbasetemp() / "repro-models")
    base = save_library(load_library().without_class(CLASS), tmp_path / "base")
    receiver = Receiver()
    db = Database(fresh_database_url)
    settings = Settings(database_url=db.url, fingerprints=base, data_dir=tmp_path / "data", triage_interval_s=0,
                        slack_webhook_url=receiver.url, public_url="http://moeproxy.test",
                        job_min_steps=STEPS // 2, job_steps=STEPS, job_seeds=[0, 1], job_keep_ratio=0.5,
                        job_engine=ENGINE, ray_accelerator="NPU")
    app = create_app(settings, database=db)
    with db.scope() as s:
        _row, token = tokens.create_token(s, "loop")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client, db, settings, model, receiver
    receiver.close()
    db.dispose()


def _texts(receiver) -> list[str]:
    return [seen.body.get("text", "") for seen in receiver.accepted]


# PostgreSQL only: the production database, whose workers claim with SKIP LOCKED (the claim on
# both backends is tested in test_jobs_queue.py); the loop takes minutes, once is enough.
@pytest.mark.parametrize("backend", ["postgres"])
def test_a_weak_run_starts_a_job_on_the_npu_pool_and_ends_named_strongly(service):
    client, db, settings, model, receiver = service
    steps = _production_run(model, seed=8)
    run_id = client.post("/api/v1/runs", json={"name": "prod", "framework": "verl",
                                               "model_uri": str(model)}).json()["id"]

    # The run as it trains, evaluated twice: healthy-looking before the fault shows, then weak (the
    # library has no fingerprint of its class); it ends weak, and a job is made for it.
    half = len(steps) // 2
    for part in (steps[:half], steps[half:]):
        assert client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": part}).status_code == 200
        evaluated = client.post(f"/api/v1/runs/{run_id}/triage").json()
    assert evaluated["candidates"][0]["strength"] == "weak", evaluated["candidates"][:3]
    assert CLASS not in {c["fault_class"] for c in evaluated["candidates"]}
    assert client.patch(f"/api/v1/runs/{run_id}", json={"status": "finished"}).status_code == 200
    (job,) = client.get(f"/api/v1/jobs?run_id={run_id}").json()["jobs"]
    assert job["state"] == "queued" and job["trigger"] in ("weak_twice", "ended_weak")
    assert CLASS in job["classes"] and job["grid"]["engine"] == ENGINE and job["steps"] == STEPS
    wait_for(lambda: any("reproduction job" in t and "started on a proxy" in t for t in _texts(receiver)),
             30, "the Slack message that a reproduction started")

    # The worker: proxy, reproductions as Ray tasks that each hold one NPU, the layer, re-triage.
    assert run_worker(db, settings=settings, once=True) == 1
    done = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert done["state"] == "succeeded", done.get("error")
    retriage = done["result"]["retriage"]
    assert (retriage["top_class"], retriage["strength"]) == (CLASS, "strong"), retriage
    assert done["planner_estimate"]["devices"]["proxy"] >= 1 and done["device_hours"] > 0
    # Every reproduction ran as a Ray task asking for an NPU: the campaign's backend was the pool.
    import json

    campaign = Path(settings.data_dir) / "jobs" / str(job["id"]) / "campaign" / "manifest.json"
    assert json.loads(campaign.read_text())["backend"] == "ray"

    stored = client.get(f"/api/v1/runs/{run_id}/triage").json()
    assert (stored["candidates"][0]["fault_class"], stored["candidates"][0]["strength"]) == (CLASS, "strong")
    wait_for(lambda: any(f"Reproduction job {job['id']}" in t and f"now {CLASS}" in t for t in _texts(receiver)),
             30, "the Slack message of the job's outcome")
    wait_for(lambda: any(t.startswith(f"{CLASS} (") and "strong" in t for t in _texts(receiver)),
             30, "the Slack alert of the strong match")

    # The run page: the job, its consistency verdict, the reproduction drawn beside the run.
    token = client.headers["Authorization"].split()[1]  # a project's API token is its page login too
    assert client.post("/login", data={"token": token}, follow_redirects=False).status_code == 303
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    html = page.text
    assert 'id="reproduction"' in html and "succeeded" in html
    assert done["result"]["consistency"]["verdict"] in html
    assert f"reproduction: job {job['id']} (proxy)" in html
