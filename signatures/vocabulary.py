"""Canonical metric vocabulary and the framework aliases that map onto it (SPEC section 4).

The table is data: the service seeds it into its ``metric_aliases`` table and users extend it
there. Names not in the table are kept as they are (they are still usable, just not matched
across frameworks). The reproduction engine logs under verl's names, so a fingerprint and a
verl production run speak the same language without any mapping.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class MetricAlias:
    framework: str  # "verl", "trl", "openrlhf", "mindspeed_rl", or "*" for any framework
    name: str  # the name as the framework logs it
    canonical: str


@dataclass(frozen=True, slots=True)
class CanonicalMetric:
    name: str
    description: str


CANONICAL_METRICS: dict[str, CanonicalMetric] = {
    m.name: m
    for m in (
        CanonicalMetric("reward_mean", "mean sequence reward (score) of the rollout batch"),
        CanonicalMetric("kl", "KL between the policy and the reference (or old) policy"),
        CanonicalMetric("ppo_kl", "approximate KL between the current and the rollout-time policy"),
        CanonicalMetric("rollout_train_logp_diff", "mean discrepancy between rollout and trainer log-probs"),
        CanonicalMetric("rollout_train_logp_diff_max", "max discrepancy between rollout and trainer log-probs"),
        CanonicalMetric("importance_ratio", "mean importance ratio trainer/rollout"),
        CanonicalMetric("reward_component", "mean of one reward function's component"),
        CanonicalMetric("reward_std", "standard deviation of the rollout batch rewards"),
        CanonicalMetric("entropy", "mean token entropy of the policy"),
        CanonicalMetric("grad_norm", "actor gradient norm before clipping"),
        CanonicalMetric("pg_loss", "policy-gradient loss"),
        CanonicalMetric("clip_frac", "fraction of tokens whose ratio was clipped"),
        CanonicalMetric("response_length", "mean response length in tokens"),
        CanonicalMetric("response_length_min", "shortest response of the rollout batch, in tokens"),
        CanonicalMetric("response_length_max", "longest response of the rollout batch, in tokens"),
        CanonicalMetric("length_clip_ratio", "share of responses cut at the maximum length (no end token)"),
        CanonicalMetric("clip_frac_low", "share of tokens clipped at the lower ratio bound (negative advantage)"),
        CanonicalMetric("clip_frac_high", "share of tokens clipped at the upper ratio bound (positive advantage)"),
        CanonicalMetric("importance_ratio_min", "smallest token importance ratio trainer/rollout"),
        CanonicalMetric("importance_ratio_max", "largest token importance ratio trainer/rollout"),
        CanonicalMetric("lr", "actor learning rate"),
        CanonicalMetric("advantage_mean", "mean advantage"),
        CanonicalMetric("routing_agreement", "share of tokens whose rollout and trainer top-k experts agree"),
        CanonicalMetric("expert_entropy", "expert-utilisation entropy (MoE)"),
        CanonicalMetric("balance_loss", "MoE load-balancing loss (least when the router spreads tokens evenly)"),
        CanonicalMetric("rollout_train_logp_diff_std", "spread of the rollout/trainer log-prob discrepancy"),
        CanonicalMetric("rollout_kl", "KL between the rollout-engine and trainer distributions"),
        CanonicalMetric("value_loss", "critic (value) loss"),
        CanonicalMetric("zero_std_frac", "share of prompt groups whose rewards all tie (no GRPO signal)"),
        CanonicalMetric("step_time_s", "wall time of one RL step"),
        CanonicalMetric("peak_memory_mb", "peak accelerator memory of one RL step"),
        CanonicalMetric("update_ratio", "relative change of a fixed sample of the policy's trainable weights by "
                                        "the optimizer step (mean over the steps of one log)"),
        CanonicalMetric("update_ratio_min", "the smallest such change among the steps of one log (0: a step "
                                            "that changed nothing)"),
        CanonicalMetric("outside_change", "largest relative change of the sampled weights between two optimizer "
                                          "steps, outside the optimizer (0 in a healthy run)"),
        CanonicalMetric("router_outside_change", "the same for the MoE routers' weights alone"),
    )
}

_TABLE: dict[str, dict[str, tuple[str, ...]]] = {
    # canonical -> framework -> names (SPEC section 4, extended from the frameworks' logging code:
    # verl compute_data_metrics / rollout-correction metrics, TRL GRPOTrainer._metrics, OpenRLHF).
    "reward_mean": {
        "verl": ("critic/score/mean", "critic/rewards/mean"),
        "trl": ("reward",),
        "openrlhf": ("train/reward",),
        "mindspeed_rl": ("grpo/score/mean",),
    },
    "reward_std": {
        "trl": ("reward_std",),
        "verl": ("critic/score/std", "critic/rewards/std"),
        "openrlhf": ("train/reward_std",),
    },
    # Earlier framework releases' names come after the current ones (the first listed wins when a
    # run logs both): verl up to 0.2 logged the in-reward KL to the reference as critic/kl and the
    # entropy as actor/entropy_loss (later actor/reward_kl_penalty and actor/entropy); TRL up to
    # 0.15 logged the mean completion length as completion_length.
    "kl": {
        "verl": ("actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"),
        "trl": ("kl",),
        "openrlhf": ("train/kl",),
        "mindspeed_rl": ("actor/kl_loss",),
    },
    "ppo_kl": {
        "verl": ("actor/ppo_kl",),
        "openrlhf": ("train/ppo_kl",),
        "mindspeed_rl": ("actor/ppo_kl",),
    },
    "rollout_train_logp_diff": {
        "verl": (
            "training/rollout_probs_diff_mean",
            "rollout_corr/log_ppl_diff",
        ),
        "trl": ("sampling/sampling_logp_difference/mean",),
    },
    # verl's rollout-correction KL estimators are a separate canonical metric: they live in
    # log space while training/rollout_probs_diff_* is |p_rollout - p_train| in probability space,
    # and a verl run logs both (a fingerprint must not collapse two different signals into one).
    "rollout_kl": {"verl": ("rollout_corr/kl", "rollout_corr/k3_kl"), "openrlhf": ("train/vllm_kl",)},
    "rollout_train_logp_diff_std": {"verl": ("training/rollout_probs_diff_std",)},
    "rollout_train_logp_diff_max": {
        "verl": ("training/rollout_probs_diff_max",),
        "trl": ("sampling/sampling_logp_difference/max",),
    },
    "importance_ratio": {
        "verl": ("rollout_corr/rollout_is_mean", "rollout_corr/is_mean"),
        "trl": ("sampling/importance_sampling_ratio/mean",),
    },
    "entropy": {
        "verl": ("actor/entropy", "actor/entropy_loss"),
        "trl": ("entropy",),
        "openrlhf": ("train/entropy_loss",),
        "mindspeed_rl": ("actor/entropy",),
    },
    "grad_norm": {
        "verl": ("actor/grad_norm",),
        "trl": ("grad_norm",),
        "openrlhf": ("train/actor_grad_norm",),
        "mindspeed_rl": ("grad_norm",),
    },
    "pg_loss": {
        "verl": ("actor/pg_loss",),
        "trl": ("loss",),
        "openrlhf": ("train/policy_loss",),
        "mindspeed_rl": ("actor/pg_loss",),
    },
    "clip_frac": {
        "verl": ("actor/pg_clipfrac",),
        "trl": ("clip_ratio/region_mean",),
        "openrlhf": ("train/ppo_clip_ratio",),
        "mindspeed_rl": ("actor/pg_clipfrac",),
    },
    "response_length": {
        "verl": ("response_length/mean",),
        "trl": ("completions/mean_length", "completion_length"),
        "openrlhf": ("train/response_length",),
    },
    # TRL GRPOTrainer._metrics (1.16): completions/{min,max}_length, completions/clipped_ratio,
    # clip_ratio/{low,high}_mean, sampling/importance_sampling_ratio/{min,max}; verl's own names.
    "response_length_min": {"verl": ("response_length/min",), "trl": ("completions/min_length",)},
    "response_length_max": {"verl": ("response_length/max",), "trl": ("completions/max_length",)},
    "length_clip_ratio": {"verl": ("response_length/clip_ratio",), "trl": ("completions/clipped_ratio",)},
    "clip_frac_low": {"trl": ("clip_ratio/low_mean",)},
    "clip_frac_high": {"trl": ("clip_ratio/high_mean",)},
    "importance_ratio_min": {
        "verl": ("rollout_corr/rollout_is_min",),
        "trl": ("sampling/importance_sampling_ratio/min",),
    },
    "importance_ratio_max": {
        "verl": ("rollout_corr/rollout_is_max",),
        "trl": ("sampling/importance_sampling_ratio/max",),
    },
    "lr": {
        "verl": ("actor/lr",),
        "trl": ("learning_rate",),
        "openrlhf": ("train/actor_lr",),
        "mindspeed_rl": ("actor/lr",),
    },
    "advantage_mean": {"verl": ("critic/advantages/mean",), "openrlhf": ("train/advantages_mean",)},
    "routing_agreement": {"verl": ("moe/routing_agreement",)},
    "expert_entropy": {"verl": ("moe/expert_entropy",)},
    # The MoE load-balancing loss (Switch Transformer's N * sum_i f_i * P_i, transformers'
    # load_balancing_loss_func): TRL's GRPOTrainer logs it as aux_loss when the model's
    # router_aux_loss_coef is not 0 (TRL 1.16, GRPOTrainer._compute_loss).
    "balance_loss": {"trl": ("aux_loss",)},
    "value_loss": {"verl": ("critic/vf_loss",), "openrlhf": ("train/critic_loss",)},
    "zero_std_frac": {"verl": ("critic/score/zero_std_frac",), "trl": ("frac_reward_zero_std",)},
    "step_time_s": {"verl": ("timing_s/step",)},
    "peak_memory_mb": {"verl": ("perf/peak_memory_mb",)},
    # What MoeproxyCallback measures of the weights around each optimizer step, whatever the trainer
    # (moeproxy/integrations/weight_probe.py).
    "update_ratio": {"*": ("moeproxy/update_ratio",)},
    "update_ratio_min": {"*": ("moeproxy/update_ratio_min",)},
    "outside_change": {"*": ("moeproxy/outside_change",)},
    "router_outside_change": {"*": ("moeproxy/router_outside_change",)},
}

DEFAULT_ALIASES: tuple[MetricAlias, ...] = tuple(
    MetricAlias(framework, name, canonical)
    for canonical, by_framework in _TABLE.items()
    for framework, names in by_framework.items()
    for name in names
)

#: Settings the trainer logs as metrics (canonical names, or logged names where there is no
#: canonical one). A model fault cannot move them: they change when a person or a schedule does
#: (warm-up, decay), and a production framework logs the configured value, which a bug in code does
#: not change. So the matcher does not compare them with fingerprints at all; a setting is evidence
#: only as a level from step 0 against a documented range (signatures/levels.py, ``lr_level``).
CONTROL_METRICS: frozenset[str] = frozenset({"lr", "actor/kl_coef"})


def _logged_by(framework: str) -> frozenset[str]:
    return frozenset(c for c, by_framework in _TABLE.items() if framework in by_framework) - CONTROL_METRICS


#: The canonical metrics of each framework's standard logger set (SPEC section 4), the sets the
#: library is calibrated on (``calibrate.per_view_calibration``): a run is judged against the
#: threshold of the set nearest to what it logs. ``None`` keeps every metric (the library's own
#: runs log verl's names and the engine's MoE diagnostics); ``minimal`` is what any loop logs.
VIEWS: dict[str, frozenset[str] | None] = {
    "verl": None,
    "trl": _logged_by("trl"),
    "openrlhf": _logged_by("openrlhf"),
    "minimal": frozenset({"reward_mean", "kl", "entropy", "grad_norm", "pg_loss", "response_length"}),
}

# TRL logs one reward component per reward function as rewards/<function>/mean (up to 0.15 as
# rewards/<function>, the mean alone).

REWARD_COMPONENT_PREFIX = "rewards/"
REWARD_COMPONENT_SUFFIX = "/mean"


# transformers' TensorBoard, W&B and MLflow callbacks log training values under ``train/``
# (``transformers.integrations.rewrite_logs``), so a TRL run read from those stores says
# ``train/completions/mean_length``.
TRANSFORMERS_PREFIX = "train/"


@lru_cache(maxsize=1)
def distinctive_names() -> dict[str, str]:
    """Logged name -> the one framework that logs it (from the alias table). Only namespaced names
    (``critic/score/mean``, ``completions/mean_length``, ``train/kl``) count: bare ones (``loss``,
    ``kl``, ``reward``) are what any training loop logs."""
    frameworks: dict[str, set[str]] = defaultdict(set)
    for alias in DEFAULT_ALIASES:
        if alias.framework != "*" and "/" in alias.name:
            frameworks[alias.name].add(alias.framework)
    return {name: next(iter(fws)) for name, fws in frameworks.items() if len(fws) == 1}


def detect_framework(names: Iterable[str]) -> str | None:
    """The framework whose distinctive names a run logs, or None when there are none or several
    (an importer's file, a run arriving through ``/mlflow`` without a framework tag)."""
    table = distinctive_names()
    found = set()
    for name in names:
        for candidate in (name, name.removeprefix(TRANSFORMERS_PREFIX)):
            if candidate in table:
                found.add(table[candidate])
    return found.pop() if len(found) == 1 else None


def alias_index(aliases: Iterable[MetricAlias], framework: str | None = None) -> dict[str, str]:
    """name -> canonical for one framework, or for every framework when it is not known.

    A known framework uses only its own (and ``"*"``) entries: "loss" is TRL's pg_loss, but a
    metric called "loss" from another framework's run must not be renamed on TRL's behalf.
    """
    return {
        alias.name: alias.canonical
        for alias in aliases
        if framework is None or alias.framework in ("*", framework)
    }


def canonical_name(name: str, index: Mapping[str, str]) -> str:
    """The canonical name of a logged metric, or the name itself when unknown."""
    if name in index:
        return index[name]
    if name.startswith(REWARD_COMPONENT_PREFIX):
        function = name.removeprefix(REWARD_COMPONENT_PREFIX).removesuffix(REWARD_COMPONENT_SUFFIX)
        if function and "/" not in function:  # not rewards/<function>/std
            return "reward_component/" + function
    return name


def vocabulary_markdown() -> str:
    """docs/vocabulary.md: every canonical metric with the names each framework logs it under."""
    frameworks = sorted({a.framework for a in DEFAULT_ALIASES}, key=lambda f: (f == "*", f))
    lines = [
        "# Metric vocabulary",
        "",
        "The canonical metrics the signature engine compares, and the names each framework logs them",
        "under (SPEC section 4). Generated from `moeproxy/signatures/vocabulary.py` by",
        "`python -m moeproxy.signatures.vocabulary > docs/vocabulary.md`; a test keeps the two equal.",
        "A project adds its own names with `POST /api/v1/aliases`. TRL's per-function reward",
        f"components (`{REWARD_COMPONENT_PREFIX}<function>{REWARD_COMPONENT_SUFFIX}`, up to TRL 0.15",
        f"`{REWARD_COMPONENT_PREFIX}<function>`) map to `reward_component/<function>`. Control metrics (settings, not model behaviour): "
        + ", ".join(f"`{m}`" for m in sorted(CONTROL_METRICS)) + ".",
        "",
        "| canonical | meaning | " + " | ".join("any framework" if f == "*" else f for f in frameworks) + " |",
        "|---|---|" + "---|" * len(frameworks),
    ]
    for name, metric in CANONICAL_METRICS.items():
        by_framework = _TABLE.get(name, {})
        cells = [", ".join(f"`{n}`" for n in by_framework.get(f, ())) or "—" for f in frameworks]
        lines.append(f"| `{name}` | {metric.description} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(vocabulary_markdown(), end="")
