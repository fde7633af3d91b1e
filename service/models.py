"""Imports every table so ``Base.metadata`` is complete (Alembic, tests)."""

from moeproxy.service.aliases.models import MetricAliasRow
from moeproxy.service.db import Base
from moeproxy.service.metrics.models import MetricName, MetricPoint
from moeproxy.service.runs.models import Run, RunStatus
from moeproxy.service.tokens.models import ApiToken, Project

__all__ = ["ApiToken", "Base", "MetricAliasRow", "MetricName", "MetricPoint", "Project", "Run", "RunStatus"]
