"""Import speed of a TensorBoard run into the service (issue 19): ``moeproxy import`` of a
1,000,000-point event directory (20 scalar tags x 50,000 steps by default), written with torch's
``SummaryWriter``, into a real ``moeproxy serve`` on a scratch SQLite file (the embedded default).

The figure is points / wall seconds of the ``moeproxy import`` process, as a user runs it (reading
the event file, posting the missing points, checking the server's per-metric counts), the median of
``--repeat`` imports, each into a fresh server and database. To say where the
time goes, the same directory is then read alone in this process (``read_source``), and the
upload alone is the difference. Prints one JSON object and writes
``benchmarks/results/import_tensorboard.json``. Run it niced on a shared machine:

    nice -n 19 python benchmarks/import_tensorboard.py
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

RESULTS = Path(__file__).resolve().parent / "results" / "import_tensorboard.json"
MOEPROXY = str(Path(sys.executable).parent / "moeproxy")
# Names a verl run logs, so the import detects the framework as it would for a real run.
VERL_TAGS = ("critic/score/mean", "critic/rewards/mean", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
             "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "response_length/mean", "timing_s/step")


def tag_names(n_tags: int) -> list[str]:
    return [VERL_TAGS[i] if i < len(VERL_TAGS) else f"custom/metric_{i}" for i in range(n_tags)]


def write_event_dir(folder: Path, n_tags: int, n_steps: int) -> float:
    """Seconds SummaryWriter took to write ``n_tags x n_steps`` scalars into ``folder``."""
    from torch.utils.tensorboard import SummaryWriter

    started = time.perf_counter()
    writer = SummaryWriter(str(folder), max_queue=1000, flush_secs=30)
    names = tag_names(n_tags)
    for step in range(n_steps):
        for i, name in enumerate(names):
            writer.add_scalar(name, 0.001 * step + i, step)
    writer.close()
    return time.perf_counter() - started


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "MOEPROXY_DATABASE_URL": f"sqlite:///{workdir / 'service.db'}"}
    subprocess.run([MOEPROXY, "db", "upgrade"], env=env, check=True, capture_output=True)
    token = subprocess.run([MOEPROXY, "token", "create", "--project", "bench"], env=env, check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
    port = _free_port()
    server = subprocess.Popen([MOEPROXY, "serve", "--port", str(port), "--no-upgrade", "--log-level", "warning"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return server, url, token
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.terminate()
    raise SystemExit("the server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--events", type=Path, default=None,
                        help="Reuse (or write once into) this event directory instead of a scratch one.")
    parser.add_argument("--repeat", type=int, default=3,
                        help="Imports, each into a fresh server and database; the figure is their median.")
    args = parser.parse_args()
    points = args.tags * args.steps
    imports, reads = [], []
    with tempfile.TemporaryDirectory(prefix="moeproxy-import-bench-") as scratch:
        events = args.events or Path(scratch) / "runs" / "tb-bench"
        write_s = None
        if not any(events.glob("events.out.tfevents.*")):
            write_s = write_event_dir(events, args.tags, args.steps)
        from moeproxy.importers import read_source

        for i in range(args.repeat):
            workdir = Path(scratch) / f"server-{i}"
            workdir.mkdir()
            server, url, token = start_server(workdir)
            try:
                started = time.perf_counter()
                done = subprocess.run([MOEPROXY, "import", str(events), "--run-name", "tb-bench", "--url", url,
                                       "--token", token], capture_output=True, text=True, check=False)
                imports.append(time.perf_counter() - started)
            finally:
                server.terminate()
                server.wait(30)
            if done.returncode != 0:
                raise SystemExit(f"moeproxy import failed: {done.stderr}")
            if f"{points} points sent" not in done.stdout:
                raise SystemExit(f"expected {points} points sent; import said {done.stdout!r}")
            started = time.perf_counter()
            run = read_source(events)
            reads.append(time.perf_counter() - started)
            if run.n_points != points:
                raise SystemExit(f"expected {points} points; read {run.n_points}")
        # Side by side (the box's speed drifts by up to 2x within minutes): our reader, then
        # tensorboard's own EventAccumulator, on the same directory, one right after the other.
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        side = {}
        for label in ("moeproxy", "event_accumulator", "moeproxy_again"):
            started = time.perf_counter()
            if label.startswith("moeproxy"):
                read_source(events)
            else:
                EventAccumulator(str(events), size_guidance={"scalars": 0, "tensors": 0}).Reload()
            side[label] = time.perf_counter() - started
    import_s, read_s = statistics.median(imports), statistics.median(reads)
    ours = (side["moeproxy"] + side["moeproxy_again"]) / 2
    result = {
        "points": points, "tags": args.tags, "steps": args.steps, "repeats": args.repeat,
        "import_wall_s": round(import_s, 2), "points_per_s": round(points / import_s),
        "import_wall_s_each": [round(x, 2) for x in imports],
        "read_alone_s": round(read_s, 2), "read_points_per_s": round(points / read_s),
        "upload_and_verify_s_estimate": round(import_s - read_s, 2),
        "read_side_by_side_s": {k: round(v, 2) for k, v in side.items()},
        "read_speedup_vs_event_accumulator": round(side["event_accumulator"] / ours, 2),
        "summary_writer_s": None if write_s is None else round(write_s, 2),
        "import_output": done.stdout.strip().splitlines(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average": [round(x, 2) for x in os.getloadavg()]},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
