"""Errors raised by the resource planner (issue 9).

Kept apart from the builder's errors so the planner stays importable on its
own; all are ``ValueError`` subclasses so callers can catch bad input broadly.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Base class: a planning request that cannot be answered."""


class InvalidKeepSpec(PlanError):
    """A keep request the proxy cannot have (K > E, K < top_k, ratio outside (0, 1])."""


class IncompleteConfig(PlanError):
    """The config lacks a field the planner needs for its architecture."""


class UnknownPreset(PlanError):
    """No shipped preset has that name."""


class InvalidAssumptions(PlanError):
    """A memory-model assumption out of range (e.g. a negative byte count)."""


def __getattr__(name: str):
    # One UnsupportedArchitecture for planner and builder: it lives in errors.py (a
    # ProxyBuildError and a PlanError); importing it from here still works.
    if name == "UnsupportedArchitecture":
        from moeproxy.proxy_builder.errors import UnsupportedArchitecture

        return UnsupportedArchitecture
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
