"""The real MLflow client (mlflow-skinny) against the real service on a real uvicorn."""

from __future__ import annotations

import math

import httpx
import pytest

mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def tracking(live_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{live_server.url}/mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", live_server.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    mlflow.set_tracking_uri(f"{live_server.url}/mlflow")
    # The fluent API remembers the last experiment process-wide; each test has a fresh service.
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", "0")  # set_experiment() writes it; restored after the test
    yield live_server
    if mlflow.active_run() is not None:
        mlflow.end_run()


def api(server, path, **params):
    response = httpx.get(
        f"{server.url}{path}", params=params, headers={"Authorization": f"Bearer {server.token}"}
    )
    response.raise_for_status()
    return response.json()


def test_mlflow_client_round_trip(tracking):
    mlflow.set_experiment("qwen3-30b-grpo")
    with mlflow.start_run(run_name="dapo-seed1") as active:
        mlflow.log_param("actor_rollout_ref.actor.optim.lr", 1e-6)
        mlflow.log_params({"algorithm.adv_estimator": "grpo", "data.train_batch_size": 256})
        mlflow.set_tag("moeproxy.framework", "verl")
        mlflow.log_metric("critic/score/mean", 0.1, step=0)
        for step in range(1, 6):
            mlflow.log_metrics(
                {
                    "critic/score/mean": 0.1 + 0.05 * step,
                    "actor/ppo_kl": 0.001 * step,
                    "actor/grad_norm": math.nan if step == 4 else 1.5,
                    "training/rollout_probs_diff_mean": math.inf if step == 5 else 0.01,
                },
                step=step,
            )
        run_uuid = active.info.run_id

    client = mlflow.tracking.MlflowClient()
    fetched = client.get_run(run_uuid)
    assert fetched.info.status == "FINISHED"
    assert fetched.info.run_name == "dapo-seed1"
    assert fetched.data.params["algorithm.adv_estimator"] == "grpo"
    assert fetched.data.metrics["critic/score/mean"] == pytest.approx(0.35)
    history = client.get_metric_history(run_uuid, "actor/grad_norm")
    assert [m.step for m in history] == [1, 2, 3, 4, 5]
    assert math.isnan(history[3].value)

    # The same data through moeproxy's own API: the experiment is the run's namespace.
    (listed,) = api(tracking, "/api/v1/runs")["runs"]
    run = api(tracking, f"/api/v1/runs/{listed['id']}")  # list rows leave the config out
    assert run["name"] == "qwen3-30b-grpo/dapo-seed1"
    assert run["status"] == "finished" and run["framework"] == "verl"
    assert run["config"]["params"]["actor_rollout_ref.actor.optim.lr"] == "1e-06"
    series = api(tracking, f"/api/v1/runs/{run['id']}/metrics")["metrics"]
    assert series["critic/score/mean"]["steps"] == [0, 1, 2, 3, 4, 5]
    assert series["actor/grad_norm"]["values"][3] == "NaN"
    assert series["training/rollout_probs_diff_mean"]["values"][4] == "Infinity"


def test_default_experiment_and_resume_by_name(tracking):
    with mlflow.start_run(run_name="plain") as first:
        mlflow.log_metric("loss", 1.0, step=0)
    with mlflow.start_run(run_name="plain") as second:  # a restarted job reusing its run name
        mlflow.log_metric("loss", 0.5, step=1)
    assert first.info.experiment_id == second.info.experiment_id == "0"
    (run,) = api(tracking, "/api/v1/runs")["runs"]
    assert run["name"] == "plain"
    assert api(tracking, f"/api/v1/runs/{run['id']}/metrics")["metrics"]["loss"]["steps"] == [0, 1]


def test_errors_are_mlflow_shaped(tracking, monkeypatch):
    from mlflow.exceptions import MlflowException

    client = mlflow.tracking.MlflowClient()
    with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST|not found"):
        client.get_run("0" * 32)
    client.create_experiment("dup")
    with pytest.raises(MlflowException, match="already exists"):
        client.create_experiment("dup")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "not-a-token")
    with pytest.raises(MlflowException):
        client.get_experiment_by_name("dup")
    response = httpx.post(f"{tracking.url}/mlflow/api/2.0/mlflow/runs/create", json={"experiment_id": "0"})
    assert response.status_code == 401 and response.json()["error_code"] == "UNAUTHENTICATED"


def test_a_notebook_logs_a_batch_and_searches_its_runs(tracking):
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException

    client = mlflow.tracking.MlflowClient()
    exp = client.create_experiment("sweep")
    ids = []
    for i, (phase, status) in enumerate((("rl", "FINISHED"), ("rl", "FAILED"), ("sft", "FINISHED"))):
        run = client.create_run(exp, run_name=f"lr-{i}", tags={"phase": phase})
        client.log_batch(run.info.run_id, metrics=[Metric("actor/ppo_kl", 0.001 * (i + 1), 0, s) for s in range(3)],
                         params=[Param("lr", f"{i}e-6")], tags=[RunTag("seed", str(i))])
        client.set_terminated(run.info.run_id, status)
        ids.append(run.info.run_id)

    found = client.search_runs([exp], "tags.phase = 'rl' and attributes.status = 'FINISHED'")
    assert [r.info.run_id for r in found] == [ids[0]]
    assert found[0].data.params == {"lr": "0e-6"} and found[0].data.tags["seed"] == "0"
    assert found[0].data.metrics["actor/ppo_kl"] == pytest.approx(0.001)
    assert [r.info.run_name for r in client.search_runs([exp], "params.lr LIKE '%e-6'",
                                                        order_by=["attributes.run_name DESC"])] == [
        "lr-2", "lr-1", "lr-0"]
    # Paged as MLflow pages: a token for the next page, none after the last.
    first = client.search_runs([exp], max_results=2, order_by=["start_time ASC"])
    assert len(first) == 2 and first.token
    rest = client.search_runs([exp], max_results=2, order_by=["start_time ASC"], page_token=first.token)
    assert [r.info.run_id for r in [*first, *rest]] == ids and not rest.token
    # The fluent call a notebook makes: a DataFrame, one row per run.
    frame = mlflow.search_runs(experiment_names=["sweep"], filter_string="tags.phase = 'sft'")
    assert list(frame["run_id"]) == [ids[2]] and frame["params.lr"][0] == "2e-6"
    # What it cannot answer it refuses, naming it, rather than ignoring the filter.
    with pytest.raises(MlflowException, match="metrics are not searchable"):
        client.search_runs([exp], "metrics.loss > 1")
    with pytest.raises(MlflowException, match="order by"):
        client.search_runs([exp], order_by=["metrics.loss DESC"])


def test_a_run_without_a_framework_tag_takes_the_framework_its_names_show(tracking):
    # What transformers' MLflowCallback sends for a TRL run: TRL's own names, no moeproxy tag.
    with mlflow.start_run(run_name="trl-grpo"):
        mlflow.log_metrics({"completions/mean_length": 120.0, "reward": 0.4, "kl": 0.01}, step=1)
    with mlflow.start_run(run_name="tagged"):
        mlflow.set_tag("moeproxy.framework", "openrlhf")
        mlflow.log_metrics({"completions/mean_length": 120.0}, step=1)
    with mlflow.start_run(run_name="plain-loop"):
        mlflow.log_metrics({"loss": 1.0, "reward": 0.2}, step=1)
    frameworks = {r["name"]: r["framework"] for r in api(tracking, "/api/v1/runs")["runs"]}
    assert frameworks == {"trl-grpo": "trl", "tagged": "openrlhf", "plain-loop": None}
