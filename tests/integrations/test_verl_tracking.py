"""MoeproxyTracking with verl's backend interface, against a real uvicorn."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from moeproxy.integrations import MoeproxyTracking
from moeproxy.integrations._common import IntegrationConfigError


class FakeTracking:
    """verl's Tracking loop over its backends (verl/utils/tracking.py): ``logger`` dict, log, finish."""

    def __init__(self):
        self.logger = {}

    def log(self, data, step):
        for backend in self.logger.values():
            backend.log(data=data, step=step)


def test_verl_backend_sends_steps_and_finishes(live_server):
    tracking = FakeTracking()
    backend = MoeproxyTracking(
        "qwen3_moe_grpo",
        "qwen3-30b-a3b-dapo",
        config={"actor": {"lr": 1e-6}},
        url=live_server.url,
        token=live_server.token,
        flush_interval_s=0.1,
    )
    tracking.logger["moeproxy"] = backend
    for step in range(1, 5):
        tracking.log(
            {
                "critic/score/mean": 0.1 * step,
                "actor/grad_norm": math.inf if step == 3 else np.float32(1.25),
                "actor/ppo_kl": np.float64(1e-3),
                "timing_s/gen": 3.2,
                "val/generations": "a table, not a metric",
            },
            step=step,
        )
    backend.finish()

    headers = {"Authorization": f"Bearer {live_server.token}"}
    (listed,) = httpx.get(f"{live_server.url}/api/v1/runs", headers=headers).json()["runs"]
    run = httpx.get(f"{live_server.url}/api/v1/runs/{listed['id']}", headers=headers).json()  # with config
    assert run["name"] == "qwen3-30b-a3b-dapo" and run["framework"] == "verl" and run["status"] == "finished"
    assert "project:qwen3_moe_grpo" in run["tags"] and run["config"] == {"actor": {"lr": 1e-6}}
    metrics = httpx.get(f"{live_server.url}/api/v1/runs/{run['id']}/metrics", headers=headers).json()[
        "metrics"
    ]
    assert metrics["critic/score/mean"]["steps"] == [1, 2, 3, 4]
    assert metrics["actor/grad_norm"]["values"] == [1.25, 1.25, "Infinity", 1.25]
    assert "val/generations" not in metrics


def test_missing_endpoint_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("MOEPROXY_URL", raising=False)
    monkeypatch.delenv("MOEPROXY_TOKEN", raising=False)
    with pytest.raises(IntegrationConfigError, match="MOEPROXY_URL"):
        MoeproxyTracking("p", "e")
