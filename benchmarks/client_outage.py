"""The server down for a minute while a training loop logs (issue 16): does the loop slow down?

A loop of ``--step-ms`` of simulated work per step logs ``--metrics`` values each step through
``MetricsClient``; the server (a real uvicorn on SQLite) is up for ``--up`` seconds, down for
``--down`` seconds, then up again for ``--up`` seconds. Per phase: the time ``log()`` takes (median,
p99, max) and the loop's step time; at the end, every point is counted back through the API.

    python benchmarks/client_outage.py --up 30 --down 60

Writes ``benchmarks/results/client_outage.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results" / "client_outage.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(database_url: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "moeproxy.service.app:create_app", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env={**os.environ, "MOEPROXY_DATABASE_URL": database_url},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def _summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "median_ms": round(1000 * statistics.median(xs), 3),
        "p99_ms": round(1000 * xs[int(0.99 * (len(xs) - 1))], 3),
        "max_ms": round(1000 * xs[-1], 3),
    }


def run(up_s: float, down_s: float, step_ms: float, metrics: int) -> dict:
    from moeproxy import migrations
    from moeproxy.client import MetricsClient
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository

    work = Path(tempfile.mkdtemp(prefix="outage-"))
    url = f"sqlite:///{work / 'outage.db'}"
    migrations.upgrade(url)
    db = Database(url)
    with db.scope() as s:
        token = repository.create_token(s, "outage")[1]
    db.dispose()
    port = _free_port()
    server = _serve(url, port)
    client = MetricsClient(f"http://127.0.0.1:{port}", token, "outage", framework="verl",
                           spill_path=work / "spill.jsonl", close_timeout_s=120, register_atexit=False)
    names = [f"bench/m{i:02d}" for i in range(metrics)]
    phases: dict[str, dict[str, list[float]]] = {p: {"log": [], "step": []} for p in ("up", "down", "up again")}
    step = 0

    def loop(phase: str, seconds: float) -> None:
        nonlocal step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            time.sleep(step_ms / 1000)  # the step's work
            t1 = time.perf_counter()
            client.log(step, {n: step * 0.001 + i for i, n in enumerate(names)})
            t2 = time.perf_counter()
            phases[phase]["log"].append(t2 - t1)
            phases[phase]["step"].append(t2 - t0)
            step += 1

    try:
        loop("up", up_s)
        server.terminate()
        server.wait(30)
        loop("down", down_s)
        server = _serve(url, port)
        loop("up again", up_s)
        t_close = time.perf_counter()
        client.close()
        close_s = time.perf_counter() - t_close
        h = {"Authorization": f"Bearer {token}"}
        (listed,) = httpx.get(f"http://127.0.0.1:{port}/api/v1/runs", headers=h).json()["runs"]
        series = httpx.get(f"http://127.0.0.1:{port}/api/v1/runs/{listed['id']}/metrics", headers=h, timeout=60).json()["metrics"]
        stored = sum(len(v["steps"]) for v in series.values())
    finally:
        server.terminate()
        server.wait(30)
    return {
        "up_s": up_s, "down_s": down_s, "step_ms": step_ms, "metrics_per_step": metrics,
        "steps": step, "points_logged": step * metrics, "points_stored": stored,
        "points_lost": step * metrics - stored, "close_s": round(close_s, 2),
        "batches_spilled": client.stats["batches_spilled"],
        "phases": {p: {"log": _summary(v["log"]), "step": _summary(v["step"])} for p, v in phases.items()},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--up", type=float, default=30)
    ap.add_argument("--down", type=float, default=60)
    ap.add_argument("--step-ms", type=float, default=50)
    ap.add_argument("--metrics", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result = run(args.up, args.down, args.step_ms, args.metrics)
    result["command"] = " ".join(sys.argv)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
