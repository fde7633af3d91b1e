"""A real ``uvicorn`` serving the app in a child process, stoppable and restartable on the same port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UvicornProcess:
    def __init__(self, database_url: str, port: int | None = None, *, workers: int = 1,
                 env: dict[str, str] | None = None):
        self.database_url = database_url
        self.extra_env = dict(env or {})
        self.port = port or free_port()
        self.workers = workers
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> UvicornProcess:
        env = {**os.environ, "MOEPROXY_DATABASE_URL": self.database_url, **self.extra_env}
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "uvicorn", "--factory", "moeproxy.service.app:create_app",
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
                "--log-level", "warning",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("uvicorn did not become ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> UvicornProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def create_token(database_url: str, project: str) -> str:
    """A fresh bearer token of ``project`` in the database a server process will read."""
    from moeproxy.service.db import Database
    from moeproxy.service.tokens import repository

    db = Database(database_url)
    try:
        with db.scope() as s:
            return repository.create_token(s, project)[1]
    finally:
        db.dispose()
