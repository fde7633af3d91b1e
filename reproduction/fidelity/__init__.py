"""Proxy-fidelity harness: how faithful a proxy is to its original (issue 5, SPEC section 2).

Measured on the task suite's held-out split, never on anything a model was
trained or calibrated on:

- per-task exact-match accuracy of greedy generation, with Wilson 95% intervals,
  and retention (proxy mean accuracy / original mean accuracy);
- next-token KL(original || proxy) on held-out texts (teacher forcing), over all
  real positions and over the answer positions only;
- routing coverage: share of (token, MoE layer) pairs whose original top-1
  expert survives in the proxy;
- routing agreement over *all* tokens: |original top-k ∩ proxy top-k| / k, the
  proxy's choices mapped back to original ids through ``kept_experts``.  A pruned
  expert counts as a miss, so methods that drop the experts the model uses
  score low (measured only on surviving experts, first-K scored 0.94 while
  solving 3% of the tasks);
- expert-utilisation entropy per layer (of the top-k assignment distribution);
- per-layer hidden-state cosine similarity;
- parameter count, measured peak memory and generation throughput ratios.

The original is evaluated once into an :class:`ModelRun` and can be compared
with many proxies (the ablation does that).  The proxy's ``proxy_report.json``
(``{"layers": {"<idx>": {"kept_experts": [original ids in new order]}}}``) gives
the expert mapping; a proxy directory without it must have every expert.

Imports torch/transformers inside functions; may import ``moeproxy.proxy_builder``,
never ``moeproxy.signatures`` or ``moeproxy.service``.

The measures are in :mod:`.scores`, the cost figures in :mod:`.cost`, loading and generation in
:mod:`.models`; this module is the harness that runs them on a pair of checkpoints, and it
re-exports every public name.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeproxy.reproduction.fidelity.cost import (
    generation_throughput,
    measure_peak_memory_mb,
    parameter_count,
)
from moeproxy.reproduction.fidelity.models import (
    FidelityError,
    Progress,
    expert_mapping,
    generate_completions,
    load_model,
    load_tokenizer,
    moe_layers,
    num_routed_experts,
)
from moeproxy.reproduction.fidelity.scores import (
    Capture,
    capture,
    hidden_cosine,
    kl_divergence,
    normalised_entropy,
    routing_scores,
    task_accuracy,
    wilson_interval,
)
from moeproxy.reproduction.tasks import TASKS, Example, format_prompt, make_split, reward

# --- the harness --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvalSettings:
    prompts_per_task: int = 500
    kl_texts_per_task: int = 100
    seed: int = 0
    batch_size: int = 256
    tasks: tuple[str, ...] = tuple(TASKS)
    measure_cost: bool = True
    throughput_prompts: int = 256

    def __post_init__(self) -> None:
        if self.prompts_per_task < 1 or self.kl_texts_per_task < 1 or self.batch_size < 1:
            raise ValueError("prompts_per_task, kl_texts_per_task and batch_size must be >= 1")
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"unknown tasks {unknown}")


@dataclass
class ModelRun:
    """One model evaluated on the held-out split."""

    path: Path
    model: Any
    accuracy: dict[str, dict[str, Any]]
    capture: Capture
    parameters: int
    cost: dict[str, float] = field(default_factory=dict)
    correct: list[float] = field(default_factory=list)  # per generation prompt, in heldout_sets order

    def summary(self) -> dict[str, Any]:
        acc = {t: v["accuracy"] for t, v in self.accuracy.items()}
        return {
            "path": str(self.path),
            "accuracy": acc,
            "accuracy_ci95": {t: v["ci95"] for t, v in self.accuracy.items()},
            "n_per_task": {t: v["n"] for t, v in self.accuracy.items()},
            "mean_accuracy": sum(acc.values()) / len(acc),
            "parameters": self.parameters,
            "expert_utilisation_entropy": {
                str(k): normalised_entropy(v) for k, v in self.capture.expert_counts.items()},
            **self.cost,
        }


def heldout_sets(settings: EvalSettings) -> tuple[list[Example], list[Example]]:
    """Generation prompts and KL texts: both from the held-out split, disjoint from each other."""
    n_tasks = len(settings.tasks)
    both = make_split("heldout", n_tasks * (settings.prompts_per_task + settings.kl_texts_per_task),
                      seed=settings.seed, tasks=settings.tasks)
    cut = n_tasks * settings.prompts_per_task
    return both[:cut], both[cut:]


def evaluate_model(path: Path | str, settings: EvalSettings, tokenizer=None,
                   progress: Progress | None = None) -> ModelRun:
    path = Path(path)
    tokenizer = tokenizer or load_tokenizer(path)
    model = load_model(path)
    prompts, kl_texts = heldout_sets(settings)
    completions = generate_completions(model, tokenizer, prompts, settings.batch_size, progress=progress)
    cap = capture(model, tokenizer, kl_texts, progress=progress)
    run = ModelRun(path, model, task_accuracy(prompts, completions), cap, parameter_count(model),
                   correct=[reward(e, c) for e, c in zip(prompts, completions)])
    if settings.measure_cost:
        sample = throughput_sample(settings)
        if progress:
            progress("cost", 0, 1)
        run.cost = {"peak_memory_mb": measure_peak_memory_mb(path, [format_prompt(e) for e in sample])}
        if progress:
            progress("cost", 1, 1)
    return run


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a in (None, 0) or b is None else b / a


def compare(original: ModelRun, proxy: ModelRun, proxy_dir: Path | str) -> dict[str, Any]:
    """The report of one proxy against its evaluated original."""
    n_orig = num_routed_experts(original.model)
    mapping = expert_mapping(proxy_dir, proxy.model, n_orig)
    if set(mapping) != set(original.capture.topk):
        raise FidelityError(f"MoE layers differ: original {sorted(original.capture.topk)}, proxy {sorted(mapping)}")
    o, p = original.summary(), proxy.summary()
    kl, kl_answer = kl_divergence(original.capture, proxy.capture)
    cos = hidden_cosine(original.capture, proxy.capture)
    report = {
        "original": o,
        "proxy": p,
        "retention": p["mean_accuracy"] / o["mean_accuracy"] if o["mean_accuracy"] else float("nan"),
        "retention_per_task": {t: (p["accuracy"][t] / a if a else None) for t, a in o["accuracy"].items()},
        "kl": kl,
        "kl_answer": kl_answer,
        **routing_scores(original.capture, proxy.capture, mapping, n_orig),
        "expert_utilisation_entropy": {
            "original_mean": statistics.fmean(o["expert_utilisation_entropy"].values()),
            "proxy_mean": statistics.fmean(p["expert_utilisation_entropy"].values()),
        },
        "hidden_cosine_per_layer": cos,
        "hidden_cosine_mean": statistics.fmean(cos),
        "experts_kept": {str(k): len(v) for k, v in mapping.items()},
        "parameter_ratio": p["parameters"] / o["parameters"],
        "memory_ratio": _ratio(o.get("peak_memory_mb"), p.get("peak_memory_mb")),
        "throughput_ratio": None,  # filled by add_throughput (side-by-side measurement)
    }
    return report


def throughput_sample(settings: EvalSettings) -> list[Example]:
    prompts, _ = heldout_sets(settings)
    return prompts[:: max(1, len(prompts) // settings.throughput_prompts)][: settings.throughput_prompts]


def add_throughput(report: dict[str, Any], original: ModelRun, proxy: ModelRun, tokenizer,
                   settings: EvalSettings) -> None:
    o_rate, p_rate = generation_throughput([original.model, proxy.model], tokenizer, throughput_sample(settings))
    report["original"]["generation_tokens_per_s"] = o_rate
    report["proxy"]["generation_tokens_per_s"] = p_rate
    report["throughput_ratio"] = p_rate / o_rate


def evaluate_pair(original_dir: Path | str, proxy_dir: Path | str, settings: EvalSettings | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
    """``moeproxy eval``: the full report of ``proxy_dir`` against ``original_dir``."""
    settings = settings or EvalSettings()
    tokenizer = load_tokenizer(original_dir)
    original = evaluate_model(original_dir, settings, tokenizer, progress)
    proxy = evaluate_model(proxy_dir, settings, tokenizer, progress)
    report = compare(original, proxy, proxy_dir)
    if settings.measure_cost:
        add_throughput(report, original, proxy, tokenizer, settings)
    report["settings"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.__dict__.items()}
    return report


__all__ = [
    "Capture",
    "EvalSettings",
    "FidelityError",
    "ModelRun",
    "add_throughput",
    "capture",
    "compare",
    "evaluate_model",
    "evaluate_pair",
    "expert_mapping",
    "generate_completions",
    "generation_throughput",
    "heldout_sets",
    "hidden_cosine",
    "kl_divergence",
    "load_model",
    "load_tokenizer",
    "measure_peak_memory_mb",
    "moe_layers",
    "normalised_entropy",
    "num_routed_experts",
    "parameter_count",
    "routing_scores",
    "task_accuracy",
    "throughput_sample",
    "wilson_interval",
]
