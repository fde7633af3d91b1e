"""Errors raised by the resource planner (issue 9).

Kept apart from the builder's errors so the planner stays importable on its
own; all are ``ValueError`` subclasses so callers can catch bad input broadly.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Base class: a planning request that cannot be answered."""


class UnsupportedArchitecture(PlanError):
    """The config's ``model_type`` has no entry in the planner's registry."""


class InvalidKeepSpec(PlanError):
    """A keep request the proxy cannot have (K > E, K < top_k, ratio outside (0, 1])."""


class IncompleteConfig(PlanError):
    """The config lacks a field the planner needs for its architecture."""


class UnknownPreset(PlanError):
    """No shipped preset has that name."""


class InvalidAssumptions(PlanError):
    """A memory-model assumption out of range (e.g. a negative byte count)."""
