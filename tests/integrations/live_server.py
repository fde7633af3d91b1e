"""A real uvicorn serving the real app on a free local port, over a migrated scratch SQLite file."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import uvicorn
from app_thread import serve_in_thread
from moeproxy.service.app import create_app
from moeproxy.service.db import Database
from moeproxy.service.tokens import repository as tokens

from moeproxy import migrations
from moeproxy.config import Settings


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
    served = serve_in_thread(app)
    return LiveServer(served.url, token, database, served.server, served.thread)
