"""The rollout engine: its own policy copy, precision and logits/log-softmax path, batched sampling.

Generation runs the decoder once over the (left-padded) prompts and then one token per step for
the whole batch with a KV cache, so the Python loop is over new tokens, never over samples.  The
engine returns, per sampled token, the log-probability *it* assigned (what vLLM/SGLang hand to
verl as ``rollout_log_probs``) and the top-k experts each position was routed to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from moeproxy.reproduction.hooks import FaultContext, Injector, SyncPlan
from moeproxy.reproduction.policy import Policy


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R] right-padded with pad after eos
    response_mask: torch.Tensor  # [B, R] 1 up to and including eos
    rollout_log_probs: torch.Tensor  # [B, R] float32, of the sampled tokens
    routing: torch.Tensor | None  # [L, B, P + R - 1, k] experts per fed position (rollout side)

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.responses], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def stack_routing(records: dict[int, list[torch.Tensor]], layers: list[int], batch: int) -> torch.Tensor | None:
    """Per-layer chunks of ``[B*T_chunk, k]`` indices -> ``[L, B, T, k]``."""
    if not records:
        return None
    per_layer = []
    for layer in layers:
        chunks = [c.reshape(batch, -1, c.shape[-1]) for c in records.get(layer, [])]
        per_layer.append(torch.cat(chunks, dim=1))
    return torch.stack(per_layer).to(torch.int16)


def sample_tokens(logp: torch.Tensor, generator: torch.Generator, fallback_token: int) -> torch.Tensor:
    """Sample one token per row; a row that is not a distribution (NaN/inf weights after an
    unhandled overflow) emits ``fallback_token``, as an engine fed NaN logits emits garbage."""
    probs = logp.float().exp()
    ok = torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0)
    if not bool(ok.all()):
        probs = torch.where(ok[:, None], probs, torch.zeros_like(probs))
        probs[~ok, fallback_token] = 1.0
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class RolloutEngine:
    def __init__(self, policy: Policy, *, eos_id: int, pad_id: int, max_new_tokens: int, temperature: float):
        self.policy = policy
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature

    @torch.no_grad()
    def load_weights(self, source: Policy, plan: SyncPlan | None = None) -> int:
        """The explicit trainer -> rollout weight transfer; returns how many tensors were copied."""
        plan = plan or SyncPlan()
        if not plan.enabled:
            return 0
        mine = dict(self.policy.model.named_parameters())
        mine.update(dict(self.policy.model.named_buffers()))
        theirs = list(source.model.named_parameters()) + list(source.model.named_buffers())
        copied = 0
        for name, tensor in theirs:
            if name not in mine or (plan.include is not None and not plan.include(name)):
                continue
            value = tensor.detach()
            if plan.transform is not None:
                value = plan.transform(name, value)
            mine[name].copy_(value)  # copy_ casts to the rollout copy's own dtype
            copied += 1
        return copied

    def _router_hook(self, injector: Injector, step: int):
        def hook(layer: int, logits: torch.Tensor) -> torch.Tensor:
            return injector.router_logits(step, "rollout", layer, logits)

        return hook

    def _next_log_probs(self, hidden_last: torch.Tensor, injector: Injector, step: int) -> torch.Tensor:
        dtype = injector.rollout_logits_dtype(step)
        logits = self.policy.logits(hidden_last, dtype=dtype)
        # temperature then log-softmax, both in the logits' own precision: a bf16 engine keeps bf16
        logits = logits / self.temperature
        logp = torch.log_softmax(logits, dim=-1)
        logp = injector.rollout_log_probs(step, logp)
        return logp.float()

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        step: int,
        generator: torch.Generator,
        injector: Injector,
        ctx: FaultContext,
        record_routing: bool = True,
    ) -> RolloutBatch:
        from transformers.cache_utils import DynamicCache

        policy = self.policy
        policy.model.eval()
        batch, plen = prompt_ids.shape
        policy.router.hook = self._router_hook(injector, step)
        if record_routing:
            policy.router.start()
        try:
            cache = DynamicCache(config=policy.model.config)
            mask = prompt_mask.clone()
            pos = position_ids(mask)
            ctx.seq_len = plen
            hidden = policy.hidden(prompt_ids, mask, pos, cache=cache)
            logp = self._next_log_probs(hidden[:, -1], injector, step)
            tokens, logps = [], []
            finished = torch.zeros(batch, dtype=torch.bool, device=prompt_ids.device)
            for t in range(self.max_new_tokens):
                tok = sample_tokens(logp, generator, self.eos_id)
                tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
                tokens.append(tok)
                logps.append(logp.gather(-1, tok[:, None]).squeeze(-1))
                finished = finished | (tok == self.eos_id)
                if bool(finished.all()) or t == self.max_new_tokens - 1:
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                pos = pos[:, -1:] + 1
                ctx.seq_len = mask.shape[1]
                hidden = policy.hidden(tok[:, None], mask, pos, cache=cache)
                logp = self._next_log_probs(hidden[:, -1], injector, step)
        finally:
            policy.router.hook = None
            records = policy.router.stop() if record_routing else {}
        responses = torch.stack(tokens, dim=1)
        rollout_logp = torch.stack(logps, dim=1)
        # 1 up to and including the first eos; pad after it
        is_eos = responses == self.eos_id
        after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
        response_mask = (~after_eos).long()
        rollout_logp = torch.where(after_eos, torch.zeros_like(rollout_logp), rollout_logp)
        routing = stack_routing(records, policy.moe_layers, batch) if record_routing else None
        return RolloutBatch(prompt_ids, prompt_mask, responses, response_mask, rollout_logp, routing)
