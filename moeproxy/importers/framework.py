"""Which framework logged a run, from metric names that only one framework logs.

The rule and its table live with the metric vocabulary (``moeproxy.signatures.vocabulary``: plain
data, no numpy), where the service's MLflow path uses them too; re-exported here for the readers.
"""

from __future__ import annotations

from moeproxy.signatures.vocabulary import TRANSFORMERS_PREFIX, detect_framework, distinctive_names

__all__ = ["TRANSFORMERS_PREFIX", "detect_framework", "distinctive_names"]
