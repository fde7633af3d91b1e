"""Soak: many writers for a long time against the real service on PostgreSQL, loopback only (issue 16).

What runs at once, for ``--duration`` seconds:

* ``--writers`` jobs, half through the real ``MetricsClient`` (each logging ``--steps-per-s`` steps
  a second) and half as raw HTTP (a batch of 10 steps, one request at a time, timed);
* live triage on (the default app), evaluating the runs as their metrics arrive;
* a page poller logged in with a project token, reading the runs list and one run page each second;
* ``--slow-bodies`` clients that send a metrics request's headers and a few body bytes, then
  nothing, reopened as the server drops them;
* RSS of the server (master and workers, from /proc) sampled every second.

At the end every run's points are counted through the API against what was sent. Figures:
points/s, p50/p99 of the raw batches, server errors seen, points lost, RSS growth after warm-up
(the first fifth of the run). The per-address rate limit is off here (every writer comes from
127.0.0.1); the per-token limit stays on (one token per writer).

    nice -n 10 python benchmarks/soak.py --duration 600 --writers 32 --workers 2

``--steps-per-run N`` starts a new run every N steps instead of one run per writer: with bounded
runs, state that grows with a run's length (live triage reads the whole run) is told from a leak.

Writes ``benchmarks/results/soak.json``. ``tests/service/test_soak.py`` runs a 30-second version
in CI and checks the counts (0 lost, 0 server errors), not the times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import DEFAULT_PG, Server, _drop_postgres, _prepare_postgres  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
METRICS = ("actor/entropy", "actor/grad_norm", "actor/kl_loss", "actor/pg_loss", "critic/score/mean",
           "response_length/mean", "training/rollout_probs_diff_mean", "actor/lr")


def _values(step: int, seed: int) -> dict[str, float]:
    return {m: ((step * 31 + seed * 7 + i) % 97) / 97.0 for i, m in enumerate(METRICS)}


def _tokens(database_url: str, n: int) -> list[str]:
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository

    db = Database(database_url)
    try:
        with db.scope() as s:
            return [repository.create_token(s, "soak", label=f"writer-{i}")[1] for i in range(n)]
    finally:
        db.dispose()


def _rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (uvicorn's workers), from /proc."""
    total = 0.0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}  # run name -> steps sent
        self.latencies: list[float] = []
        self.server_errors = 0
        self.statuses: dict[int, int] = {}

    def status(self, code: int) -> None:
        with self.lock:
            self.statuses[code] = self.statuses.get(code, 0) + 1
            if code >= 500:
                self.server_errors += 1


def _run_names(name: str, steps_per_run: int):
    """The writer's run names: one run for the whole soak, or a new run every ``steps_per_run``."""
    if not steps_per_run:
        yield name
        return
    k = 0
    while True:
        yield f"{name}-{k}"
        k += 1


def _client_writer(url: str, token: str, name: str, stop: threading.Event, rate: float, stats: Stats, spill: Path,
                   steps_per_run: int = 0):
    from moeproxy.client import MetricsClient

    period = 1.0 / rate
    for run_name in _run_names(name, steps_per_run):
        client = MetricsClient(url, token, run_name, framework="verl", flush_interval_s=1.0,
                               spill_path=spill.with_name(f"{run_name}.jsonl"), close_timeout_s=120,
                               register_atexit=False)
        step = 0
        while not stop.is_set() and not (steps_per_run and step >= steps_per_run):
            client.log(step, _values(step, hash(name) % 1000))
            step += 1
            stop.wait(period)
        client.close()
        with stats.lock:
            stats.sent[run_name] = step
        if stop.is_set():
            return


def _raw_writer(url: str, token: str, name: str, stop: threading.Event, stats: Stats, steps_per_run: int = 0):
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for run_name in _run_names(name, steps_per_run):
            run_id = http.post("/api/v1/runs", json={"name": run_name, "framework": "verl"}).json()["id"]
            step = 0
            while not stop.is_set() and not (steps_per_run and step >= steps_per_run):
                body = {"steps": [{"step": s, "values": _values(s, 1)} for s in range(step, step + 10)]}
                t0 = time.perf_counter()
                reply = http.post(f"/api/v1/runs/{run_id}/metrics", json=body)
                stats.status(reply.status_code)
                if reply.status_code == 200:
                    with stats.lock:
                        stats.latencies.append(time.perf_counter() - t0)
                    step += 10
                elif reply.status_code in (429, 503):
                    stop.wait(float(reply.headers.get("retry-after", "1")))
            with stats.lock:
                stats.sent[run_name] = step
            if stop.is_set():
                return


def _page_poller(url: str, token: str, stop: threading.Event, stats: Stats):
    with httpx.Client(base_url=url, timeout=60) as browser:
        browser.post("/login", data={"token": token})
        while not stop.is_set():
            listing = browser.get("/")
            stats.status(listing.status_code)
            ids = [part.split('"')[0] for part in listing.text.split('href="/runs/')[1:]]
            if ids:
                stats.status(browser.get(f"/runs/{ids[0]}").status_code)
            stop.wait(1.0)


def _slow_bodies(port: int, token: str, n: int, stop: threading.Event):
    socks: list[socket.socket] = []
    head = (f"POST /api/v1/runs/1/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"st").encode()
    while not stop.is_set():
        socks = [s for s in socks if s.fileno() != -1]
        while len(socks) < n:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head)
            socks.append(s)
        for s in list(socks):
            s.setblocking(False)
            try:
                if s.recv(4096) == b"":  # the server answered 408 and closed: open another
                    s.close()
            except BlockingIOError:
                pass
            except OSError:
                s.close()
        stop.wait(1.0)
    for s in socks:
        s.close()


def run(duration_s: float, writers: int, workers: int, steps_per_s: float, slow_bodies: int,
        base_url: str = DEFAULT_PG, steps_per_run: int = 0) -> dict:
    database_url, schema = _prepare_postgres(base_url)
    from moeproxy import migrations

    migrations.upgrade(database_url)
    tokens = _tokens(database_url, writers + 1)
    previous = os.environ.get("MOEPROXY_RATE_LIMIT_PER_ADDRESS")
    os.environ["MOEPROXY_RATE_LIMIT_PER_ADDRESS"] = "0"  # the server process reads it at start
    try:
        server = Server(database_url, workers, full_app=True)
    finally:
        if previous is None:
            os.environ.pop("MOEPROXY_RATE_LIMIT_PER_ADDRESS")
        else:
            os.environ["MOEPROXY_RATE_LIMIT_PER_ADDRESS"] = previous
    stats, stop = Stats(), threading.Event()
    rss: list[tuple[float, float]] = []
    spill_dir = Path(tempfile.mkdtemp(prefix="soak-spill-"))
    threads = []
    try:
        for i in range(writers):
            name = f"soak-{'client' if i % 2 == 0 else 'raw'}-{i}"
            if i % 2 == 0:
                t = threading.Thread(target=_client_writer, args=(server.url, tokens[i], name, stop, steps_per_s,
                                                                  stats, spill_dir / f"{name}.jsonl", steps_per_run))
            else:
                t = threading.Thread(target=_raw_writer, args=(server.url, tokens[i], name, stop, stats, steps_per_run))
            threads.append(t)
        threads.append(threading.Thread(target=_page_poller, args=(server.url, tokens[-1], stop, stats)))
        threads.append(threading.Thread(target=_slow_bodies, args=(server.port, tokens[-1], slow_bodies, stop)))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while time.monotonic() - t0 < duration_s:
            rss.append((round(time.monotonic() - t0, 1), round(_rss_mb(server.proc.pid), 1)))
            time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(180)
        elapsed = time.monotonic() - t0
        # Count what arrived, run by run, through the API.
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        runs: list[dict] = []
        while True:  # every page: with --steps-per-run a soak makes thousands of runs
            page = httpx.get(f"{server.url}/api/v1/runs?limit=500&offset={len(runs)}", headers=headers,
                             timeout=60).json()
            runs += page["runs"]
            if not page["runs"] or len(runs) >= page["total"]:
                break
        lost = 0
        duplicated = 0
        for r in runs:
            series = httpx.get(f"{server.url}/api/v1/runs/{r['id']}/metrics", headers=headers, timeout=120).json()["metrics"]
            sent = stats.sent.get(r["name"], 0)
            for m in METRICS:
                got = series.get(m, {}).get("steps", [])
                lost += max(0, sent - len(set(got)))
                duplicated += len(got) - len(set(got))
        missing_runs = sorted(set(stats.sent) - {r["name"] for r in runs})
    finally:
        stop.set()
        server.stop()
        _drop_postgres(base_url, schema)
    points = sum(stats.sent.values()) * len(METRICS)
    warm = [m for t, m in rss if t >= duration_s / 5]
    lat = sorted(stats.latencies)
    return {
        "duration_s": round(elapsed, 1),
        "writers": writers,
        "workers": workers,
        "steps_per_s_per_client": steps_per_s,
        "slow_body_clients": slow_bodies,
        "steps_per_run": steps_per_run or None,
        "runs": len(stats.sent),
        "points_sent": points,
        "points_per_s": round(points / elapsed),
        "raw_batch_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "raw_batch_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "server_errors": stats.server_errors,
        "points_lost": lost,
        "points_duplicated": duplicated,
        "runs_missing": missing_runs,
        "rss_mb_after_warmup": [warm[0], warm[-1]] if warm else None,
        "rss_growth_after_warmup": round(warm[-1] / warm[0] - 1, 3) if warm else None,
        "rss_mb": rss,
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--writers", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps-per-s", type=float, default=5.0, help="steps a MetricsClient writer logs each second")
    ap.add_argument("--slow-bodies", type=int, default=4)
    ap.add_argument("--database-url", default=DEFAULT_PG)
    ap.add_argument("--steps-per-run", type=int, default=0,
                    help="start a new run every N steps (0: one run per writer for the whole soak); bounded runs "
                         "tell state that grows with a run's length from a leak")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    result = run(args.duration, args.writers, args.workers, args.steps_per_s, args.slow_bodies, args.database_url,
                 args.steps_per_run)
    result["malloc_arena_max"] = os.environ.get("MALLOC_ARENA_MAX")  # glibc's arenas (docs/reliability.md)
    result["command"] = " ".join(sys.argv)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rss_mb"}, indent=1))


if __name__ == "__main__":
    main()
