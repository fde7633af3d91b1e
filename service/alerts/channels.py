"""Alert channels: a registry name -> channel, each sending one rendered message and saying
whether the receiver took it, whether to retry (and when), or whether retrying cannot help.

Slack uses slack_sdk's :class:`WebhookClient` with its retry handlers: connection errors are
retried in place, and a 429 is retried in place after its ``Retry-After`` when that is short
(``inline_retry_after_max_s``).  Anything still failing comes back as a :class:`DeliveryResult`
and the outbox reschedules it, honouring a longer ``Retry-After`` without holding the worker.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from moeproxy.service.alerts.errors import UnknownChannel
from moeproxy.service.alerts.messages import AlertMessage, JobMessage, slack_payload, webhook_payload
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler
from slack_sdk.webhook import WebhookClient

log = logging.getLogger(__name__)

# Statuses worth retrying: the receiver may take the same message later (RFC 9110 §15.5.9, §15.6).
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    ok: bool
    status_code: int | None = None
    retry_after_s: float | None = None  # from the receiver's Retry-After, when it sent one
    permanent: bool = False  # retrying the same message cannot succeed (4xx other than the above)
    detail: str = ""


class Channel(Protocol):
    name: str

    def send(self, message: AlertMessage | JobMessage) -> DeliveryResult: ...


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify(status_code: int, headers: Mapping[str, Any], body: str) -> DeliveryResult:
    if 200 <= status_code < 300:
        return DeliveryResult(ok=True, status_code=status_code)
    retry_after = None
    for key, value in headers.items():
        if key.lower() == "retry-after":
            retry_after = parse_retry_after(value[0] if isinstance(value, list | tuple) else value)
            break
    return DeliveryResult(
        ok=False,
        status_code=status_code,
        retry_after_s=retry_after,
        permanent=status_code not in RETRYABLE_STATUS,
        detail=f"HTTP {status_code}: {body[:200]}",
    )


class _ShortRateLimitRetry(RateLimitErrorRetryHandler):
    """slack_sdk's 429 handler (sleeps Retry-After, then retries), only for short waits."""

    def __init__(self, max_wait_s: float, max_retry_count: int = 1):
        super().__init__(max_retry_count=max_retry_count)
        self.max_wait_s = max_wait_s

    def _can_retry(self, *, state, request, response=None, error=None) -> bool:
        if not super()._can_retry(state=state, request=request, response=response, error=error):
            return False
        retry_after = classify(response.status_code, response.headers, "").retry_after_s
        return retry_after is not None and retry_after <= self.max_wait_s


class SlackChannel:
    name = "slack"

    def __init__(self, url: str, *, timeout_s: int = 10, inline_retry_after_max_s: float = 5.0):
        self.client = WebhookClient(
            url,
            timeout=timeout_s,
            retry_handlers=[
                ConnectionErrorRetryHandler(max_retry_count=2),
                _ShortRateLimitRetry(max_wait_s=inline_retry_after_max_s),
            ],
        )

    def send(self, message: AlertMessage | JobMessage) -> DeliveryResult:
        try:
            response = self.client.send_dict(slack_payload(message))
        except Exception as exc:  # noqa: BLE001 - urllib raises many types; after the in-place retries all are transient
            return DeliveryResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
        return classify(response.status_code, response.headers, response.body or "")


class JsonWebhookChannel:
    """``POST`` the alert as JSON (``MOEPROXY_WEBHOOK_URL``): for PagerDuty-style relays, bots, scripts."""

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 10.0):
        self.url = url
        self.timeout_s = timeout_s

    def send(self, message: AlertMessage | JobMessage) -> DeliveryResult:
        try:
            response = httpx.post(self.url, json=webhook_payload(message), timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return DeliveryResult(ok=False, detail=f"{type(exc).__name__}: {exc}")
        return classify(response.status_code, response.headers, response.text)


ChannelFactory = Callable[[str], Channel]

# Registry: channel name -> factory taking the receiver URL.  The outbox stores the name.
CHANNELS: dict[str, ChannelFactory] = {
    SlackChannel.name: SlackChannel,
    JsonWebhookChannel.name: JsonWebhookChannel,
}


def make_channel(name: str, url: str) -> Channel:
    try:
        return CHANNELS[name](url)
    except KeyError:
        raise UnknownChannel(name, list(CHANNELS)) from None


def channel_urls(settings: Any) -> dict[str, str]:
    """Channel name -> URL for the channels configured in ``settings`` (MOEPROXY_* env)."""
    urls = {"slack": settings.slack_webhook_url, "webhook": settings.webhook_url}
    return {name: url for name, url in urls.items() if url}
