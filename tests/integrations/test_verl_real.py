"""verl's real ``Tracking`` (verl 0.9.1, in its own virtual environment: it pins transformers < 5.11
and pulls in Ray and tensordict, so it never goes into the project's) logging to a real server:
its ``mlflow`` backend at ``/mlflow`` and ``MoeproxyTracking`` as a backend of its own. Both runs
arrive with every point; the MLflow one is recognised as verl's from its names.

The environment is ``.venv-verl`` (``bash .ci/verl_venv`` makes it; ``.ci/run`` does); without it the
test is skipped, and on CI (``CI=true``) it fails instead, so a broken environment cannot pass
silently."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("MOEPROXY_VERL_VENV", ROOT / ".venv-verl")) / "bin" / "python"
SCRIPT = Path(__file__).parent / "verl_client" / "log_with_verl.py"

if not VERL_PYTHON.exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"{VERL_PYTHON} is missing: .ci/run makes it with .ci/verl_venv")
    pytest.skip(f"no verl environment at {VERL_PYTHON} (bash .ci/verl_venv makes it)", allow_module_level=True)


def _runs(server) -> dict[str, dict]:
    headers = {"Authorization": f"Bearer {server.token}"}
    listed = httpx.get(f"{server.url}/api/v1/runs", headers=headers).json()["runs"]
    out = {}
    for run in listed:
        metrics = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/metrics", headers=headers).json()["metrics"]
        out[run["name"]] = {**run, "metrics": metrics}
    return out


def test_verls_tracking_sends_through_mlflow_and_through_the_moeproxy_backend(sqlite_live_server):
    server = sqlite_live_server
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PYTHONPATH"))}
    done = subprocess.run([str(VERL_PYTHON), str(SCRIPT), server.url, server.token], check=False, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    assert versions["verl"] == "0.9.1"

    runs = _runs(server)
    via_mlflow, ours = runs["qwen3-grpo/verl-real"], runs["verl-real-moeproxy"]
    assert via_mlflow["framework"] == "verl"  # no tag: its names say so
    assert via_mlflow["status"] == "finished" and ours["status"] == "finished"
    for run in (via_mlflow, ours):
        score = run["metrics"]["critic/score/mean"]
        assert score["steps"] == [1, 2, 3, 4, 5]
        assert [round(v, 6) for v in score["values"]] == [0.1, 0.2, 0.3, 0.4, 0.5]
        assert run["metrics"]["actor/grad_norm"]["values"][3] == "NaN"
    assert {n: s["values"] for n, s in via_mlflow["metrics"].items()} == {
        n: s["values"] for n, s in ours["metrics"].items()}
    assert math.isclose(ours["metrics"]["actor/ppo_kl"]["values"][-1], 0.005)
