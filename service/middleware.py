"""What every HTTP exchange gets at the edge: an unexpected error answered without dropping the
connection, security headers, and no secrets in the access log."""

from __future__ import annotations

import logging
import re

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect

log = logging.getLogger("moeproxy.service")

# The pages' own policy: scripts and styles from this origin only (plotly.js is served locally;
# its SVG plots set inline styles), no framing, forms post back here only.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# FastAPI's /docs and /redoc load Swagger UI / ReDoc from a CDN with an inline script: those pages
# keep their sources and only refuse to be framed.
DOCS_PATHS = ("/docs", "/redoc")
DOCS_CSP = "frame-ancestors 'none'"


def header(scope, name: bytes) -> bytes | None:
    """A request header's raw value from an ASGI scope (names are lower-case there)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


async def send_json(send, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer from inside a middleware, before or instead of the app: a JSON body, its length."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class UnexpectedErrors:
    """ASGI middleware: an exception no handler took becomes a JSON 500 here, and is not re-raised.

    Starlette's outermost error middleware answers 500 *and re-raises*, and uvicorn then closes the
    connection, so every 500 cost the client its keep-alive connection (and a reconnect under
    load). Caught here, inside that middleware, the 500 is an ordinary response. An exception after
    the response started cannot be answered any more: it propagates as before.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # the client went away mid-body: nobody to answer, nothing went wrong here
        except Exception:
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await send_json(send, 500, b'{"detail":"internal server error"}')


class SecurityHeaders:
    """ASGI middleware: ``nosniff``, a same-origin referrer, and a Content-Security-Policy with
    ``frame-ancestors 'none'`` (clickjacking) on every response; HTML pages get the full policy."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope.get("path", "").startswith(DOCS_PATHS)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("Referrer-Policy", "same-origin")
                headers.setdefault("X-Frame-Options", "DENY")
                html = headers.get("content-type", "").startswith("text/html")
                headers.setdefault("Content-Security-Policy", PAGE_CSP if html and not docs else DOCS_CSP)
            await send(message)

        await self.app(scope, receive, with_headers)


_SECRET_QUERY = re.compile(r"(?i)\b(token|code)=[^&\s\"]*")


class RedactSecrets(logging.Filter):
    """Access-log filter: ``token=`` and ``code=`` query values are written as ``[redacted]``.

    The pages accept no secret in a URL, but a user may still paste one; it must not be kept in
    the log that every request is written to.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _SECRET_QUERY.sub(r"\1=[redacted]", a) if isinstance(a, str) else a for a in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = _SECRET_QUERY.sub(r"\1=[redacted]", record.msg)
        return True


def install_log_redaction() -> None:
    """Add the filter to uvicorn's access logger once (idempotent: apps are created per worker and per test)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactSecrets) for f in access.filters):
        access.addFilter(RedactSecrets())
