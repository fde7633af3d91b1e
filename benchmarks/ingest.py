"""Ingestion benchmark: N concurrent writers posting metric batches over real HTTP to a real uvicorn.

For each backend (PostgreSQL, SQLite) and each repeat, side by side:

* ``http``: N writer processes, each posting ``batches`` batches of
  ``steps x metrics`` points to its own run through ``POST /api/v1/runs/{id}/metrics``
  on a uvicorn with ``--workers W``; bodies are JSON-encoded before the clock
  starts (the server is what is measured), one request at a time per writer;
* ``direct``: the same points written by N processes straight into the same
  tables with the fastest plain method, one transaction per batch like the
  HTTP path: psycopg binary ``COPY`` (PostgreSQL), ``executemany`` (SQLite).

It prints points/s and p50/p99 batch latency, the HTTP/direct ratio per repeat,
and writes ``benchmarks/results/ingest.json``.  Run it niced on a shared machine:

    nice -n 10 python benchmarks/ingest.py --writers 8 --workers 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


# ----------------------------------------------------------------------------- setup


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_parts(url: str) -> dict:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return {"host": u.host, "port": u.port or 5432, "user": u.username, "password": u.password, "dbname": u.database}


def _prepare_postgres(base_url: str) -> tuple[str, str]:
    import psycopg
    from sqlalchemy.engine import make_url

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**_pg_parts(base_url), autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), schema


def _drop_postgres(base_url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(**_pg_parts(base_url), autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _token(database_url: str) -> str:
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository

    db = Database(database_url)
    try:
        with db.scope() as s:
            return repository.create_token(s, "bench")[1]
    finally:
        db.dispose()


def ingest_only_app():
    """The service app without lifespan hooks (the live triage job): this benchmark measures ingestion."""
    from moeproxy.service import app as service_app

    service_app.LIFESPAN_HOOKS = ()
    return service_app.create_app()


class Server:
    def __init__(self, database_url: str, workers: int, *, full_app: bool = False):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MOEPROXY_DATABASE_URL": database_url}
        factory = ["moeproxy.service.app:create_app"] if full_app else [
            "--app-dir", str(Path(__file__).resolve().parent), "ingest:ingest_only_app"
        ]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", *factory, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(workers), "--log-level", "warning", "--no-access-log"],
            env=env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


# ----------------------------------------------------------------------------- workload


def _batch_steps(batch: int, steps: int, metrics: int, seed: int) -> list[dict]:
    import random

    rng = random.Random(seed * 1_000_003 + batch)
    names = [f"bench/metric_{m:02d}" for m in range(metrics)]
    return [
        {"step": batch * steps + s, "values": {n: rng.random() for n in names}}
        for s in range(steps)
    ]


def _http_writer(args: tuple) -> dict:
    url, token, run_id, batches, steps, metrics, seed, start_at = args
    bodies = [json.dumps({"steps": _batch_steps(b, steps, metrics, seed)}).encode() for b in range(batches)]
    latencies = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}, timeout=60) as http:
        http.get("/healthz")  # open the connection before the clock
        while time.time() < start_at:
            time.sleep(0.001)
        begin = time.time()
        for body in bodies:
            t0 = time.perf_counter()
            response = http.post(f"/api/v1/runs/{run_id}/metrics", content=body)
            latencies.append(time.perf_counter() - t0)
            response.raise_for_status()
    return {"begin": begin, "end": time.time(), "latencies": latencies}


def _direct_writer(args: tuple) -> dict:
    backend, database_url, run_id, batches, steps, metrics, seed, start_at = args
    from moeproxy.service.db import Database
    from moeproxy.service.metrics.repository import resolve_metric_ids

    db = Database(database_url)
    names = [f"bench/metric_{m:02d}" for m in range(metrics)]
    with db.scope() as s:
        ids = resolve_metric_ids(s, run_id, names)
    rows_per_batch = [
        [(ids[n], entry["step"], v) for entry in _batch_steps(b, steps, metrics, seed) for n, v in entry["values"].items()]
        for b in range(batches)
    ]
    latencies = []
    if backend == "postgres":
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(database_url)
        conn = psycopg.connect(**_pg_parts(database_url), options=u.query.get("options"))
        while time.time() < start_at:
            time.sleep(0.001)
        begin = time.time()
        for rows in rows_per_batch:
            t0 = time.perf_counter()
            with conn.cursor() as cur, cur.copy("COPY metric_points (metric_id, step, value) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(["int4", "int8", "float8"])
                for row in rows:
                    cp.write_row(row)
            conn.commit()
            latencies.append(time.perf_counter() - t0)
        end = time.time()
        conn.close()
    else:
        import sqlite3

        from sqlalchemy.engine import make_url

        conn = sqlite3.connect(make_url(database_url).database, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        while time.time() < start_at:
            time.sleep(0.001)
        begin = time.time()
        for rows in rows_per_batch:
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO metric_points (metric_id, step, value) VALUES (?, ?, ?)", rows)
            conn.execute("COMMIT")
            latencies.append(time.perf_counter() - t0)
        end = time.time()
        conn.close()
    db.dispose()
    return {"begin": begin, "end": end, "latencies": latencies}


def _create_runs(url: str, token: str, prefix: str, n: int) -> list[int]:
    h = {"Authorization": f"Bearer {token}"}
    return [httpx.post(f"{url}/api/v1/runs", json={"name": f"{prefix}-{i}"}, headers=h).json()["id"] for i in range(n)]


def _measure(pool: mp.pool.Pool, fn, arg_rows: list[tuple], points: int) -> dict:
    """Wall time from the first writer's start to the last one's end (setup excluded)."""
    results = pool.map(fn, arg_rows)
    start_at = arg_rows[0][-1]
    late = max(r["begin"] for r in results) - start_at
    if late > 0.1:
        print(f"  warning: a writer started {late:.2f} s late (slow setup); the writers overlapped less", flush=True)
    wall = max(r["end"] for r in results) - min(r["begin"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    return {
        "points": points,
        "wall_s": wall,
        "points_per_s": points / wall,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "latencies_ms": [1000 * x for x in lat],
    }


def bench_backend(backend: str, database_url: str, args) -> dict:
    from moeproxy import migrations

    migrations.upgrade(database_url)
    token = _token(database_url)
    workers = args.workers if backend == "postgres" else args.sqlite_workers
    server = Server(database_url, workers, full_app=args.full_app)
    points = args.writers * args.batches * args.steps * args.metrics
    repeats = []
    try:
        with mp.get_context("spawn").Pool(args.writers) as pool:
            # warm-up on both paths: imports done in the pool processes, connections open, caches warm
            warm_runs = _create_runs(server.url, token, "warm", args.writers)
            pool.map(_http_writer, [(server.url, token, r, 2, args.steps, args.metrics, i, 0.0) for i, r in enumerate(warm_runs)])
            warm_direct = _create_runs(server.url, token, "warm-direct", args.writers)
            pool.map(_direct_writer, [(backend, database_url, r, 2, args.steps, args.metrics, i, 0.0) for i, r in enumerate(warm_direct)])
            for rep in range(args.repeats):
                http_runs = _create_runs(server.url, token, f"http-{rep}", args.writers)
                direct_runs = _create_runs(server.url, token, f"direct-{rep}", args.writers)
                start = time.time() + 3.0
                http = _measure(
                    pool, _http_writer,
                    [(server.url, token, r, args.batches, args.steps, args.metrics, i, start) for i, r in enumerate(http_runs)],
                    points,
                )
                start = time.time() + 3.0
                direct = _measure(
                    pool, _direct_writer,
                    [(backend, database_url, r, args.batches, args.steps, args.metrics, i, start) for i, r in enumerate(direct_runs)],
                    points,
                )
                ratio = http["points_per_s"] / direct["points_per_s"]
                print(
                    f"{backend:8s} repeat {rep}: http {http['points_per_s']:>10,.0f} pts/s  p50 {http['p50_ms']:6.1f} ms"
                    f"  p99 {http['p99_ms']:6.1f} ms | direct {direct['points_per_s']:>10,.0f} pts/s"
                    f"  p50 {direct['p50_ms']:6.1f} ms | http/direct {ratio:.2f}",
                    flush=True,
                )
                repeats.append({"http": http, "direct": direct, "ratio": ratio})
    finally:
        server.stop()
    all_http_lat = sorted(x for r in repeats for x in r["http"]["latencies_ms"])
    for r in repeats:
        r["http"].pop("latencies_ms")
        r["direct"].pop("latencies_ms")
    summary = {
        "uvicorn_workers": workers,
        "http_points_per_s_median": statistics.median(r["http"]["points_per_s"] for r in repeats),
        "direct_points_per_s_median": statistics.median(r["direct"]["points_per_s"] for r in repeats),
        "ratio_median": statistics.median(r["ratio"] for r in repeats),
        "http_p50_ms_all": all_http_lat[len(all_http_lat) // 2],
        "http_p99_ms_all": all_http_lat[min(len(all_http_lat) - 1, int(len(all_http_lat) * 0.99))],
        "repeats": repeats,
    }
    print(
        f"{backend:8s} MEDIAN: http {summary['http_points_per_s_median']:,.0f} pts/s, direct "
        f"{summary['direct_points_per_s_median']:,.0f} pts/s, ratio {summary['ratio_median']:.2f}, "
        f"p50 {summary['http_p50_ms_all']:.1f} ms, p99 {summary['http_p99_ms_all']:.1f} ms",
        flush=True,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--batches", type=int, default=10, help="batches per writer per repeat")
    parser.add_argument("--steps", type=int, default=100, help="steps per batch")
    parser.add_argument("--metrics", type=int, default=20, help="metrics per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers for PostgreSQL")
    parser.add_argument("--sqlite-workers", type=int, default=1, help="uvicorn workers for SQLite (one writer at a time)")
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--full-app", action="store_true", help="serve the whole app, live triage job included")
    parser.add_argument("--postgres-url", default=os.environ.get("MOEPROXY_TEST_POSTGRES_URL", DEFAULT_PG))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "workload": {k: getattr(args, k) for k in ("writers", "batches", "steps", "metrics", "repeats", "full_app")},
        "backends": {},
    }
    for backend in args.backends.split(","):
        if backend == "postgres":
            url, schema = _prepare_postgres(args.postgres_url)
            try:
                result["backends"]["postgres"] = bench_backend("postgres", url, args)
            finally:
                _drop_postgres(args.postgres_url, schema)
        elif backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                result["backends"]["sqlite"] = bench_backend("sqlite", f"sqlite:///{tmp}/bench.db", args)
        else:
            raise SystemExit(f"unknown backend {backend}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
