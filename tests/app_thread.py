"""The real app served by a real uvicorn on a thread of the test process, on a free local port.

For tests that must change something inside the app (monkeypatch a function) or read its state
while it serves real sockets; ``tests/service/uvicorn_process.py`` is the child-process variant.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn


@dataclass
class ThreadedServer:
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve_in_thread(app, *, log_level: str = "warning") -> ThreadedServer:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return ThreadedServer(port, server, thread)
