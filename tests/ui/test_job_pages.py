"""Reproduction jobs on the pages (issue 18, item 5): the run page's "Reproduction" card and /jobs,
with what a worker recorded (state, progress, the run's class after the job, or its error), and
nothing of another project's jobs for a project's own login."""

from __future__ import annotations

from moeproxy.service.jobs.spec import JobOutcome
from moeproxy.service.jobs.worker import run_worker
from moeproxy.signatures.synthetic import synthetic_run

from moeproxy.config import Settings


def _job(ui_client, auth, run_id: int, project: str = "test-project") -> int:
    headers = auth(project)
    assert ui_client.patch(f"/api/v1/runs/{run_id}", json={"model_uri": "/models/qwen3"}, headers=headers).status_code == 200
    created = ui_client.post("/api/v1/jobs", json={"run_id": run_id, "classes": ["router_corruption"]},
                             headers=headers)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def test_the_run_page_and_jobs_page_show_what_the_worker_recorded(ui_client, auth, post_run, database):
    ok_run = post_run(synthetic_run("healthy", steps=40, seed=3), "prod-ok")
    bad_run = post_run(synthetic_run("healthy", steps=40, seed=4), "prod-bad")
    assert "Reproduction" not in ui_client.get(f"/runs/{ok_run}").text  # no job, no card
    ok_job, bad_job = _job(ui_client, auth, ok_run), _job(ui_client, auth, bad_run)

    def executor(job, ctx):
        if job.id == bad_job:
            raise RuntimeError("model_uri '/models/qwen3': no such directory on this worker")
        ctx.heartbeat(progress={"stage": "reproduce", "done": 14, "total": 14})
        return JobOutcome(result={"library_version": 3, "retriage": {"top_class": "router_corruption", "score": 0.91,
                                                                       "strength": "strong"}}, device_hours=0.25)

    for _ in range(2):  # one job a call
        assert run_worker(database, executor=executor, settings=Settings(database_url="sqlite://"), once=True) == 1

    page = ui_client.get(f"/runs/{ok_run}").text
    assert 'id="reproduction"' in page and "succeeded" in page
    assert "library v3: router_corruption (0.91, strong)" in page and "reproduce 14/14" in page
    bad_page = ui_client.get(f"/runs/{bad_run}").text
    assert "failed" in bad_page and "RuntimeError: model_uri &#39;/models/qwen3&#39;: no such directory" in bad_page

    jobs = ui_client.get("/jobs").text
    assert f'href="/runs/{ok_run}">prod-ok</a>' in jobs and f'href="/runs/{bad_run}">prod-bad</a>' in jobs
    assert jobs.index("prod-bad") < jobs.index("prod-ok")  # newest first
    assert f"<td>{ok_job}</td>" in jobs and f"<td>{bad_job}</td>" in jobs


def test_a_projects_login_sees_only_its_jobs(ui_client, ui_app, auth, post_run, make_token):
    from fastapi.testclient import TestClient

    mine = post_run(synthetic_run("healthy", steps=40, seed=5), "secret-run", project="owner")
    _job(ui_client, auth, mine, project="owner")
    with TestClient(ui_app) as other:
        assert other.post("/login", data={"token": make_token("intruder")}, follow_redirects=False).status_code == 303
        page = other.get("/jobs")
        assert page.status_code == 200 and "secret-run" not in page.text and 'id="no-jobs"' in page.text
