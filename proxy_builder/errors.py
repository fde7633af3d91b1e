"""Errors raised by the proxy builder.

Every error a user can cause is a ``ProxyBuildError`` (a ``ValueError``), so the
CLI turns all of them into one clear message and a non-zero exit.  There is
one ``UnsupportedArchitecture``, raised by the architecture table for planner and
builder alike; it is also a ``PlanError``, so planner callers catch it too.
"""

from __future__ import annotations

from moeproxy.proxy_builder.plan_errors import PlanError


class ProxyBuildError(ValueError):
    """Base class: a proxy-build request that cannot be carried out."""


class UnsupportedArchitecture(ProxyBuildError, PlanError):
    """The checkpoint's ``model_type`` (or its key layout) has no entry in the architecture table."""


class InvalidPruneRequest(ProxyBuildError):
    """A request that cannot work: K > E, K < top_k, DeepSeek group constraints, unknown method,
    bad view weights, an output directory that is in the way."""


class CheckpointError(ProxyBuildError):
    """The model directory is missing files or its safetensors do not match its config."""


class CalibrationError(ProxyBuildError):
    """The calibration source is unknown, unreadable or yields no tokens."""
