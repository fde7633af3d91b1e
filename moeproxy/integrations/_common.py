"""What the integrations share: where the service is, and which logged values are metrics."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from moeproxy.client import TOKEN_ENV, URL_ENV, service_endpoint


class IntegrationConfigError(ValueError):
    """The integration cannot tell where the service is or which token to use."""


# Summary values transformers logs once at the end of training; they are not step metrics (the
# callback leaves them out live, the trainer_state.json importer leaves them out of a past run).
END_OF_TRAINING_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}
)


def resolve_endpoint(url: str | None, token: str | None) -> tuple[str, str]:
    url, token = service_endpoint(url, token)
    if not url:
        raise IntegrationConfigError(f"no moeproxy URL: pass url= or set {URL_ENV}")
    if not token:
        raise IntegrationConfigError(
            f"no moeproxy token: pass token= or set {TOKEN_ENV} (`moeproxy token create --project NAME | tail -1`)"
        )
    return url, token


def numeric_metrics(data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries that are numbers (NaN/inf included: they are often the fault itself).

    Strings, lists and None are left out here rather than warned about by the client: trainers
    log a few of them on purpose (TRL's completion tables, transformers' ``train_runtime`` is a
    number but ``epoch`` can be None early on).
    """
    out = {}
    for key, value in data.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, numbers.Number):
            out[key] = value
            continue
        item = getattr(value, "item", None)  # numpy / torch scalars
        if callable(item) and getattr(value, "ndim", 1) == 0:
            out[key] = value
    return out
