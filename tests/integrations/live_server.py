"""A real uvicorn serving the real app on a free local port, over a migrated scratch SQLite file."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.tokens import repository as tokens

from moeproxy import migrations
from moeproxy.config import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    token: str
    database: Database
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.database.dispose()


def start_live_server(url: str, *, project: str = "rl-team", **settings) -> LiveServer:
    """Serve ``url`` (an upgraded database; upgraded again here, a no-op at head)."""
    migrations.upgrade(url)
    database = Database(url)
    with database.scope() as session:
        _row, token = tokens.create_token(session, project)
    app = create_app(Settings(database_url=url, **settings), database=database)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return LiveServer(f"http://127.0.0.1:{port}", token, database, server, thread)
