"""Fault injectors: every class and variant of the catalogue (SPEC section 3), registered by name.

Each injector is a small :class:`~moeproxy.reproduction.hooks.Injector` subclass that overrides
the hook(s) at the place its production fault lives; none computes or touches a metric.  Shared
parameters: ``onset`` (first faulty step, 0-based), ``duration`` (steps; ``None`` = to the end),
``magnitude`` (what "more" means for that variant), ``side`` (``rollout``/``trainer``) where the
fault can sit on either side.  A variant's defaults are in its ``defaults`` table; anything else
passed is refused with :class:`InvalidFaultParams` before the run starts.

Registry: ``INJECTORS[(fault_class, variant)]`` → injector class; ``make_injector(spec)`` builds one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from moeproxy.reproduction.algos import low_var_kl_unclamped
from moeproxy.reproduction.catalogue import FAULT_CLASSES, variant_kind
from moeproxy.reproduction.errors import InvalidFaultParams, UnknownFault
from moeproxy.reproduction.hooks import Injector, SyncPlan

COMMON_DEFAULTS: dict[str, Any] = {"onset": 0, "duration": None}

INJECTORS: dict[tuple[str, str], type[FaultInjector]] = {}


def register(fault_class: str, variant: str) -> Callable[[type], type]:
    if fault_class not in FAULT_CLASSES or variant not in FAULT_CLASSES[fault_class].variants:
        raise UnknownFault(f"{fault_class}/{variant} is not in the catalogue")

    def deco(cls: type) -> type:
        cls.fault_class, cls.variant = fault_class, variant
        cls.kind = variant_kind(fault_class, variant)
        INJECTORS[(fault_class, variant)] = cls
        return cls

    return deco


class FaultInjector(Injector):
    """An injector with validated parameters (``defaults`` per variant, plus onset/duration)."""

    defaults: ClassVar[dict[str, Any]] = {}
    where: ClassVar[str] = ""  # the hook the fault acts through (docs/faults.md)
    # "code" (a bug: any onset, configuration logged as configured) or "configuration" (a wrong
    # setting: from step 0, logged at its faulty value); set by register() from the catalogue.
    kind: ClassVar[str] = "code"

    def __init__(self, params: Mapping[str, Any] | None = None):
        super().__init__(resolve_params(type(self), params or {}))

    def p(self, name: str) -> Any:
        return self.params[name]


def _coerce(name: str, value: Any, default: Any) -> Any:
    if value is None or default is None:
        if default is None and isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                try:
                    return float(value)
                except ValueError:
                    return value
        return value
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, int):
            f = float(value)
            if f != int(f):
                raise ValueError(value)
            return int(f)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, tuple):
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            return tuple(value)
        return str(value)
    except (TypeError, ValueError):
        raise InvalidFaultParams(f"parameter {name}={value!r}: expected {type(default).__name__}") from None


def resolve_params(cls: type[FaultInjector], params: Mapping[str, Any]) -> dict[str, Any]:
    defaults = {**COMMON_DEFAULTS, **cls.defaults}
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise InvalidFaultParams(
            f"{cls.fault_class}/{cls.variant} takes no parameter(s) {unknown}; it takes {sorted(defaults)}"
        )
    out = {k: _coerce(k, params.get(k, v), v) for k, v in defaults.items()}
    if int(out["onset"]) < 0:
        raise InvalidFaultParams("onset must be >= 0")
    if out["duration"] is not None and int(out["duration"]) < 1:
        raise InvalidFaultParams("duration must be >= 1 (or omitted for 'to the end')")
    if "side" in out and out["side"] not in ("rollout", "trainer"):
        raise InvalidFaultParams("side must be 'rollout' or 'trainer'")
    if cls.kind == "configuration" and (int(out["onset"]) != 0 or out["duration"] is not None):
        raise InvalidFaultParams(
            f"{cls.fault_class}/{cls.variant} is a configuration fault: it is there from step 0 to the end "
            "(a job reads its configuration once); leave onset and duration out")
    return out


@dataclass(frozen=True)
class FaultSpec:
    """What to inject: a catalogue class, one of its variants (default: the first), parameters."""

    fault_class: str
    variant: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fault_class not in FAULT_CLASSES:
            raise UnknownFault(f"unknown fault class {self.fault_class!r}; known: {sorted(FAULT_CLASSES)}")
        variants = FAULT_CLASSES[self.fault_class].variants
        params = dict(self.params)
        if "variant" in params:  # campaign files carry the variant among the parameters
            given = str(params.pop("variant"))
            if self.variant and self.variant != given:
                raise InvalidFaultParams(f"variant given twice: {self.variant!r} and {given!r}")
            object.__setattr__(self, "variant", given)
            object.__setattr__(self, "params", params)
        variant = self.variant or variants[0]
        if variant not in variants:
            raise UnknownFault(f"{self.fault_class} has no variant {variant!r}; variants: {list(variants)}")
        object.__setattr__(self, "variant", variant)
        # validate now (fail before any expensive work) and keep the resolved parameters
        object.__setattr__(self, "params", resolve_params(injector_class(self.fault_class, variant), self.params))

    @property
    def family(self) -> str:
        return FAULT_CLASSES[self.fault_class].family

    def to_dict(self) -> dict[str, Any]:
        params = {k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}
        return {"class": self.fault_class, "variant": self.variant, "family": self.family, "params": params}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultSpec:
        return cls(data["class"], data.get("variant"), dict(data.get("params") or {}))


def injector_class(fault_class: str, variant: str) -> type[FaultInjector]:
    try:
        return INJECTORS[(fault_class, variant)]
    except KeyError:
        raise UnknownFault(f"no injector registered for {fault_class}/{variant}") from None


def make_injector(spec: FaultSpec) -> FaultInjector:
    return injector_class(spec.fault_class, spec.variant)(spec.params)


def _randn_like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32).to(t.dtype)


# === reference ==========================================================================================

@register("healthy", "none")
class Healthy(FaultInjector):
    where = "nothing injected"


# === framework / model-state consistency ================================================================

@register("actor_update_omission", "skip_step")
class SkipOptimizerStep(FaultInjector):
    """``optimizer.step()`` silently not called (update_successful False)."""

    where = "trainer: optimizer step"

    def optimizer_step(self, step):
        return not self.active(step)


@register("actor_update_omission", "zero_grad")
class ZeroGradients(FaultInjector):
    """Gradients zeroed before the step (frozen adapter / wrong parameter group): AdamW still steps."""

    where = "trainer: gradients before the optimizer step"

    def gradients(self, step, policy):
        if self.active(step):
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.grad.zero_()


@register("actor_update_omission", "nonfinite_grad_norm")
class NonFiniteGradNorm(FaultInjector):
    """One gradient entry becomes NaN, so the grad norm is NaN and the trainer skips the step."""

    where = "trainer: gradients before clipping (the trainer's non-finite skip does the rest)"

    def gradients(self, step, policy):
        if self.active(step):
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.grad.view(-1)[0] = float("nan")
                    return


@register("stale_weight_sync", "skip_from_onset")
class SkipSync(FaultInjector):
    where = "weight sync trainer -> rollout"

    def weight_sync(self, step, plan):
        return SyncPlan(enabled=False) if self.active(step) else plan


@register("stale_weight_sync", "every_n")
class SyncEveryN(FaultInjector):
    defaults = {"magnitude": 4}  # N
    where = "weight sync trainer -> rollout"

    def weight_sync(self, step, plan):
        n = max(1, int(self.p("magnitude")))
        if self.active(step) and (step - int(self.p("onset")) + 1) % n:
            return SyncPlan(enabled=False)
        return plan


@register("stale_weight_sync", "partial")
class PartialSync(FaultInjector):
    """Only part of the weights reach the rollout engine.  ``part``: ``experts`` (expert MLPs never
    synced), ``attention``, ``router``, or ``upper_layers`` (the upper ``magnitude`` share of layers)."""

    defaults = {"part": "upper_layers", "magnitude": 0.5}
    where = "weight sync trainer -> rollout (a subset of tensors skipped)"
    PARTS: ClassVar[dict[str, Callable[[str], bool]]] = {
        "experts": lambda n: ".experts." in n,
        "attention": lambda n: ".self_attn." in n,
        "router": lambda n: n.endswith(".gate.weight") or "e_score_correction_bias" in n,
    }

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        part = self.p("part")
        if part == "upper_layers":
            n_layers = int(trainer.model.config.num_hidden_layers)
            first = n_layers - max(1, round(float(self.p("magnitude")) * n_layers))
            import re

            def stale(name: str) -> bool:
                m = re.search(r"layers\.(\d+)\.", name)
                return bool(m) and int(m.group(1)) >= first

            self._stale = stale
        elif part in self.PARTS:
            self._stale = self.PARTS[part]
        else:
            raise InvalidFaultParams(f"part must be one of {sorted([*self.PARTS, 'upper_layers'])}")

    def weight_sync(self, step, plan):
        if not self.active(step):
            return plan
        return SyncPlan(enabled=True, include=lambda n: not self._stale(n), transform=plan.transform)


# === operator / numerical consistency ===================================================================

_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _RolloutPrecision(FaultInjector):
    """The rollout engine's LM head, temperature and log-softmax in bf16/fp16 (``scope=logits``), or
    the whole rollout copy in that dtype (``scope=model``, as a bf16 vLLM next to an fp32 trainer)."""

    defaults = {"scope": "logits"}
    where = "rollout: logits / log-softmax path"

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        if self.p("scope") not in ("logits", "model"):
            raise InvalidFaultParams("scope must be 'logits' or 'model'")
        self._rollout = rollout
        self._low_copy = False

    def rollout_logits_dtype(self, step):
        return _LOW[self.variant] if self.active(step) else None

    def on_step_start(self, step, trainer, rollout):
        if self.p("scope") != "model":
            return
        want = self.active(step)
        if want != self._low_copy:
            rollout.model.to(_LOW[self.variant] if want else trainer.dtype)
            rollout.dtype = _LOW[self.variant] if want else trainer.dtype
            self._low_copy = want


register("rollout_logp_precision", "bf16")(type("RolloutBF16", (_RolloutPrecision,), {}))
register("rollout_logp_precision", "fp16")(type("RolloutFP16", (_RolloutPrecision,), {}))


@register("operator_numeric_noise", "attention_seq_len")
class AttentionSeqLenNoise(FaultInjector):
    """A perturbed attention kernel on one side: relative error on the attention output that grows
    with the sequence length, ``magnitude * (seq_len / ref_len)`` times the output's RMS."""

    defaults = {"magnitude": 0.02, "ref_len": 16, "side": "rollout"}
    where = "attention output of every layer, one side"

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        target = rollout if self.p("side") == "rollout" else trainer
        self._handles = []
        for name, module in target.model.named_modules():
            if name.endswith("self_attn"):
                self._handles.append(module.register_forward_hook(self._hook))

    def _hook(self, module, args, output):
        ctx = self.ctx
        if ctx is None or not self.active(ctx.step):
            return output
        out = output[0]
        seq_len = ctx.seq_len if self.p("side") == "rollout" else out.shape[1]
        scale = float(self.p("magnitude")) * seq_len / float(self.p("ref_len"))
        rms = out.detach().float().pow(2).mean().sqrt()
        noise = _randn_like(out, ctx.generator) * (scale * rms).to(out.dtype)
        return (out + noise, *output[1:])


@register("operator_numeric_noise", "softmax_low_prob_tail")
class SoftmaxTailNoise(FaultInjector):
    """A softmax kernel whose error is heavy-tailed on low-probability tokens: tokens below
    ``threshold`` get log-space noise ``magnitude * |log p| * Cauchy``, then renormalised."""

    defaults = {"magnitude": 0.02, "threshold": 0.05, "side": "rollout"}
    where = "log-softmax, one side"

    def _perturb(self, logp):
        small = logp.exp() < float(self.p("threshold"))
        u = torch.rand(logp.shape, generator=self.ctx.generator, device=logp.device)
        cauchy = torch.tan(math.pi * (u - 0.5)).clamp(-20, 20).to(logp.dtype)
        noisy = logp + torch.where(small, float(self.p("magnitude")) * logp.abs() * cauchy, torch.zeros_like(logp))
        return torch.log_softmax(noisy, dim=-1)

    def rollout_log_probs(self, step, logp):
        if self.p("side") == "rollout" and self.active(step):
            return self._perturb(logp)
        return logp

    def trainer_log_probs(self, step, logp, mask):
        if self.p("side") == "trainer" and self.active(step):
            return self._perturb(logp)
        return logp


# === expert-routing consistency =========================================================================

@register("routing_mismatch", "router_logit_noise")
class RouterLogitNoise(FaultInjector):
    """The rollout side's router logits get noise (``magnitude`` × each token's logit std) before top-k."""

    defaults = {"magnitude": 0.3, "side": "rollout"}
    where = "router logits before top-k, one side"

    def router_logits(self, step, side, layer, logits):
        if side != self.p("side") or not self.active(step):
            return logits
        std = logits.detach().float().std(dim=-1, keepdim=True)
        return logits + (_randn_like(logits, self.ctx.generator).float() * std * float(self.p("magnitude"))).to(logits.dtype)


@register("routing_mismatch", "tie_breaking")
class RouterTieBreaking(FaultInjector):
    """A different kernel on one side: router logits rounded to a grid of ``magnitude`` × the
    token's logit std (a coarse precision) and the resulting ties broken toward the higher expert
    index, where the trainer's top-k keeps the exact order."""

    defaults = {"magnitude": 0.25, "side": "rollout"}
    where = "router logits before top-k, one side"

    def router_logits(self, step, side, layer, logits):
        if side != self.p("side") or not self.active(step):
            return logits
        # grid relative to each token's logit spread, so one magnitude means the same on any model
        delta = float(self.p("magnitude")) * logits.detach().float().std(dim=-1, keepdim=True).clamp_min(1e-6)
        e = logits.shape[-1]
        bias = torch.arange(e, device=logits.device, dtype=torch.float32) * (delta * 1e-3 / e)
        return (torch.round(logits.float() / delta) * delta + bias).to(logits.dtype)


def _router_params(policy) -> list[torch.nn.Parameter]:
    names = set(policy.router_weight_names())
    return [p for n, p in policy.model.named_parameters() if n in names]


@register("router_corruption", "downcast_bf16")
class RouterDowncast(FaultInjector):
    """Router weights down-cast fp32 -> bf16 at every transfer to the rollout engine."""

    where = "weight sync (router tensors rounded in transit)"

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        self._router = set(trainer.router_weight_names())

    def weight_sync(self, step, plan):
        if not self.active(step):
            return plan
        router = self._router

        def transform(name, t):
            return t.to(torch.bfloat16).to(t.dtype) if name in router else t

        return SyncPlan(enabled=plan.enabled, include=plan.include, transform=transform)

    def on_step_start(self, step, trainer, rollout):
        if step == int(self.p("onset")):  # the transfer that happens at onset
            with torch.no_grad():
                for mine, theirs in zip(_router_params(rollout), _router_params(trainer)):
                    mine.copy_(theirs.to(torch.bfloat16).to(theirs.dtype))


class _RouterDamage(FaultInjector):
    """Damage the router weights of the model state at ``onset`` (both copies: the state is shared)."""

    where = "model state (router weights) at onset"

    def damage(self, weight: torch.Tensor) -> None:
        raise NotImplementedError

    def on_step_start(self, step, trainer, rollout):
        if step != int(self.p("onset")):
            return
        with torch.no_grad():
            for mine, theirs in zip(_router_params(trainer), _router_params(rollout)):
                self.damage(mine)
                theirs.copy_(mine)


@register("router_corruption", "noise")
class RouterNoise(_RouterDamage):
    defaults = {"magnitude": 1.0}  # noise std relative to each row's std

    def damage(self, weight):
        std = weight.float().std(dim=-1, keepdim=True)
        weight.add_((_randn_like(weight, self.ctx.generator).float() * std * float(self.p("magnitude"))).to(weight.dtype))


@register("router_corruption", "reinit_rows")
class RouterReinitRows(_RouterDamage):
    defaults = {"magnitude": 0.25, "init_std": 0.02}  # share of expert rows re-initialised

    def damage(self, weight):
        e = weight.shape[0]
        n = max(1, round(float(self.p("magnitude")) * e))
        rows = torch.randperm(e, generator=self.ctx.generator, device=weight.device)[:n]
        fresh = _randn_like(weight[rows], self.ctx.generator) * float(self.p("init_std"))
        weight[rows] = fresh


# === optimisation / training stability ==================================================================

@register("gradient_overflow", "loss_scale_no_handling")
class LossScaleNoHandling(FaultInjector):
    """fp16 loss scaling with no overflow check: loss × ``loss_scale``, gradients stored in fp16
    (|g·S| > 65504 becomes inf), unscaled, and the step taken whatever the grad norm."""

    defaults = {"loss_scale": 65536.0 * 64}
    where = "trainer: loss scaling, gradients, optimizer step"

    def loss(self, step, loss):
        return loss * float(self.p("loss_scale")) if self.active(step) else loss

    def gradients(self, step, policy):
        if not self.active(step):
            return
        scale = float(self.p("loss_scale"))
        for p in policy.model.parameters():
            if p.grad is not None:
                p.grad.copy_(p.grad.to(torch.float16).to(p.grad.dtype) / scale)

    def skip_nonfinite(self, step, default):
        return False if self.active(step) else default


@register("gradient_overflow", "inject_nonfinite")
class InjectNonFinite(FaultInjector):
    """An inf/NaN appears in the trainer's forward activations from ``onset`` (one hidden unit of
    the first sequence after the first decoder layer, in the gradient-carrying passes):
    that sequence's log-probs, the loss and every gradient turn NaN.  ``handled=true`` keeps the
    trainer's skip-on-non-finite (verl); ``false`` applies the step, and NaN reaches the weights.

    (Poisoning the log-probs themselves would not do: verl's clamps on the log-ratio pass a zero
    gradient for a NaN entry, so the fault has to sit upstream of the LM head, where it lives.)"""

    defaults = {"value": "nan", "handled": True}
    where = "trainer forward activations, optimizer step"

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        if self.p("value") not in ("nan", "inf"):
            raise InvalidFaultParams("value must be 'nan' or 'inf'")
        layers = trainer.model.get_decoder().layers
        self._handle = layers[0].register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        if self.ctx is None or not self.active(self.ctx.step) or not torch.is_grad_enabled():
            return output
        hidden = output[0] if isinstance(output, tuple) else output
        poison = torch.zeros_like(hidden)
        poison[0, :, 0] = float("inf") if self.p("value") == "inf" else float("nan")
        hidden = hidden + poison
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    def skip_nonfinite(self, step, default):
        return default if self.p("handled") or not self.active(step) else False


@register("lr_misconfiguration", "lr_multiplier")
class LRMultiplier(FaultInjector):
    """The configured LR is ``magnitude`` times the intended one (an SFT learning rate used for RL)."""

    defaults = {"magnitude": 100.0}
    where = "configuration: actor learning rate"

    def configure(self, config):
        return config.replace(lr=config.lr * float(self.p("magnitude")))


@register("lr_misconfiguration", "no_warmup")
class NoWarmup(FaultInjector):
    """The warm-up is missing from the configuration: the peak LR (× ``magnitude``) from step 0."""

    defaults = {"magnitude": 1.0}
    where = "configuration: LR warm-up"

    def configure(self, config):
        return config.replace(lr_warmup_steps=0, lr=config.lr * float(self.p("magnitude")))


@register("kl_misconfiguration", "zero_coef")
class KLZero(FaultInjector):
    """The KL coefficient is configured as 0 (the KL loss is still computed and logged, as verl does
    with ``use_kl_loss`` on; TRL with ``beta`` 0 does not log ``kl`` at all)."""

    where = "configuration: KL loss coefficient"

    def configure(self, config):
        return config.replace(kl_loss_coef=0.0)


@register("kl_misconfiguration", "sign_flip")
class KLSignFlip(FaultInjector):
    defaults = {"magnitude": 1.0}
    where = "KL term of the actor loss"

    def kl(self, step, coef, estimator):
        return (-coef * float(self.p("magnitude")), estimator) if self.active(step) else (coef, estimator)


@register("kl_misconfiguration", "low_var_kl_unclamped")
class KLUnclamped(FaultInjector):
    """``low_var_kl`` without verl's clamps (exp may overflow); ``magnitude`` scales the coefficient,
    as a run that raised the KL coefficient to hold a drifting policy would."""

    defaults = {"magnitude": 1.0}
    where = "KL estimator of the actor loss"

    def kl(self, step, coef, estimator):
        return (coef * float(self.p("magnitude")), low_var_kl_unclamped) if self.active(step) else (coef, estimator)


def _response_format(ctx):
    from moeproxy.reproduction.formats import get_format

    return ctx.extras.get("response_format") or get_format(None)


@register("reward_fault", "component_zero")
class RewardComponentZero(FaultInjector):
    """One reward component is always 0 for some tasks: an answer parser that never matches
    (``component=accuracy``, the default, for ``tasks``) or a format regex that never matches
    (``component=format``, every task; a model without a format component refuses it)."""

    defaults = {"tasks": ("addition", "subtraction", "multiplication", "counting"), "component": "accuracy"}
    where = "reward function (one component)"

    def bind(self, ctx, trainer, rollout):
        super().bind(ctx, trainer, rollout)
        names = _response_format(ctx).component_names
        if self.p("component") not in names:
            raise InvalidFaultParams(f"component={self.p('component')!r}: this model's reward has {list(names)}")

    def reward(self, step, examples, completions, components):
        if not self.active(step):
            return components
        name = self.p("component")
        broken = set(self.p("tasks")) if name == "accuracy" else None
        return [{**c, name: 0.0} if broken is None or ex.task in broken else c
                for ex, c in zip(examples, components)]


@register("reward_fault", "truncated")
class RewardTruncated(FaultInjector):
    """The reward function sees only the first ``window`` characters of each completion, so a
    response longer than the window loses its answer (and its closing tag)."""

    defaults = {"window": 2}
    where = "reward function (its input)"

    def reward(self, step, examples, completions, components):
        if not self.active(step):
            return components
        fmt, w = _response_format(self.ctx), int(self.p("window"))
        return [fmt.score(ex, c[:w]) for ex, c in zip(examples, completions)]


@register("reward_fault", "label_noise")
class RewardLabelNoise(FaultInjector):
    """Wrong labels: the accuracy component of a sample flips with probability ``magnitude``."""

    defaults = {"magnitude": 0.3}
    where = "reward function (accuracy labels)"

    def reward(self, step, examples, completions, components):
        if not self.active(step):
            return components
        flip = torch.rand(len(components), generator=self.ctx.generator, device=self.ctx.generator.device).tolist()
        return [{**c, "accuracy": 1.0 - c["accuracy"]} if u < float(self.p("magnitude")) else c
                for c, u in zip(components, flip)]


@register("reward_fault", "constant")
class RewardConstant(FaultInjector):
    """Every component of every sample is ``value``: zero-variance groups, no advantage."""

    defaults = {"value": 0.0}
    where = "reward function"

    def reward(self, step, examples, completions, components):
        if not self.active(step):
            return components
        return [dict.fromkeys(c, float(self.p("value"))) for c in components]


def catalogue_coverage() -> dict[str, list[str]]:
    """Variants of the catalogue that have no injector (empty when complete; tested)."""
    missing: dict[str, list[str]] = {}
    for name, fc in FAULT_CLASSES.items():
        gaps = [v for v in fc.variants if (name, v) not in INJECTORS]
        if gaps:
            missing[name] = gaps
    return missing
