"""Every table of the service, so ``Base.metadata`` is complete (Alembic autogenerate, tests).

Each domain sub-package's ``models.py`` is imported by discovery, so a new
domain's tables are included without editing this file.
"""

from __future__ import annotations

import importlib
import pkgutil

import moeproxy.service as _service
from moeproxy.service.aliases.models import MetricAliasRow
from moeproxy.service.db import Base
from moeproxy.service.metrics.models import MetricName, MetricPoint
from moeproxy.service.runs.models import Run, RunStatus
from moeproxy.service.tokens.models import ApiToken, Project


def import_all_models() -> None:
    for info in pkgutil.iter_modules(_service.__path__):
        if info.ispkg:
            try:
                importlib.import_module(f"{_service.__name__}.{info.name}.models")
            except ModuleNotFoundError as exc:
                if exc.name != f"{_service.__name__}.{info.name}.models":
                    raise


import_all_models()

__all__ = ["ApiToken", "Base", "MetricAliasRow", "MetricName", "MetricPoint", "Project", "Run", "RunStatus", "import_all_models"]
