"""MetricsClient against a real uvicorn (stopped and restarted mid-run) on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import math
import time

import httpx
import numpy as np
import pytest
from uvicorn_process import UvicornProcess, create_token, free_port

from moeproxy.client import MetricsClient


def _token(database_url: str, project: str = "client-tests") -> str:
    return create_token(database_url, project)


def _series(url: str, token: str, run_id: int) -> dict:
    response = httpx.get(f"{url}/api/v1/runs/{run_id}/metrics", headers={"Authorization": f"Bearer {token}"})
    response.raise_for_status()
    return response.json()["metrics"]


def _values(step: int) -> dict[str, float]:
    return {
        "actor/ppo_kl": 0.001 * step,
        "actor/grad_norm": math.nan if step % 17 == 0 else 0.3 + step / 1000,
        "critic/score/mean": math.inf if step == 55 else step / 100,
        "training/rollout_probs_diff_mean": 0.004,
        "timing_s/step": 40.0 + step,
    }


def _expected(step: int) -> dict[str, float | str]:
    out = {}
    for name, v in _values(step).items():
        out[name] = "NaN" if math.isnan(v) else ("Infinity" if v == math.inf else v)
    return out


def _fast_client(url, token, run_name, spill_path, **kw) -> MetricsClient:
    return MetricsClient(
        url,
        token,
        run_name,
        framework="verl",
        batch_steps=10,
        flush_interval_s=0.1,
        retries=1,
        backoff_base_s=0.05,
        backoff_max_s=0.3,
        timeout_s=2.0,
        spill_path=spill_path,
        register_atexit=False,
        **kw,
    )


def test_client_survives_a_server_restart_without_losing_points(fresh_database_url, tmp_path):
    token = _token(fresh_database_url)
    server = UvicornProcess(fresh_database_url).start()
    spill = tmp_path / "spill.jsonl"
    client = _fast_client(server.url, token, "restart-run", spill, config={"lr": 1e-6})
    try:
        for step in range(40):
            client.log(step, _values(step))
        assert client.flush(timeout_s=30)
        assert client.stats["batches_spilled"] == 0
        server.stop()
        for step in range(40, 70):
            client.log(step, _values(step))  # returns at once while the server is down
            time.sleep(0.01)
        assert client.flush(timeout_s=30)
        assert client.stats["batches_spilled"] > 0 and spill.exists()
        server.start()
        for step in range(70, 100):
            client.log(step, _values(step))
        client.close(status="finished")
        run_id = client.run_id
        got = _series(server.url, token, run_id)
        assert set(got) == set(_values(0))
        for name, series in got.items():
            assert series["steps"] == list(range(100)), name
            assert series["values"] == [_expected(s)[name] for s in range(100)], name
        run = httpx.get(f"{server.url}/api/v1/runs/{run_id}", headers={"Authorization": f"Bearer {token}"}).json()
        assert run["status"] == "finished" and run["framework"] == "verl" and run["config"] == {"lr": 1e-6}
        assert not spill.exists()
    finally:
        client.close()
        server.stop()


def test_spill_file_is_replayed_by_the_next_client(fresh_database_url, tmp_path):
    token = _token(fresh_database_url)
    spill = tmp_path / "spill.jsonl"
    port = free_port()  # nothing listens here yet
    first = _fast_client(f"http://127.0.0.1:{port}", token, "replayed-run", spill)
    for step in range(25):
        first.log(step, {"a": float(step)})
    first.close(timeout_s=0.5)
    assert spill.exists() and len(spill.read_text().splitlines()) == 25
    with UvicornProcess(fresh_database_url, port) as server:
        second = _fast_client(server.url, token, "replayed-run", spill)
        second.log(25, {"a": 25.0})
        second.close()
        got = _series(server.url, token, second.run_id)
    assert got["a"]["steps"] == list(range(26)) and got["a"]["values"] == [float(s) for s in range(26)]
    assert not spill.exists()


def test_values_are_converted_like_a_training_loop_expects(fresh_database_url, tmp_path, caplog):
    token = _token(fresh_database_url)
    values = {
        "np_float32": np.float32(0.5),
        "np_int64": np.int64(7),
        "np_0d": np.array(2.5),
        "int": 3,
        "bool": True,
        "nan": float("nan"),
        "ninf": float("-inf"),
        "nan_string": "NaN",
        "text": "hello",
        "none": None,
        "list": [1, 2],
        "array": np.array([1.0, 2.0]),
    }
    try:
        import torch

        values["torch_scalar"] = torch.tensor(1.25)
        values["torch_vector"] = torch.ones(3)
    except ImportError:  # the light install has no torch; the numpy cases stand
        pass
    with UvicornProcess(fresh_database_url) as server, caplog.at_level(logging.WARNING, logger="moeproxy.client"):
        with _fast_client(server.url, token, "conversion-run", tmp_path / "s.jsonl") as client:
            client.log(np.int64(0), values)
            client.log(1, values)
        got = _series(server.url, token, client.run_id)
    flat = {name: series["values"][0] for name, series in got.items()}
    expected = {
        "np_float32": 0.5, "np_int64": 7.0, "np_0d": 2.5, "int": 3.0, "bool": 1.0,
        "nan": "NaN", "ninf": "-Infinity", "nan_string": "NaN",
    }
    if "torch_scalar" in values:
        expected["torch_scalar"] = 1.25
    assert flat == expected
    assert all(series["steps"] == [0, 1] for series in got.values())
    skipped = [r for r in caplog.records if "skipping metric" in r.getMessage()]
    skipped_names = sorted(r.getMessage().split("skipping metric ")[1].split(" ")[0] for r in skipped)
    assert skipped_names == sorted(["text", "none", "list", "array"] + (["torch_vector"] if "torch_vector" in values else []))


def test_log_rejects_bad_steps_at_once(tmp_path):
    client = _fast_client(f"http://127.0.0.1:{free_port()}", "t", "r", tmp_path / "s.jsonl")
    try:
        with pytest.raises(ValueError):
            client.log(-1, {"a": 1.0})
        with pytest.raises(ValueError, match="2\\*\\*63"):  # the server's steps are 64-bit
            client.log(2**63, {"a": 1.0})
        with pytest.raises(TypeError):
            client.log(1.5, {"a": 1.0})
        with pytest.raises(TypeError):
            client.log("3", {"a": 1.0})
    finally:
        client.close(timeout_s=0.2)
    with pytest.raises(RuntimeError):
        client.log(0, {"a": 1.0})


def test_points_are_flushed_at_interpreter_exit(fresh_database_url, tmp_path):
    """A training script that never calls close(): atexit sends what was queued."""
    import subprocess
    import sys

    token = _token(fresh_database_url)
    with UvicornProcess(fresh_database_url) as server:
        script = (
            "from moeproxy.client import MetricsClient\n"
            f"c = MetricsClient({server.url!r}, {token!r}, 'atexit-run', flush_interval_s=60, batch_steps=1000,"
            f" spill_path={str(tmp_path / 's.jsonl')!r})\n"
            "for step in range(30):\n"
            "    c.log(step, {'loss': step * 0.5})\n"
        )
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        runs = httpx.get(f"{server.url}/api/v1/runs", headers={"Authorization": f"Bearer {token}"}).json()["runs"]
        got = _series(server.url, token, runs[0]["id"])
    assert got["loss"]["steps"] == list(range(30))
    assert got["loss"]["values"] == [s * 0.5 for s in range(30)]


def test_config_with_nonfinite_values_and_odd_types_is_sent(fresh_database_url, tmp_path):
    from pathlib import PurePosixPath

    token = _token(fresh_database_url)
    config = {"lr": 1e-6, "clip": float("inf"), "path": PurePosixPath("/ckpt"), "nested": {"x": float("nan")}}
    with UvicornProcess(fresh_database_url) as server:
        with _fast_client(server.url, token, "config-run", tmp_path / "s.jsonl", config=config) as client:
            client.log(0, {"a": 1.0})
        run = httpx.get(
            f"{server.url}/api/v1/runs/{client.run_id}", headers={"Authorization": f"Bearer {token}"}
        ).json()
    assert run["config"] == {"lr": 1e-6, "clip": "Infinity", "path": "/ckpt", "nested": {"x": "NaN"}}


def test_an_unwritable_spill_file_holds_the_points_in_memory_and_training_goes_on(tmp_path, caplog):
    """A read-only or full spill directory (issue 16): one clear warning, log() keeps returning, and
    the points are replayed from memory once the server answers."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    up = {"now": False}
    stored: dict[int, dict] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if not up["now"]:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/api/v1/runs":
            return httpx.Response(201, json={"id": 1})
        for entry in json.loads(request.content)["steps"]:
            stored[entry["step"]] = entry["values"]
        return httpx.Response(200, json={"accepted": 1})

    client = MetricsClient(
        "http://moeproxy.test", "tok", "no-disk", transport=httpx.MockTransport(handler),
        spill_path=blocker / "spill.jsonl", flush_interval_s=0.05, batch_steps=5, retries=0,
        backoff_base_s=0.01, backoff_max_s=0.05, register_atexit=False,
    )
    with caplog.at_level(logging.WARNING, logger="moeproxy.client"):
        for step in range(30):
            client.log(step, {"loss": float(step)})  # returns at once although nothing can be sent
        client.flush(timeout_s=5)
    assert client.stats["steps_held_in_memory"] == 30 and client.stats["steps_dropped"] == 0
    warnings = [r for r in caplog.records if "cannot write the spill file" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker) in warnings[0].getMessage()
    up["now"] = True
    client.close(timeout_s=10)
    assert sorted(stored) == list(range(30)) and stored[7] == {"loss": 7.0}
