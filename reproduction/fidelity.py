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
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder.architectures import architecture_for
from moeproxy.reproduction.formats import ResponseFormat, get_format
from moeproxy.reproduction.memory import generation_rss_child
from moeproxy.reproduction.tasks import (
    MAX_ANSWER_CHARS,
    TASKS,
    Example,
    format_prompt,
    format_text,
    make_split,
    reward,
)

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class FidelityError(ValueError):
    """Inputs the harness cannot compare (missing files, mismatched models, bad mapping)."""


# --- statistics ---------------------------------------------------------------------------------------

def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (good near 0 and 1, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def normalised_entropy(counts: Sequence[float]) -> float:
    """Entropy of a count vector divided by log(len): 1 = uniform use, 0 = one expert."""
    total = float(sum(counts))
    if total <= 0 or len(counts) < 2:
        return 0.0
    h = -sum(c / total * math.log(c / total) for c in counts if c > 0)
    return h / math.log(len(counts))


# --- loading ------------------------------------------------------------------------------------------

def load_model(path: Path | str, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FidelityError(f"{path}: not a checkpoint directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    model.eval()
    return model


def load_tokenizer(path: Path | str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(path))
    tok.padding_side = "left"
    return tok


def _architecture(model):
    return architecture_for(model.config.to_dict())


def moe_layers(model) -> dict[int, Any]:
    """Decoder-layer index -> its router module, for every layer with routed experts.

    Where the MoE block sits in memory is the architecture entry's ``runtime_moe_prefix``.
    """
    arch = _architecture(model)
    layers = {}
    for idx in range(len(model.model.layers)):
        try:
            mlp = model.get_submodule(arch.runtime_moe_prefix.format(layer=idx))
        except AttributeError:
            continue
        gate = getattr(mlp, "gate", None)
        if gate is not None and hasattr(mlp, "experts"):
            layers[idx] = gate
    return layers


def num_routed_experts(model) -> int:
    """Routed experts per MoE layer, read through the architecture entry's expert-count keys."""
    return _architecture(model).expert_count(model.config.to_dict())


def expert_mapping(proxy_dir: Path | str, proxy_model, original_experts: int) -> dict[int, list[int]]:
    """Proxy layer -> kept original expert ids in the proxy's order (identity if no report)."""
    layers = moe_layers(proxy_model)
    report = Path(proxy_dir) / "proxy_report.json"
    if not report.exists():
        if num_routed_experts(proxy_model) != original_experts:
            raise FidelityError(f"{proxy_dir}: fewer experts than the original but no proxy_report.json")
        return {idx: list(range(original_experts)) for idx in layers}
    data = json.loads(report.read_text())
    mapping = {int(k): [int(e) for e in v["kept_experts"]] for k, v in data.get("layers", {}).items()}
    for idx in layers:
        if idx not in mapping:
            raise FidelityError(f"proxy_report.json has no layer {idx}")
        if len(mapping[idx]) != num_routed_experts(proxy_model):
            raise FidelityError(f"layer {idx}: {len(mapping[idx])} kept ids for "
                                f"{num_routed_experts(proxy_model)} experts")
    return {idx: mapping[idx] for idx in layers}


# --- generation ---------------------------------------------------------------------------------------

def generate_completions(model, tokenizer, examples: Sequence[Example], batch_size: int = 256,
                         max_new_tokens: int = MAX_ANSWER_CHARS + 1,
                         progress: Progress | None = None) -> list[str]:
    """Greedy completions (decoded with special tokens kept, so the end marker is visible).
    Prompts are batched by length so left padding stays short."""
    import torch

    order = sorted(range(len(examples)), key=lambda i: len(examples[i].prompt))
    out: list[str] = [""] * len(examples)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        enc = tokenizer([format_prompt(examples[i]) for i in idx], padding=True, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=False)
        for i, text in zip(idx, texts):
            out[i] = text
        if progress:
            progress("generate", min(start + batch_size, len(order)), len(order))
    return out


def task_accuracy(examples: Sequence[Example], completions: Sequence[str],
                  fmt: ResponseFormat | None = None) -> dict[str, dict[str, Any]]:
    """Exact-match accuracy per task (the ``accuracy`` reward component of the response format)."""
    fmt = fmt or get_format(None)
    per: dict[str, list[float]] = {}
    for ex, comp in zip(examples, completions):
        per.setdefault(ex.task, []).append(fmt.score(ex, comp)["accuracy"])
    result = {}
    for task, scores in per.items():
        k, n = int(sum(scores)), len(scores)
        result[task] = {"accuracy": k / n, "n": n, "ci95": list(wilson_interval(k, n))}
    return result


# --- teacher-forced capture ---------------------------------------------------------------------------

@dataclass
class Capture:
    """Everything a teacher-forced pass over the KL texts records, on real positions only."""

    logprobs: Any  # [N_positions, V] float32, next-token log-probabilities
    answer_mask: Any  # [N_positions] bool, position predicts an answer token or the end marker
    topk: dict[int, Any]  # MoE layer -> [N_tokens, k] chosen expert ids (own index space)
    top1: dict[int, Any]  # MoE layer -> [N_tokens] expert with the highest routing weight
    hidden: list[Any]  # per decoder layer output: [N_tokens, H]
    expert_counts: dict[int, list[int]]  # MoE layer -> assignments per expert


def _router_hook(store: dict[int, list], idx: int):
    def hook(_module, _inputs, output):
        # Qwen3-MoE and DeepSeek-V3 routers return (logits, weights, indices).
        _logits, weights, indices = output
        store.setdefault(idx, []).append((indices.detach(), weights.detach()))
    return hook


def _encode_texts(tokenizer, examples: Sequence[Example]):
    import torch

    rows, answer_rows = [], []
    for ex in examples:
        ids = tokenizer(format_text(ex)).input_ids
        prompt_len = len(tokenizer(format_prompt(ex)).input_ids)
        rows.append(ids)
        answer_rows.append([0] * prompt_len + [1] * (len(ids) - prompt_len))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    answer = torch.tensor([r + [0] * (width - len(r)) for r in answer_rows]).bool()
    return input_ids, attention, answer


def capture(model, tokenizer, examples: Sequence[Example], batch_size: int = 128,
            progress: Progress | None = None) -> Capture:
    """Teacher-forced pass (right padding) recording log-probs, routing and hidden states."""
    import torch

    gates = moe_layers(model)
    n_experts = num_routed_experts(model)
    logprobs, answer_masks, hidden = [], [], []
    topk: dict[int, list] = {i: [] for i in gates}
    top1: dict[int, list] = {i: [] for i in gates}
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        input_ids, attention, answer = _encode_texts(tokenizer, batch)
        store: dict[int, list] = {}
        handles = [g.register_forward_hook(_router_hook(store, i)) for i, g in gates.items()]
        try:
            with torch.no_grad():
                out = model(input_ids=input_ids, attention_mask=attention, output_hidden_states=True)
        finally:
            for h in handles:
                h.remove()
        real = attention.bool().reshape(-1)
        # position t predicts token t+1; keep positions whose target is a real token
        target_real = attention[:, 1:].bool()
        logprobs.append(out.logits[:, :-1].float().log_softmax(-1)[target_real])
        answer_masks.append(answer[:, 1:][target_real])
        for i in gates:
            indices, weights = store[i][0]
            topk[i].append(indices[real])
            top1[i].append(indices.gather(1, weights.argmax(-1, keepdim=True)).squeeze(1)[real])
        hidden.append([h.reshape(-1, h.shape[-1])[real].float() for h in out.hidden_states[1:]])
        if progress:
            progress("forward", min(start + batch_size, len(examples)), len(examples))
    topk_cat = {i: torch.cat(v) for i, v in topk.items()}
    return Capture(
        logprobs=torch.cat(logprobs),
        answer_mask=torch.cat(answer_masks),
        topk=topk_cat,
        top1={i: torch.cat(v) for i, v in top1.items()},
        hidden=[torch.cat(layer) for layer in zip(*hidden)],
        expert_counts={i: torch.bincount(t.reshape(-1), minlength=n_experts).tolist() for i, t in topk_cat.items()},
    )


# --- comparisons --------------------------------------------------------------------------------------

def kl_divergence(orig: Capture, proxy: Capture) -> tuple[float, float]:
    """Mean KL(original || proxy) over all positions and over answer positions."""
    lp, lq = orig.logprobs, proxy.logprobs
    per_pos = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0)
    answer = per_pos[orig.answer_mask]
    return float(per_pos.mean()), float(answer.mean()) if answer.numel() else float("nan")


def routing_scores(orig: Capture, proxy: Capture, mapping: dict[int, list[int]],
                   n_original: int) -> dict[str, Any]:
    """Coverage of the original top-1 and all-token top-k agreement, per layer and overall."""
    import torch

    coverage, agreement = {}, {}
    cov_hits = agr_hits = cov_total = agr_total = 0
    for layer, kept in mapping.items():
        kept_t = torch.tensor(kept)
        kept_mask = torch.zeros(n_original, dtype=torch.bool)
        kept_mask[kept_t] = True
        o_top1 = orig.top1[layer]
        hits = int(kept_mask[o_top1].sum())
        coverage[layer] = hits / o_top1.numel()
        cov_hits, cov_total = cov_hits + hits, cov_total + o_top1.numel()
        o_sets = torch.zeros(o_top1.numel(), n_original, dtype=torch.bool)
        o_sets.scatter_(1, orig.topk[layer], True)
        p_ids = kept_t[proxy.topk[layer]]  # proxy choices as original ids
        inter = int(o_sets.gather(1, p_ids).sum())
        k = orig.topk[layer].shape[1]
        agreement[layer] = inter / (k * o_top1.numel())
        agr_hits, agr_total = agr_hits + inter, agr_total + k * o_top1.numel()
    return {
        "routing_coverage": cov_hits / cov_total if cov_total else float("nan"),
        "routing_agreement": agr_hits / agr_total if agr_total else float("nan"),
        "routing_coverage_per_layer": {str(k): v for k, v in coverage.items()},
        "routing_agreement_per_layer": {str(k): v for k, v in agreement.items()},
    }


def hidden_cosine(orig: Capture, proxy: Capture) -> list[float]:
    import torch.nn.functional as F

    return [float(F.cosine_similarity(a, b, dim=-1).mean()) for a, b in zip(orig.hidden, proxy.hidden)]


# --- cost ---------------------------------------------------------------------------------------------

def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def measure_peak_memory_mb(path: Path | str, prompts: Sequence[str]) -> float:
    """Peak resident memory a fresh process adds to load the checkpoint (fp32) and generate a batch:
    the RSS high-water mark (reset after the imports) minus the RSS before loading, so the
    interpreter and libraries cancel out.  The process is
    :mod:`~moeproxy.reproduction.memory.generation_rss_child`."""
    argv = [sys.executable, "-m", generation_rss_child.__name__, str(path), json.dumps(list(prompts))]
    res = subprocess.run(argv, capture_output=True, text=True, check=True, env=_one_thread_env())
    return float(json.loads(res.stdout.strip().splitlines()[-1])["run_mb"])


def _one_thread_env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def generation_throughput(models: Sequence[Any], tokenizer, examples: Sequence[Example],
                          repeats: int = 5) -> list[float]:
    """Generated tokens per second of each model (median of ``repeats``), measured side by side:
    the models take turns within every repeat so machine noise hits all of them alike.  Every
    sequence is forced to 9 new tokens so all models do the same work."""
    import torch

    enc = tokenizer([format_prompt(e) for e in examples], padding=True, return_tensors="pt")
    new = MAX_ANSWER_CHARS + 1
    rates: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for i, model in enumerate(models):
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
            rates[i].append(len(examples) * new / (time.perf_counter() - t0))
    return [statistics.median(r) for r in rates]


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
