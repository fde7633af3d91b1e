"""``moeproxy import`` against a real uvicorn over SQLite: every point stored, a repeated import
sends nothing, an interrupted one completes, and ``moeproxy triage`` of the file (or of the MLflow
run) ranks what the server ranks for the imported run."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from moeproxy.cli import app
from tests.importers.fixtures import (
    trl_history,
    verl_steps,
    write_mlflow_run,
    write_trainer_state,
    write_verl_file_logger,
)

runner = CliRunner()


def _import(server, *args):
    return runner.invoke(app, ["import", *args, "--url", server.url, "--token", server.token])


def _http(server) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60)


def _stored(server, run_name: str) -> tuple[dict, dict]:
    with _http(server) as http:
        run = next(r for r in http.get("/api/v1/runs").json()["runs"] if r["name"] == run_name)
        return run, http.get(f"/api/v1/runs/{run['id']}/metrics").json()["metrics"]


def _points(metrics: dict) -> dict[tuple[str, int], float]:
    return {(name, step): value for name, series in metrics.items()
            for step, value in zip(series["steps"], series["values"], strict=True)}


def test_import_stores_every_point_and_a_second_import_adds_nothing(sqlite_live_server, tmp_path):
    server = sqlite_live_server
    source = write_verl_file_logger(tmp_path / "ppo-run.jsonl", verl_steps(n_steps=30))
    res = _import(server, str(source))
    assert res.exit_code == 0, res.output
    assert "read 180 points of 30 steps" in res.stdout and "180 points sent, 0 already stored" in res.stdout
    run, metrics = _stored(server, "ppo-run")
    assert run["framework"] == "verl"
    from moeproxy.importers import read_source

    expected = {(name, step): value for step, values in read_source(source).steps for name, value in values.items()}
    assert _points(metrics) == expected
    again = _import(server, str(source))
    assert again.exit_code == 0 and "0 points sent, 180 already stored" in again.stdout
    assert _points(_stored(server, "ppo-run")[1]) == expected


def test_an_interrupted_import_completes(sqlite_live_server, tmp_path):
    server = sqlite_live_server
    steps = verl_steps(n_steps=30)
    full = write_verl_file_logger(tmp_path / "full.jsonl", steps)
    half = write_verl_file_logger(tmp_path / "half.jsonl", steps[:15])
    first = _import(server, str(half), "--run-name", "resumed", "--format", "verl_file")
    assert first.exit_code == 0 and "90 points sent" in first.stdout
    rest = _import(server, str(full), "--run-name", "resumed")
    assert rest.exit_code == 0, rest.output
    assert "90 points sent, 90 already stored" in rest.stdout
    assert len(_points(_stored(server, "resumed")[1])) == 180


def test_points_that_never_arrive_fail_the_import_with_their_number(sqlite_live_server, tmp_path, monkeypatch):
    """The check after sending counts each metric's points on the server (one grouped query); a
    metric that holds fewer than it should sends the import back to a full read, which says how
    many points are missing. The same import run again sends just those."""
    from moeproxy.importers import upload

    server = sqlite_live_server
    source = write_verl_file_logger(tmp_path / "lossy.jsonl", verl_steps(n_steps=30))
    real_send = upload._send
    monkeypatch.setattr(upload, "_send", lambda steps, **kw: real_send(steps[:-2], **kw))  # two steps lost
    lossy = _import(server, str(source))
    assert lossy.exit_code != 0 and "12 points did not reach" in lossy.output, lossy.output
    monkeypatch.setattr(upload, "_send", real_send)
    again = _import(server, str(source))
    assert again.exit_code == 0 and "12 points sent, 168 already stored" in again.stdout, again.output
    with _http(server) as http:
        run = next(r for r in http.get("/api/v1/runs").json()["runs"] if r["name"] == "lossy")
        names = http.get(f"/api/v1/runs/{run['id']}/metrics/names").json()["names"]
    assert {n["points"] for n in names} == {30} and {n["last_step"] for n in names} == {30}


def test_project_and_service_errors_exit_non_zero(sqlite_live_server, tmp_path):
    server = sqlite_live_server
    source = write_verl_file_logger(tmp_path / "r.jsonl", verl_steps(n_steps=3))
    res = _import(server, str(source), "--project", "someone-else")
    assert res.exit_code == 2 and "belongs to project 'rl-team'" in res.stderr
    res = runner.invoke(app, ["import", str(source), "--url", server.url, "--token", "not-a-token"])
    assert res.exit_code == 2 and "HTTP 401" in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "data": {"actor/kl_loss": 0.1}}\n{"step": -1, "data": {}}\n')
    res = _import(server, str(bad))
    assert res.exit_code == 2 and f"{bad}: line 2: step must be an integer" in res.stderr


def test_triage_of_a_trainer_state_equals_the_servers_triage_of_the_import(sqlite_live_server, tmp_path,
                                                                           monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.delenv("MOEPROXY_FINGERPRINTS", raising=False)  # both sides on the shipped library
    server = sqlite_live_server
    source = write_trainer_state(tmp_path / "grpo-moe", trl_history(n_steps=60, seed=3))
    res = _import(server, str(source))
    assert res.exit_code == 0 and "framework trl" in res.stdout, res.output
    run, _ = _stored(server, "grpo-moe")
    with _http(server) as http:
        served = http.post(f"/api/v1/runs/{run['id']}/triage").json()
    local = runner.invoke(app, ["triage", str(source), "--json"])
    assert local.exit_code == 0, local.output
    here = json.loads(local.stdout)
    assert [c["fault_class"] for c in here["candidates"]] == [c["fault_class"] for c in served["candidates"]]
    for a, b in zip(here["candidates"], served["candidates"], strict=True):
        assert a["score"] == pytest.approx(b["score"], abs=1e-9)
    assert here["verdict"] == served["verdict"]


def test_an_mlflow_run_imported_by_uri_and_triaged_the_same(sqlite_live_server, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MOEPROXY_FINGERPRINTS", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    server = sqlite_live_server
    store = (tmp_path / "mlruns").as_uri()
    source = f"mlflow:{store}#{write_mlflow_run(store, verl_steps(n_steps=40, seed=5), run_name='dapo-7')}"
    res = _import(server, source)
    assert res.exit_code == 0, res.output
    assert f"read 240 points of 40 steps from {source} (mlflow)" in res.stdout
    run, metrics = _stored(server, "dapo-7")
    assert run["framework"] == "verl"
    from moeproxy.importers import read_source

    expected = {(name, step): value for step, values in read_source(source).steps for name, value in values.items()}
    assert _points(metrics) == expected and len(expected) == 240
    with _http(server) as http:
        served = http.post(f"/api/v1/runs/{run['id']}/triage").json()
    local = runner.invoke(app, ["triage", source, "--json"])
    assert local.exit_code == 0, local.output
    here = json.loads(local.stdout)
    assert [c["fault_class"] for c in here["candidates"]] == [c["fault_class"] for c in served["candidates"]]
    for a, b in zip(here["candidates"], served["candidates"], strict=True):
        assert a["score"] == pytest.approx(b["score"], abs=1e-9)
    missing = _import(server, f"mlflow:{store}#ffffffffffffffffffffffffffffffff")
    assert missing.exit_code == 2 and "Run 'ffffffffffffffffffffffffffffffff' not found" in missing.stderr
