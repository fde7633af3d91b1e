"""What the database columns can hold, checked at the edge of the service.

A value that does not fit a column fails inside the INSERT or the WHERE (PostgreSQL: "integer out
of range", "value too long", "cannot contain NUL"), which the client sees as a 500 and retries.
Every request field that reaches a column is checked here first and answered with a 4xx instead.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from pydantic import AfterValidator
from moeproxy.service.middleware import header
from starlette.exceptions import HTTPException

INT32_MAX = 2**31 - 1  # Integer primary keys: runs.id, mlflow_experiments.id, ...
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # BigInteger columns: steps, MLflow times

# Bodies other than a metrics batch are small: a run, a token request, an MLflow call. MLflow's
# own server refuses log-batch requests over 1 MB (mlflow/utils/validation.py).
MAX_BODY_BYTES = 1024 * 1024
MAX_CONFIG_BYTES = 256 * 1024  # a run's config as JSON: a verl/TRL config is a few KB


def fits_id(value: int) -> bool:
    """Whether ``value`` can be a row id at all (a larger one is simply absent, never an error)."""
    return 0 < value <= INT32_MAX


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored in a text column, or None.

    PostgreSQL text cannot hold NUL, and no driver can encode a lone surrogate (a ``"\\ud800"``
    escape that JSON allows).
    """
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def data_error_message(exc: Exception) -> str:
    """The client-facing detail of a database DataError (a value that does not fit its column).

    The checks above should leave none; this is the net under them, so that one missed field
    is a 4xx naming the problem rather than a 500 the client retries forever.
    """
    cause = getattr(exc, "orig", None) or exc
    first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    return f"a value does not fit the database: {first_line[:200]}"


def _storable(text: str) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(f"{text[:40]!r} {problem}")
    return text


def _small_json(value: Any) -> Any:
    # Measured as the client would send it; a lone surrogate inside is refused here too.
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("contains a string that is not valid Unicode (a lone surrogate)") from None
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{size:,} bytes as JSON; the limit is {MAX_CONFIG_BYTES:,}")
    return value


# A string that reaches a text column; use with a Field(max_length=...) of that column's length.
StoredText = Annotated[str, AfterValidator(_storable)]
# A JSON object stored in a JSON column (a run's config): bounded in size.
SmallJson = Annotated[dict[str, Any], AfterValidator(_small_json)]


BODY_LIMIT_SCOPE_KEY = "moeproxy.max_body_bytes"


class BodyLimits:
    """ASGI middleware: every request body within a size limit and a read deadline.

    The limit is ``MAX_BODY_BYTES`` unless the route raised it for its request (the metrics route
    sets ``scope[BODY_LIMIT_SCOPE_KEY]`` before it streams a batch of up to 64 MiB); it is checked
    against ``Content-Length`` before anything is read and against the bytes as they arrive
    (chunked bodies). A body that does not arrive within ``deadline_s`` is a 408: a client that
    sends headers and then nothing holds no worker, session or lock for longer.

    The errors are raised from ``receive`` as HTTPExceptions, the one kind FastAPI's body parser
    passes through unchanged, so each route answers them in its own shape (MLflow's included).
    """

    def __init__(self, app, *, deadline_s: float):
        self.app = app
        self.deadline_s = deadline_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault(BODY_LIMIT_SCOPE_KEY, MAX_BODY_BYTES)
        declared = _content_length(scope)
        received = 0
        deadline: float | None = None
        body_done = False

        async def limited_receive():
            nonlocal received, deadline, body_done
            if body_done:  # later calls wait for a disconnect, which has no deadline
                return await receive()
            limit = scope[BODY_LIMIT_SCOPE_KEY]
            if declared is not None and declared > limit:
                raise HTTPException(413, f"request body of {declared:,} bytes; the limit is {limit:,}")
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + self.deadline_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"the request body did not arrive within {self.deadline_s:g} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"request body larger than {limit:,} bytes")
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope) -> int | None:
    value = header(scope, b"content-length")
    return int(value) if value is not None and value.isdigit() else None
