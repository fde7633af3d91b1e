"""PostgreSQL restarted under a logging job (issue 16): while it is away the API answers 503 with
``Retry-After`` (REST and MLflow) and ``/readyz`` is red; the client keeps its points and replays
them; afterwards every point is there once.

The restart happens on a throwaway cluster this test makes (``initdb`` in a temporary directory,
its own port and socket directory), never on the shared server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from uvicorn_process import UvicornProcess, free_port

pytestmark = pytest.mark.slow


def _pg_bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(out) if (Path(out) / "initdb").exists() else None


BINDIR = _pg_bindir()


def _as_postgres(args: list[str], **kw) -> subprocess.CompletedProcess:
    # initdb and postgres refuse to run as root; the Debian package's "postgres" user runs them.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(prefix + args, capture_output=True, text=True, timeout=120, check=False, **kw)


class ThrowawayCluster:
    def __init__(self, root: Path):
        self.root, self.data, self.port = root, root / "data", free_port()
        self.socket_dir = root / "sock"

    def init(self) -> ThrowawayCluster:
        self.socket_dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socket_dir, "postgres")
        done = _as_postgres([str(BINDIR / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        assert done.returncode == 0, done.stderr[-2000:]
        return self

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        done = _as_postgres([str(BINDIR / "pg_ctl"), "-D", str(self.data), "-o", opts, "-w", "-l", str(self.root / "log"), "start"])
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def stop(self) -> None:
        _as_postgres([str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"


@pytest.fixture
def cluster():
    if BINDIR is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("initdb/pg_ctl (and runuser as root) are needed for the restart scenario")
        pytest.skip("no PostgreSQL server binaries here")
    # Directly under /tmp: pytest's own temporary directories are closed to the postgres user.
    root = Path(tempfile.mkdtemp(prefix="moeproxy-pg-"))
    try:
        c = ThrowawayCluster(root).init()
        c.start()
        yield c
        c.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_postgres_restart_loses_and_duplicates_nothing(cluster, tmp_path):
    from moeproxy import migrations
    from moeproxy.client import MetricsClient
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository as tokens

    migrations.upgrade(cluster.url)
    database = Database(cluster.url)
    with database.scope() as s:
        _, token = tokens.create_token(s, "restart")
    database.dispose()
    headers = {"Authorization": f"Bearer {token}"}
    steps, metrics = 120, ("loss", "actor/grad_norm", "actor/entropy")

    with UvicornProcess(cluster.url) as server:
        client = MetricsClient(
            server.url, token, "through-a-restart", framework="verl", flush_interval_s=0.2, batch_steps=10,
            retries=2, backoff_base_s=0.2, backoff_max_s=1.0, spill_path=tmp_path / "spill.jsonl",
            close_timeout_s=60, register_atexit=False,
        )
        seen_while_down: dict[str, int] = {}
        for step in range(steps):
            client.log(step, {m: step + i / 10 for i, m in enumerate(metrics)})
            if step == 40:
                time.sleep(1.0)  # the first part is in
                cluster.stop()
                ready = httpx.get(f"{server.url}/readyz", timeout=10)
                seen_while_down["readyz"] = ready.status_code
                rest = httpx.get(f"{server.url}/api/v1/runs", headers=headers, timeout=10)
                seen_while_down["rest"] = rest.status_code
                seen_while_down["rest_retry_after"] = int(rest.headers.get("retry-after", "0"))
                seen_while_down["rest_detail"] = "retry" in rest.json().get("detail", "")
                mlflow = httpx.post(f"{server.url}/mlflow/api/2.0/mlflow/runs/create", json={}, headers=headers, timeout=10)
                seen_while_down["mlflow"] = mlflow.status_code
                seen_while_down["mlflow_code"] = mlflow.json().get("error_code")
            if 40 < step < 80:
                time.sleep(0.05)  # the job goes on logging for a few seconds while the database is away
            if step == 80:
                cluster.start()
        client.close()

        assert seen_while_down == {
            "readyz": 503, "rest": 503, "rest_retry_after": 5, "rest_detail": True,
            "mlflow": 503, "mlflow_code": "TEMPORARILY_UNAVAILABLE",
        }
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        runs = httpx.get(f"{server.url}/api/v1/runs", headers=headers).json()["runs"]
        assert [r["name"] for r in runs] == ["through-a-restart"]  # one run, not one per retry
        series = httpx.get(f"{server.url}/api/v1/runs/{runs[0]['id']}/metrics", headers=headers).json()["metrics"]
    assert set(series) == set(metrics)
    for i, m in enumerate(metrics):
        assert series[m]["steps"] == list(range(steps))  # every step once: none lost, none twice
        assert series[m]["values"] == [s + i / 10 for s in range(steps)]
