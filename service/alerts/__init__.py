"""Alerts: one message per (run, fault class) when the class becomes ``strong``, again only on
escalation, delivered to a Slack incoming webhook (Block Kit) and/or a generic JSON webhook.

Delivery goes through a persisted outbox (``alert_outbox``): live triage enqueues inside its own
unit of work, a background worker sends, retries transient failures (connection errors, 5xx, 429
with ``Retry-After``) with backoff, and marks a row ``sent`` only after the receiver accepted it,
so an alert survives a restart and is never sent twice for the same (run, class, level, channel).
Nothing here runs on the ingest request.  Imports :mod:`moeproxy.service` parts only; no stage
below the service imports it.
"""
