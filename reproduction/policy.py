"""A policy copy as the engine sees it: a transformers MoE causal LM with an instrumented router.

Each role (trainer, rollout engine, frozen reference) loads its own copy from the checkpoint, as
production frameworks do (verl's FSDP actor and its vLLM engine hold separate weights).  Every
top-k router module is re-wired so the engine can (a) record the experts each token was sent to
and (b) let an injector change the router logits *before* top-k on one side only.  The routing
maths after the logits is re-stated per router family (``ROUTING_MATHS`` below; which class uses
which comes from the architecture table, :mod:`moeproxy.proxy_builder.architectures`) with the same numbers as
transformers 5.x: softmax → top-k (→ renormalise) for Qwen2/3-MoE, OLMoE, Mixtral; sigmoid +
correction bias + group-limited top-k for DeepSeek-V3.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from moeproxy.proxy_builder.architectures import ARCHITECTURES
from moeproxy.reproduction.errors import ModelLoadError

#: hook(layer, logits) -> logits, applied on one copy before top-k
RouterLogitHook = Callable[[int, torch.Tensor], torch.Tensor]


def _softmax_topk(module, logits: torch.Tensor, always_norm: bool = False):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top_v, top_i = torch.topk(probs, module.top_k, dim=-1)
    if always_norm or getattr(module, "norm_topk_prob", False):
        top_v = top_v / top_v.sum(dim=-1, keepdim=True)
    return top_v.to(logits.dtype), top_i


def _mixtral(module, logits):
    probs = torch.softmax(logits.float(), dim=-1)
    top_v, top_i = torch.topk(probs, module.top_k, dim=-1)
    return top_v / top_v.sum(dim=-1, keepdim=True), top_i


def _deepseek_group(module, logits):
    scores = logits.float().sigmoid()
    choice = scores + module.e_score_correction_bias
    g, per = module.num_group, module.num_experts // module.num_group
    group_scores = choice.view(-1, g, per).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=module.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, g, per).reshape(-1, module.num_experts)
    choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
    top_i = torch.topk(choice, k=module.top_k, dim=-1, sorted=False)[1]
    top_w = scores.gather(1, top_i)
    if module.norm_topk_prob:
        top_w = top_w / (top_w.sum(dim=-1, keepdim=True) + 1e-20)
    return top_w * module.routed_scaling_factor, top_i


@dataclass(frozen=True)
class RouterFamily:
    select: Callable  # (module, logits) -> (weights, indices)
    fp32_logits: bool = False  # DeepSeek-V3 computes its router logits in fp32


#: routing maths by the name an architecture entry gives in ``Architecture.routing``
ROUTING_MATHS: dict[str, RouterFamily] = {
    "softmax_topk": RouterFamily(_softmax_topk),
    "softmax_topk_renorm": RouterFamily(_mixtral),
    "sigmoid_group_topk": RouterFamily(_deepseek_group, fp32_logits=True),
}


def router_families() -> dict[str, RouterFamily]:
    """Router module class name -> its routing maths, read from the architecture table."""
    return {a.router_class: ROUTING_MATHS[a.routing] for a in ARCHITECTURES.values() if a.router_class}


_LAYER_RE = re.compile(r"layers\.(\d+)\.")


@dataclass
class RouterControl:
    """Per-copy switchboard shared by all patched routers of that copy."""

    hook: RouterLogitHook | None = None
    recording: bool = False
    records: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def start(self) -> None:
        self.recording = True
        self.records = {}

    def stop(self) -> dict[int, list[torch.Tensor]]:
        self.recording = False
        out, self.records = self.records, {}
        return out


def _patch_router(module: torch.nn.Module, family: RouterFamily, layer: int, ctl: RouterControl) -> None:
    def forward(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim)
        if family.fp32_logits:
            logits = F.linear(h.float(), self.weight.float())
        else:
            logits = F.linear(h, self.weight)
        if ctl.hook is not None:
            logits = ctl.hook(layer, logits)
        weights, indices = family.select(self, logits)
        if ctl.recording:
            ctl.records.setdefault(layer, []).append(indices.detach())
        return logits, weights, indices

    module.forward = types.MethodType(forward, module)


class Policy:
    """One copy of the policy: the HF model, its instrumented routers, its own logits path."""

    def __init__(self, model: torch.nn.Module, device: str, dtype: torch.dtype):
        self.model = model
        self.device = device
        self.dtype = dtype
        self.router = RouterControl()
        self.moe_layers: list[int] = []
        self.router_names: list[str] = []
        self.num_experts = 0
        self.top_k = 0
        families = router_families()
        for name, module in model.named_modules():
            family = families.get(type(module).__name__)
            if family is None:
                continue
            m = _LAYER_RE.search(name)
            layer = int(m.group(1)) if m else len(self.moe_layers)
            _patch_router(module, family, layer, self.router)
            self.moe_layers.append(layer)
            self.router_names.append(name)
            self.num_experts = int(module.num_experts)
            self.top_k = int(module.top_k)
        if not self.moe_layers:
            raise ModelLoadError(
                f"{type(model).__name__}: no top-k router found; supported routers: {sorted(families)}"
            )

    # --- pieces the engine drives ------------------------------------------------------------------

    @property
    def decoder(self) -> torch.nn.Module:
        return self.model.get_decoder()

    @property
    def lm_head(self) -> torch.nn.Linear:
        return self.model.get_output_embeddings()

    def router_weight_names(self) -> list[str]:
        return [f"{n}.weight" for n in self.router_names]

    def hidden(self, input_ids, attention_mask, position_ids, cache=None) -> torch.Tensor:
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The LM head; ``dtype`` runs the projection in that precision (the rollout's logits path)."""
        head = self.lm_head
        if dtype is None or dtype == head.weight.dtype:
            return head(hidden)
        bias = None if head.bias is None else head.bias.to(dtype)
        return F.linear(hidden.to(dtype), head.weight.to(dtype), bias)

    def parameters_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_policy(
    model_dir: str | Path,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    trainable: bool = False,
    experts_implementation: str | None = None,
) -> Policy:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # three copies load per run; the engine reports its own progress
    kwargs = {"dtype": dtype}
    if experts_implementation:
        kwargs["experts_implementation"] = experts_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {model_dir} as a causal LM: {exc}") from exc
    model.to(device)
    model.train(trainable)  # dropout is 0 in these configs; train() only matters for grad paths
    model.requires_grad_(trainable)
    return Policy(model, device, dtype)


def load_tokenizer(model_dir: str | Path):
    """The checkpoint's own tokenizer, or the task suite's character tokenizer when it has none."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError):
        from moeproxy.reproduction.tokenizer import build_tokenizer

        tok = build_tokenizer()
    if tok.pad_token_id is None or tok.eos_token_id is None:
        raise ModelLoadError(f"tokenizer of {model_dir} needs pad and eos tokens")
    return tok
