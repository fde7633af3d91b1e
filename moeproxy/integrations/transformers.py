"""A ``transformers`` ``TrainerCallback`` that sends every logged metric dict to moeproxy.

Works with ``Trainer`` and the TRL trainers (GRPOTrainer logs ``reward``, ``kl``,
``sampling/sampling_logp_difference/mean``, ``rewards/<fn>/mean`` ... through ``Trainer.log``),
so the names arrive as TRL logs them and the service maps them (SPEC section 4, framework
``"trl"``).  Only the main process (``state.is_world_process_zero``) sends.  The step is
``state.global_step``; the client never blocks the training step.

Beside what the trainer logs, the callback sends what each optimizer step did to the policy's
weights, from a fixed sample of them (:mod:`moeproxy.integrations.weight_probe`: the update, and
any change made outside the optimizer, the MoE routers apart), which no trainer logs: an update
dropped after the gradient norm was measured and router weights damaged between steps show
there and nowhere else. ``probe_weights=False`` turns it off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from moeproxy.client import MetricsClient
from moeproxy.integrations._common import END_OF_TRAINING_KEYS, numeric_metrics, resolve_endpoint
from moeproxy.integrations.weight_probe import WeightProbe

log = logging.getLogger(__name__)


class MoeproxyCallback(TrainerCallback):
    """Send ``Trainer`` logs to moeproxy (``MOEPROXY_URL``/``MOEPROXY_TOKEN`` when not passed).

    ``run_name`` defaults to ``TrainingArguments.run_name`` (or the output directory's name); a
    restarted job with the same run name resumes the run.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        run_name: str | None = None,
        *,
        framework: str = "trl",
        model: str | None = None,
        tags: list[str] | None = None,
        probe_weights: bool = True,
        client_factory: type[MetricsClient] = MetricsClient,
        **client_kwargs: Any,
    ):
        self.url, self.token = resolve_endpoint(url, token)
        self.run_name, self.framework, self.model, self.tags = run_name, framework, model, tags
        self.client_factory, self.client_kwargs = client_factory, client_kwargs
        self.client: MetricsClient | None = None
        self.probe_weights = probe_weights
        self.probe: WeightProbe | None = None

    def _run_name(self, args) -> str:
        if self.run_name:
            return self.run_name
        name = getattr(args, "run_name", None)
        output_dir = getattr(args, "output_dir", None) or "trainer"
        # transformers defaults run_name to output_dir; keep just its last part.
        return os.path.basename(os.path.normpath(name or output_dir)) or "trainer"

    def _config(self, args, model) -> dict[str, Any]:
        config: dict[str, Any] = {}
        if args is not None and hasattr(args, "to_dict"):
            # TrainingArguments: the hyper-parameters that matter when a fault is an lr/KL mistake.
            wanted = (
                "learning_rate",
                "lr_scheduler_type",
                "warmup_steps",
                "warmup_ratio",
                "max_grad_norm",
                "per_device_train_batch_size",
                "gradient_accumulation_steps",
                "bf16",
                "fp16",
                "seed",
                "beta",
                "epsilon",
                "num_generations",
                "loss_type",
                "max_steps",
                "router_aux_loss_coef",  # TRL logs the MoE balance loss (aux_loss) only when it is not 0
            )
            args_dict = args.to_dict()
            config["training_args"] = {k: args_dict[k] for k in wanted if k in args_dict}
        model_config = getattr(model, "config", None)
        if model_config is not None:
            config["model_type"] = getattr(model_config, "model_type", None)
        if peft := _peft_section(model):
            config["peft"] = peft
        return config

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero or self.client is not None:
            return
        model_name = self.model or getattr(getattr(model, "config", None), "_name_or_path", None) or None
        self.client = self.client_factory(
            self.url,
            self.token,
            self._run_name(args),
            framework=self.framework,
            model=model_name,
            config=self._config(args, model),
            tags=self.tags,
            **self.client_kwargs,
        )
        if self.probe_weights and model is not None:
            self._start_probe(args, model, kwargs.get("optimizer"))

    def _start_probe(self, args, model, optimizer) -> None:
        elsewhere = _updates_elsewhere(args, optimizer)
        if elsewhere:
            log.info("moeproxy: weight probe off: %s applies the update outside optimizer.step()", elsewhere)
            return

        def start() -> None:
            self.probe = WeightProbe(model)
            self.probe.start()

        self._probe(start)

    def _probe(self, act) -> None:
        # The probe must never stop a training run: on any error it says so once and turns itself off.
        try:
            act()
        except Exception as exc:  # noqa: BLE001 - a model the probe cannot read is not the user's problem
            log.warning("moeproxy: weight probe turned off (%s: %s)", type(exc).__name__, exc)
            self.probe = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.probe is not None:
            self._probe(self.probe.before_step)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.probe is not None:
            self._probe(self.probe.after_step)

    def on_log(self, args, state, control, logs: Mapping[str, Any] | None = None, **kwargs):
        if not state.is_world_process_zero or self.client is None or not logs:
            return
        values = {k: v for k, v in numeric_metrics(logs).items() if k not in END_OF_TRAINING_KEYS}
        if values and self.probe is not None:  # not the end-of-training summary: no step of its own
            values.update(self.probe.flush())
        if values:
            self.client.log(int(state.global_step), values)

    def on_train_end(self, args, state, control, **kwargs):
        if self.client is not None:
            # The probe's measurements of the steps after the last log (the last step's, at its step).
            rest = self.probe.flush() if self.probe is not None else {}
            if rest:
                self.client.log(int(state.global_step), rest)
            self.client.close(status="finished")
            self.client = None


#: Optimizer wrappers whose ``step()`` does nothing because the update happens elsewhere:
#: accelerate's DeepSpeed wrapper (the engine steps inside ``backward``) and transformers'
#: layer-wise optimizers (each layer steps in a backward hook).
_STEP_ELSEWHERE = frozenset({"DeepSpeedOptimizerWrapper", "LayerWiseDummyOptimizer"})


def _updates_elsewhere(args, optimizer) -> str | None:
    """What in this run updates the weights outside ``optimizer.step()``, if anything does."""
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return "DeepSpeed"
    name = type(optimizer).__name__ if optimizer is not None else None
    return name if name in _STEP_ELSEWHERE else None


def _peft_section(model) -> dict[str, Any]:
    """A PEFT model's adapter settings (``PeftModel.peft_config``: adapter name -> its config), so
    that triage reads a LoRA run's learning rate against LoRA's range; empty for a full model."""
    adapters = getattr(model, "peft_config", None)
    if not isinstance(adapters, Mapping) or not adapters:
        return {}
    out: dict[str, Any] = {}
    for name, cfg in adapters.items():
        peft_type = getattr(cfg, "peft_type", None)
        out[str(name)] = {"peft_type": str(getattr(peft_type, "value", peft_type)),
                          "r": getattr(cfg, "r", None), "lora_alpha": getattr(cfg, "lora_alpha", None)}
    return out
