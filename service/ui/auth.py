"""The ``MOEPROXY_UI_TOKEN`` gate (SPEC section 5): open when unset; otherwise a login form or
``?token=`` sets an HttpOnly cookie holding an HMAC of the token (never the token itself)."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl, urlencode

from fastapi import Request
from starlette.datastructures import URL

COOKIE = "moeproxy_ui"
COOKIE_MAX_AGE_S = 30 * 24 * 3600


def cookie_value(ui_token: str) -> str:
    return hmac.new(ui_token.encode(), b"moeproxy-ui-session", hashlib.sha256).hexdigest()


def ui_token(request: Request) -> str | None:
    return request.app.state.settings.ui_token or None


def token_matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def is_authorised(request: Request) -> bool:
    expected = ui_token(request)
    if expected is None:
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and hmac.compare_digest(cookie, cookie_value(expected))


def without_token(url: URL) -> str:
    query = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k != "token"]
    return url.path + (f"?{urlencode(query)}" if query else "")


def login_url(request: Request) -> str:
    return "/login?" + urlencode({"next": without_token(request.url)})


def safe_next(target: str | None) -> str:
    # Only same-site paths: "/runs/1" yes, "//evil.example" and "https://..." no.
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target
