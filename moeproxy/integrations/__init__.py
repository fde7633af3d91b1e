"""Drop-in integrations for training frameworks (verl, TRL/transformers, MLflow users).

* :class:`MoeproxyCallback` (``moeproxy.integrations.transformers``): a ``transformers``
  ``TrainerCallback`` for ``Trainer`` and every TRL trainer (GRPO, PPO, DPO, ...)::

      trainer = GRPOTrainer(..., callbacks=[MoeproxyCallback(url, token, run_name="grpo-qwen3")])

* :class:`MoeproxyTracking` (``moeproxy.integrations.verl``): a tracking backend with verl's
  backend interface, ``log(data, step)`` and ``finish()``.
* MLflow users need no code: point ``MLFLOW_TRACKING_URI`` at ``http://host:port/mlflow`` and set
  ``MLFLOW_TRACKING_TOKEN`` to a moeproxy token (the service speaks MLflow's tracking API).

They use :mod:`moeproxy.client` and talk to the service over HTTP only.  The names are imported
lazily, so ``import moeproxy.integrations`` needs neither transformers nor verl.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "MoeproxyCallback": "moeproxy.integrations.transformers",
    "MoeproxyTracking": "moeproxy.integrations.verl",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
