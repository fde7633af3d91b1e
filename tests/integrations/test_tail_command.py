"""``moeproxy tail`` as a user runs it (the console script, its own process) against a real uvicorn
over SQLite, while a writer thread appends verl file-logger lines the way verl writes them: a line
seen half written, the file rotated and truncated under it, a stop by SIGTERM or Ctrl-C (SIGINT)
that sends what was written, a restart that sends only what the service lacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.importers.fixtures import verl_steps, write_verl_file_logger

MOEPROXY = [str(Path(sys.executable).parent / "moeproxy")]
POINTS_PER_STEP = 6  # verl_steps: five verl names and timing_s/step


class Tail:
    """A running ``moeproxy tail`` whose output lines are collected as they come."""

    def __init__(self, server, path: Path, *args: str) -> None:
        env = {**os.environ, "MOEPROXY_URL": server.url, "MOEPROXY_TOKEN": server.token}
        self.proc = subprocess.Popen([*MOEPROXY, "tail", str(path), "--poll-s", "0.1", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [threading.Thread(target=self._collect, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        return self.wait()

    def wait(self) -> int:
        code = self.proc.wait(timeout=60)
        for reader in self._readers:
            reader.join(10)
        return code

    def output(self) -> str:
        return "\n".join(self.stdout + self.stderr)


def _line(step: int, data: dict) -> bytes:
    # verl/utils/tracking.py FileLogger.log (as tests/importers/fixtures.write_verl_file_logger).
    return orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def _stored(server, run_name: str) -> dict[tuple[str, int], float]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30) as http:
        run = next((r for r in http.get("/api/v1/runs").json()["runs"] if r["name"] == run_name), None)
        if run is None:
            return {}
        metrics = http.get(f"/api/v1/runs/{run['id']}/metrics").json()["metrics"]
    return {(name, step): value for name, series in metrics.items()
            for step, value in zip(series["steps"], series["values"], strict=True)}


def _wait_for(what, predicate, timeout_s: float = 60.0, tail: Tail | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{tail.output()}" if tail else ""))


def _expected(steps) -> dict[tuple[str, int], float]:
    return {(name, step): float(value) for step, data in steps for name, value in data.items()}


def test_tail_follows_through_a_partial_line_rotation_and_truncation(sqlite_live_server, tmp_path):
    server, path = sqlite_live_server, tmp_path / "ppo.jsonl"
    steps = verl_steps(n_steps=51, seed=4)
    path.touch()  # verl's FileLogger opens the file at start, before the first step
    tail = Tail(server, path, "--run-name", "live-ppo", "--format", "verl_file")
    failure: list[BaseException] = []

    def has_steps(upto: int):
        return lambda: len(_stored(server, "live-ppo")) == upto * POINTS_PER_STEP

    def writer() -> None:
        try:
            with path.open("ab", buffering=0) as fp:
                for step, data in steps[:20]:
                    line = _line(step, data)
                    if step == 7:  # a reader on shared storage sees half a line, then the rest
                        fp.write(line[:25])
                        time.sleep(0.4)
                        fp.write(line[25:])
                    else:
                        fp.write(line)
                    time.sleep(0.01)
            _wait_for("steps 1-20", has_steps(20), tail=tail)
            os.rename(path, tmp_path / "ppo.jsonl.1")  # rotated: a new file under the same name
            write_verl_file_logger(path, steps[20:40])
            _wait_for("steps 21-40", has_steps(40), tail=tail)
            with path.open("wb", buffering=0) as fp:  # truncated in place: the job restarted with "wb"
                fp.write(b"".join(_line(step, data) for step, data in steps[40:50]))
            _wait_for("steps 41-50", has_steps(50), tail=tail)
            with path.open("ab", buffering=0) as fp:
                fp.write(_line(*steps[50])[:30])  # the job is killed mid-write
            time.sleep(0.3)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failure.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join(180)
    code = tail.stop(signal.SIGTERM)
    assert not failure, failure
    assert code == 0, tail.output()
    assert _stored(server, "live-ppo") == _expected(steps[:50])
    errors = "\n".join(tail.stderr)
    assert f"{path} was replaced (rotated): following the new file from its start" in errors
    assert f"{path} was truncated" in errors and "reading it again from its start" in errors
    assert f"{path}: line 11 is incomplete (30 bytes, no newline); stopped: it is not sent" in errors
    assert "SIGTERM: sending what is left, then stopping" in errors
    assert tail.stdout[-1] == ("stopped: run 1 'live-ppo' (framework verl): 300 points of 50 steps sent, "
                               "0 already stored")


def test_a_restarted_tail_sends_only_what_is_missing_and_from_start_sends_all(sqlite_live_server, tmp_path):
    server = sqlite_live_server
    steps = verl_steps(n_steps=15, seed=6)
    half = write_verl_file_logger(tmp_path / "half.jsonl", steps[:5])
    env = {**os.environ, "MOEPROXY_URL": server.url, "MOEPROXY_TOKEN": server.token}
    imported = subprocess.run([*MOEPROXY, "import", str(half), "--run-name", "grpo"], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert imported.returncode == 0, imported.stderr
    path = write_verl_file_logger(tmp_path / "grpo.jsonl", steps[:10])
    tail = Tail(server, path)  # the run name from the file, the format detected
    _wait_for("steps 1-10", lambda: len(_stored(server, "grpo")) == 10 * POINTS_PER_STEP, tail=tail)
    with path.open("ab") as fp:
        fp.write(b"".join(_line(step, data) for step, data in steps[10:]))
    _wait_for("steps 11-15", lambda: len(_stored(server, "grpo")) == 15 * POINTS_PER_STEP, tail=tail)
    assert tail.stop(signal.SIGINT) == 0, tail.output()
    assert _stored(server, "grpo") == _expected(steps)
    assert tail.stdout[0].startswith(f"following {path} (verl_file) into run 'grpo'")
    assert "steps 6-10: 30 points" in tail.stdout and "steps 11-15: 30 points" in tail.stdout
    assert tail.stdout[-1] == "stopped: run 1 'grpo' (framework verl): 60 points of 10 steps sent, 30 already stored"

    again = Tail(server, path, "--from-start")
    _wait_for("the first read", lambda: "steps 1-15: 90 points" in again.stdout, tail=again)
    assert again.stop(signal.SIGINT) == 0, again.output()
    assert again.stdout[-1] == ("stopped: run 1 'grpo' (framework verl): 90 points of 15 steps sent, "
                                "0 already stored")


def test_a_bad_line_stops_the_tail_after_the_lines_before_it(sqlite_live_server, tmp_path):
    server = sqlite_live_server
    steps = verl_steps(n_steps=3)
    path = write_verl_file_logger(tmp_path / "bad.jsonl", steps)
    with path.open("ab") as fp:
        fp.write(b'{"step": 4, "data": oops}\n')
    tail = Tail(server, path)
    assert tail.wait() == 2, tail.output()
    assert f"{path}: line 4: not JSON" in "\n".join(tail.stderr)
    assert "the lines before it were sent" in "\n".join(tail.stderr)
    assert _stored(server, "bad") == _expected(steps)


@pytest.mark.parametrize(("make", "args", "message"), [
    (lambda p: p.write_text("step,loss\n0,1.0\n"), (), "tail follows a format of one record a line"),
    (lambda p: p.touch(), (), "is empty: give --format (verl_file, verl_console) to wait for it"),
    (lambda p: None, ("--format", "csv"), "not 'csv'; use moeproxy import for a finished file"),
])
def test_what_tail_cannot_follow_is_refused(sqlite_live_server, tmp_path, make, args, message):
    path = tmp_path / "run.csv"
    make(path)
    tail = Tail(sqlite_live_server, path, *args)
    assert tail.wait() == 2 and message in "\n".join(tail.stderr), tail.output()
