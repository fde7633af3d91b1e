"""A verl-style tracking backend: ``log(data, step)`` and ``finish()``, like verl's ``Tracking`` backends.

verl's ``Tracking`` keeps its backends in ``tracking.logger`` (name -> object with ``log`` and
``finish``) and calls ``log(data=metrics, step=global_step)`` for each of them every step, so the
backend plugs in next to the ones a run already uses::

    from moeproxy.integrations.verl import MoeproxyTracking

    tracking = Tracking(project_name, experiment_name, default_backend=["console"], config=config)
    tracking.logger["moeproxy"] = MoeproxyTracking(project_name, experiment_name, config=config)

or on its own in any loop.  verl's metric names are the library's own (SPEC section 4), so
``framework`` defaults to ``"verl"``.  ``experiment_name`` is the run name (as in verl's MLflow
and W&B backends); the token decides the moeproxy project and ``project_name`` becomes a tag.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from moeproxy.client import MetricsClient
from moeproxy.integrations._common import numeric_metrics, resolve_endpoint

log = logging.getLogger(__name__)


def _plain(config: Any) -> dict[str, Any]:
    """verl passes an OmegaConf DictConfig; store it as plain JSON-able data."""
    if config is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(config):
            return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    except ImportError:
        pass
    return dict(config) if isinstance(config, Mapping) else {"config": str(config)}


class MoeproxyTracking:
    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: Any = None,
        *,
        url: str | None = None,
        token: str | None = None,
        framework: str = "verl",
        model: str | None = None,
        client_factory: type[MetricsClient] = MetricsClient,
        **client_kwargs: Any,
    ):
        url, token = resolve_endpoint(url, token)
        self.client = client_factory(
            url,
            token,
            experiment_name,
            framework=framework,
            model=model,
            config=_plain(config),
            tags=[f"project:{project_name}"],
            **client_kwargs,
        )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        values = numeric_metrics(data)
        if values:
            self.client.log(int(step), values)

    def finish(self, status: str = "finished") -> None:
        self.client.close(status=status)

    def __del__(self):  # verl's Tracking calls finish() from its own __del__; be as forgiving
        client = getattr(self, "client", None)
        if client is not None and not getattr(client, "_closed", True):
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - interpreter shutdown: nothing left to report to
                log.debug("closing the moeproxy client at exit failed: %s", exc)
