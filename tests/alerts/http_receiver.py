"""A real HTTP server on a free local port standing in for Slack / a webhook receiver.

It answers from a script (status, headers) one request at a time, then 200 "ok", and records
every request it saw with the time it arrived and the status it answered.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    at: float
    path: str
    body: Any
    status: int


@dataclass
class Receiver:
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    status, headers = receiver.script.pop(0) if receiver.script else (200, {})
                    receiver.seen.append(
                        Seen(time.monotonic(), self.path, json.loads(raw or b"null"), status)
                    )
                body = b"ok" if status == 200 else f"error {status}".encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    @property
    def accepted(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.status == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
