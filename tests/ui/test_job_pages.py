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
    assert f'<td><a href="/jobs/{ok_job}">{ok_job}</a></td>' in jobs and f'<a href="/jobs/{bad_job}">' in jobs


def test_a_job_has_its_own_page_with_spec_outcome_and_cost(ui_client, auth, post_run, database):
    run_id = post_run(synthetic_run("healthy", steps=40, seed=7), "prod-detail")
    job_id = _job(ui_client, auth, run_id)

    def executor(job, ctx):
        ctx.heartbeat(progress={"stage": "reproduce", "done": 6, "total": 6})
        return JobOutcome(result={"library_version": 2, "fingerprints": 6, "strong_threshold": 0.713,
                                  "cost": {"reproduction_s": 42.0, "runs": 14},
                                  "consistency": {"verdict": "consistent", "summary": "3 of 3 shared metrics alike"},
                                  "retriage": {"top_class": "router_corruption", "score": 0.91, "strength": "strong",
                                               "verdict": "likely router_corruption"}},
                          device_hours=0.25, planner_estimate={"devices": {"proxy": 2, "original": 8}})

    assert run_worker(database, executor=executor, settings=Settings(database_url="sqlite://"), once=True) == 1
    listing = ui_client.get(f"/runs/{run_id}").text
    assert f'<a href="/jobs/{job_id}">{job_id}</a>' in listing
    page = ui_client.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    html = page.text
    assert f"Reproduction job {job_id}" in html and "succeeded" in html
    assert f'<a href="/runs/{run_id}">prod-detail</a>' in html and "<code>/models/qwen3</code>" in html
    assert "router_corruption; 120 steps, seeds 0, 1" in html  # the settings' defaults, as stored
    assert "router_corruption (0.91, strong)" in html and "v2: 6 fingerprints, strong from 0.713" in html
    assert "consistent: 3 of 3 shared metrics alike" in html and "reproduce 6/6" in html
    assert "proxy 2, original 8" in html and "42 s over 14 runs" in html and "0.25" in html
    # A job that failed before it had a result: the page shows the error and no outcome.
    failed_run = post_run(synthetic_run("healthy", steps=40, seed=8), "prod-failed")
    failed = _job(ui_client, auth, failed_run)

    def failing(job, ctx):
        raise RuntimeError("model_uri '/models/qwen3': no such directory on this worker\n(and a second line)")

    assert run_worker(database, executor=failing, settings=Settings(database_url="sqlite://"), once=True) == 1
    html = ui_client.get(f"/jobs/{failed}").text
    assert 'id="job-error"' in html and "(and a second line)" in html and 'id="job-result"' not in html
    assert ui_client.get("/jobs/999999").status_code == 404
    assert "Job 999999 not found" in ui_client.get("/jobs/999999").text
    assert ui_client.get(f"/jobs/{2**40}").status_code == 404  # beyond any id: not found, not 500


def test_a_projects_login_sees_only_its_jobs(ui_client, ui_app, auth, post_run, make_token):
    from fastapi.testclient import TestClient

    mine = post_run(synthetic_run("healthy", steps=40, seed=5), "secret-run", project="owner")
    _job(ui_client, auth, mine, project="owner")
    with TestClient(ui_app) as other:
        assert other.post("/login", data={"token": make_token("intruder")}, follow_redirects=False).status_code == 303
        page = other.get("/jobs")
        assert page.status_code == 200 and "secret-run" not in page.text and 'id="no-jobs"' in page.text
        (job,) = ui_client.get("/api/v1/jobs", headers=auth("owner")).json()["jobs"]
        foreign = other.get(f"/jobs/{job['id']}")
        assert foreign.status_code == 404 and "secret-run" not in foreign.text


def test_the_run_page_draws_the_checked_reproduction_beside_the_run(ui_client, ui_app, auth, post_run, database,
                                                                     tmp_path):
    """The trace the worker checked against the run (a real engine trace of campaign v2, written in
    the run's framework view) is drawn on the run's own plots, with the consistency verdict and the
    planner's devices in the card; a path outside the data directory is not read."""
    import gzip
    import json
    from pathlib import Path

    from test_pages import plot_data

    data_dir = tmp_path / "data"
    trace = data_dir / "jobs" / "1" / "campaign" / "library" / "router_corruption-seed0.jsonl"
    trace.parent.mkdir(parents=True)
    committed = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "campaign-v2" / "traces"
                 / "library" / "healthy" / "healthy-seed0.jsonl.gz")
    trace.write_bytes(gzip.decompress(committed.read_bytes()))
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_bytes(trace.read_bytes())
    ui_app.state.settings = ui_app.state.settings.model_copy(update={"data_dir": data_dir})

    run_id = post_run(synthetic_run("healthy", steps=40, seed=6), "prod-checked")
    job_id = _job(ui_client, auth, run_id)

    def executor(job, ctx):
        return JobOutcome(result={"library_version": 1, "consistency": {
            "verdict": "partially consistent", "summary": "2 of 3 shared metrics move alike",
            "reproduction": str(trace)}}, device_hours=0.5, planner_estimate={"devices": {"proxy": 1, "original": 4}})

    assert run_worker(database, executor=executor, settings=Settings(database_url="sqlite://"), once=True) == 1
    page = ui_client.get(f"/runs/{run_id}").text
    assert 'title="2 of 3 shared metrics move alike">partially consistent</span>' in page
    assert "<td>1 / 4</td>" in page
    figures = {f["name"]: f for group in plot_data(page).values() for f in group}
    label = f"reproduction: job {job_id} (proxy)"
    drawn = {name: t for name, f in figures.items() for t in f["traces"] if t["name"] == label}
    engine = [json.loads(line) for line in trace.read_text().splitlines()]
    assert "critic/score/mean" in drawn  # the run's name; the engine wrote it under the same verl name
    assert drawn["critic/score/mean"]["x"] == [r["step"] for r in engine]
    assert drawn["critic/score/mean"]["y"] == [r["values"]["critic/score/mean"] for r in engine]
    assert set(drawn) <= set(figures) and len(drawn) >= 3

    # The same result pointing outside the data directory: the card stays, nothing is read or drawn.
    from moeproxy.service.jobs.models import ReproductionJob

    with database.scope() as s:
        row = s.get(ReproductionJob, job_id)
        row.result = {**row.result, "consistency": {**row.result["consistency"], "reproduction": str(outside)}}
    page = ui_client.get(f"/runs/{run_id}").text
    assert "partially consistent" in page and label not in page
