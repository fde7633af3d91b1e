"""Settings read from the environment (``MOEPROXY_`` prefix, SPEC section 5)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("moeproxy", appauthor=False))


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'moeproxy.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MOEPROXY_", extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    slack_webhook_url: str | None = None
    webhook_url: str | None = None  # generic JSON webhook, same events as Slack
    public_url: str = "http://127.0.0.1:8000"
    fingerprints: Path | None = None  # library path; None = the shipped library
    # The operator's page login (every project); projects log in with their own API tokens.
    ui_token: str | None = None
    # Pages open to anyone who reaches the port, every project visible: a laptop only.
    public_ui: bool = False
    # Failed page logins from one address before it must wait (counted per process).
    login_max_failures: int = Field(default=10, ge=1)
    login_lockout_s: float = Field(default=900.0, gt=0)
    # Requests per credential and per client address in any rate_limit_window_s (0: no limit), per
    # process. A training job sends about one request per flush (2 s); an MLflow client that logs
    # each metric on its own, ~50 per step: 100/s per token leaves both far below the limit.
    rate_limit_per_token: int = Field(default=6000, ge=0)
    rate_limit_per_address: int = Field(default=12000, ge=0)
    rate_limit_window_s: float = Field(default=60.0, gt=0)
    triage_interval_s: float = Field(default=10.0, ge=0)
    # A metrics body must arrive within this (a 64 MiB body at 10 Mbit/s takes ~54 s).
    body_read_timeout_s: float = Field(default=60.0, gt=0)
    data_dir: Path = Field(default_factory=default_data_dir)
    # Reproduction jobs (issue 18).  Defaults of a job's spec, when a request or an automatic job
    # leaves them out (lists as JSON in the environment: MOEPROXY_JOB_SEEDS='[0, 1]').
    job_method: str = "three_view"
    job_keep_ratio: float = Field(default=0.75, gt=0, le=1)
    job_steps: int = Field(default=120, ge=8)  # a campaign runs at least 8 steps
    job_seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=2)  # calibrated leave-one-seed-out
    # A job is created automatically only for a run with at least this many steps.
    job_min_steps: int = Field(default=30, ge=1)
    # Queued plus running jobs per project; creating one more is refused (409) or skipped (automatic).
    job_max_open_per_project: int = Field(default=2, ge=1)
    # A worker's lease on its job; it heartbeats at a third of it.  A job whose lease expired this
    # many times (its workers died) fails instead of being queued again.
    job_lease_s: float = Field(default=60.0, gt=0)
    job_max_attempts: int = Field(default=3, ge=1)
    worker_poll_s: float = Field(default=5.0, gt=0)
    # Engine options of every job (EngineConfig fields, JSON in the environment:
    # MOEPROXY_JOB_ENGINE='{"prompts_per_step": 8}'); a request's own options go over them.
    job_engine: dict[str, bool | int | float | str | list[str] | list[float]] = Field(default_factory=dict)
    # Where a reproduction runs on the worker that takes it: cpu, cuda or npu (one device each).
    job_device: str = Field(default="cpu", pattern=r"^(cpu|cuda|npu)(:\d+)?$")
    # The Ray cluster the job executor runs reproductions on (None: the one Ray finds, or a local one).
    ray_address: str | None = None
    # The Ray resource a reproduction asks for, when not the one job_device implies (npu: NPU,
    # cuda: GPU): a custom resource name of the cluster, e.g. NPU on a pool that schedules CPU runs.
    ray_accelerator: str | None = Field(default=None, min_length=1, max_length=64)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
