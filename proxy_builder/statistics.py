"""Routing statistics collected by forward hooks on the MoE routers (needs torch).

Every transformers 5 MoE router supported here (``Qwen3MoeTopKRouter``,
``Qwen2MoeTopKRouter``, ``MixtralTopKRouter``, ``OlmoeTopKRouter``,
``DeepseekV3TopkRouter``) is a module whose forward takes the router input
(``[tokens, H]`` or ``[batch, seq, H]``) and returns ``(logits, top-k weights,
top-k ids)``.  A forward hook on it therefore sees exactly the routing decision
the model makes, including DeepSeek's group limiting and score-correction bias.

Accumulation is streaming and vectorised: per batch, the top-k one-hot matrix
``M [T, E]`` gives the activation counts (column sums), the co-activation counts
``MᵀM`` and, with the routing weights ``W [T, E]``, the prototype sums ``WᵀX``.
Memory is O(E² + E·H) per layer whatever the number of tokens.  Padding tokens
are dropped with the attention mask before anything is counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Self

import torch
from moeproxy.proxy_builder.architectures import Architecture
from moeproxy.proxy_builder.errors import UnsupportedArchitecture
from moeproxy.proxy_builder.layer_stats import Batch, LayerStatistics


class RoutingAccumulator:
    """Streaming statistics of one MoE layer (see the module docstring)."""

    def __init__(self, layer: int, num_experts: int, hidden: int, *, weighted_prototypes: bool = True) -> None:
        self.layer = layer
        self.num_experts = num_experts
        self.weighted_prototypes = weighted_prototypes
        self.tokens = 0
        # float64 on the host: exact counts far beyond 2**24 tokens.
        self.frequency = torch.zeros(num_experts, dtype=torch.float64)
        self.coactivation = torch.zeros(num_experts, num_experts, dtype=torch.float64)
        self.prototype_sum = torch.zeros(num_experts, hidden, dtype=torch.float64)
        self.prototype_weight = torch.zeros(num_experts, dtype=torch.float64)
        self.routing_mass = torch.zeros(num_experts, dtype=torch.float64)

    @torch.no_grad()
    def update(
        self,
        router_input: torch.Tensor,  # [T, H]
        expert_ids: torch.Tensor,  # [T, k]
        expert_weights: torch.Tensor,  # [T, k]
        mask: torch.Tensor | None = None,  # [T] bool, True = real token
    ) -> None:
        if mask is not None:
            keep = mask.to(router_input.device).bool()
            router_input, expert_ids, expert_weights = router_input[keep], expert_ids[keep], expert_weights[keep]
        t = router_input.shape[0]
        if t == 0:
            return
        x = router_input.float()
        # Per-batch products in float32 on the compute device: integer counts are
        # exact below 2**24 tokens per batch, then summed on the host in float64.
        onehot = torch.zeros(t, self.num_experts, dtype=torch.float32, device=x.device)
        onehot.scatter_(1, expert_ids.long(), 1.0)
        weights = torch.zeros_like(onehot)
        weights.scatter_(1, expert_ids.long(), expert_weights.float())
        proto_w = weights if self.weighted_prototypes else onehot
        self.tokens += t
        self.frequency += onehot.sum(0).double().cpu()
        self.coactivation += (onehot.T @ onehot).double().cpu()
        self.prototype_sum += (proto_w.T @ x).double().cpu()
        self.prototype_weight += proto_w.sum(0).double().cpu()
        self.routing_mass += weights.sum(0).double().cpu()

    def result(self, router_weight: torch.Tensor) -> LayerStatistics:
        return LayerStatistics(
            layer=self.layer,
            tokens=self.tokens,
            frequency=self.frequency.round().to(torch.int64).numpy(),
            coactivation=self.coactivation.round().to(torch.int64).numpy(),
            prototype_sum=self.prototype_sum.numpy(),
            prototype_weight=self.prototype_weight.numpy(),
            routing_mass=self.routing_mass.numpy(),
            router_weight=router_weight.detach().float().cpu().numpy(),
        )


class RoutingStatisticsCollector:
    """Hooks the routers of ``layers``; use as a context manager around forward passes.

    Call :meth:`set_mask` with the batch's attention mask before each forward so
    the hooks can drop padding tokens.
    """

    def __init__(
        self, model: torch.nn.Module, arch: Architecture, layers: Sequence[int], *, weighted_prototypes: bool = True
    ) -> None:
        modules = dict(model.named_modules())
        self._routers: dict[int, torch.nn.Module] = {}
        for layer in layers:
            name = arch.runtime_router.format(layer=layer)
            router = modules.get(name)
            if router is None or not isinstance(getattr(router, "weight", None), torch.Tensor):
                raise UnsupportedArchitecture(
                    f"{type(model).__name__} has no router module {name!r} with a weight; "
                    "this transformers version lays the model out differently than the architecture table expects"
                )
            self._routers[layer] = router
        self.accumulators = {
            layer: RoutingAccumulator(
                layer, r.weight.shape[0], r.weight.shape[1], weighted_prototypes=weighted_prototypes
            )
            for layer, r in self._routers.items()
        }
        self._mask: torch.Tensor | None = None
        self._handles: list = []

    def set_mask(self, attention_mask: torch.Tensor | None) -> None:
        self._mask = None if attention_mask is None else attention_mask.reshape(-1).bool()

    def __enter__(self) -> Self:
        for layer, router in self._routers.items():
            self._handles.append(router.register_forward_hook(self._hook(layer), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, layer: int):
        acc = self.accumulators[layer]

        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            if not (isinstance(output, tuple) and len(output) == 3):
                raise UnsupportedArchitecture(
                    f"router of layer {layer} returned {type(output).__name__}, expected (logits, weights, ids)"
                )
            _, weights, ids = output
            x = x.reshape(-1, x.shape[-1])
            mask = self._mask
            if mask is not None and mask.numel() != x.shape[0]:
                raise UnsupportedArchitecture(
                    f"router of layer {layer} saw {x.shape[0]} tokens but the batch has {mask.numel()}"
                )
            acc.update(x, ids.reshape(x.shape[0], -1), weights.reshape(x.shape[0], -1), mask)

        return hook

    def results(self) -> dict[int, LayerStatistics]:
        return {layer: self.accumulators[layer].result(r.weight) for layer, r in self._routers.items()}


@torch.no_grad()
def collect_statistics(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    arch: Architecture,
    layers: Sequence[int],
    *,
    weighted_prototypes: bool = True,
    progress=None,
) -> dict[int, LayerStatistics]:
    """Run ``batches`` through ``model`` and return the routing statistics of each MoE layer.

    ``progress``: optional callable taking the number of real tokens of each
    finished batch (e.g. a tqdm bar's ``update``).
    """
    device = next(model.parameters()).device
    collector = RoutingStatisticsCollector(model, arch, layers, weighted_prototypes=weighted_prototypes)
    with collector:
        for batch in batches:
            ids = torch.as_tensor(batch.input_ids, device=device)
            mask = torch.as_tensor(batch.attention_mask, device=device)
            collector.set_mask(mask)
            model(input_ids=ids, attention_mask=mask, use_cache=False)
            if progress is not None:
                progress(batch.real_tokens)
    return collector.results()


@torch.no_grad()
def next_token_kl(original: torch.nn.Module, proxy: torch.nn.Module, batches: Iterable[Batch]) -> float:
    """Mean over real tokens of KL(original ‖ proxy) of the next-token distributions."""
    device = next(original.parameters()).device
    total, count = 0.0, 0
    for batch in batches:
        ids = torch.as_tensor(batch.input_ids, device=device)
        mask = torch.as_tensor(batch.attention_mask, device=device)
        logp = torch.log_softmax(original(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), -1)
        logq = torch.log_softmax(proxy(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)
        real = mask.bool()
        total += float(kl[real].sum())
        count += int(real.sum())
    return total / max(count, 1)
