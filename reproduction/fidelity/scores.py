"""The fidelity measures of a proxy against its original: accuracy with Wilson intervals,
expert-utilisation entropy, teacher-forced capture of logits, routing and hidden states, and the
comparisons made from two captures (KL, routing coverage and agreement, hidden-state cosine)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from moeproxy.reproduction.fidelity.models import Progress, moe_layers, num_routed_experts
from moeproxy.reproduction.formats import ResponseFormat, get_format
from moeproxy.reproduction.tasks import Example, format_prompt, format_text

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


