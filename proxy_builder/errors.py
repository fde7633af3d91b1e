"""Errors raised by the proxy builder.

Every error a user can cause is a ``ProxyBuildError`` (a ``ValueError``), so the
CLI turns all of them into one clear message and a non-zero exit.  The
builder's ``UnsupportedArchitecture`` also subclasses the planner's, so code that
catches either one catches both.
"""

from __future__ import annotations

from moeproxy.proxy_builder.plan_errors import UnsupportedArchitecture as _PlannerUnsupportedArchitecture


class ProxyBuildError(ValueError):
    """Base class: a proxy-build request that cannot be carried out."""


class UnsupportedArchitecture(ProxyBuildError, _PlannerUnsupportedArchitecture):
    """The checkpoint's ``model_type`` (or its key layout) has no entry in the architecture table."""


class InvalidPruneRequest(ProxyBuildError):
    """A request that cannot work: K > E, K < top_k, DeepSeek group constraints, unknown method,
    bad view weights, an output directory that is in the way."""


class CheckpointError(ProxyBuildError):
    """The model directory is missing files or its safetensors do not match its config."""


class CalibrationError(ProxyBuildError):
    """The calibration source is unknown, unreadable or yields no tokens."""
