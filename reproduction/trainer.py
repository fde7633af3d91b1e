"""The trainer: recomputes log-probs, GRPO policy loss with KL to a frozen reference, AdamW.

Structure of verl's ``DataParallelPPOActor.update_policy``: the rollout batch is split into
``ppo_mini_batch_size`` mini-batches (in prompts × ``group_size`` samples), each one optimizer
step, repeated ``ppo_epochs`` times; when there is a single mini-batch and one epoch the update
is on-policy and the old log-probs are the current ones detached.  ``actor/pg_loss`` and
``actor/kl_loss`` are summed over mini-batch updates as verl's current code does; the other
actor metrics are means over mini-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from moeproxy.reproduction import algos
from moeproxy.reproduction.config import EngineConfig, lr_at
from moeproxy.reproduction.hooks import Injector
from moeproxy.reproduction.views import ENGINE_PREFIX
from moeproxy.reproduction.policy import Policy
from moeproxy.reproduction.rollout import position_ids, stack_routing


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    advantages: torch.Tensor  # [B]
    old_log_probs: torch.Tensor  # [B, R]
    ref_log_probs: torch.Tensor | None  # [B, R]
    rollout_log_probs: torch.Tensor  # [B, R]

    def rows(self, idx: slice) -> TrainBatch:
        pick = lambda t: None if t is None else t[idx]
        return TrainBatch(*(pick(getattr(self, f)) for f in self.__dataclass_fields__))


def response_log_probs(
    policy: Policy,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    responses: torch.Tensor,
    *,
    temperature: float,
    log_prob_hook=None,
    response_mask: torch.Tensor | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (fp32) of ``responses`` under ``policy`` in one full-sequence forward pass."""
    resp_len = responses.shape[1]
    hidden = policy.hidden(input_ids, attention_mask, position_ids(attention_mask))
    h = hidden[:, -resp_len - 1 : -1]
    logits = policy.logits(h).float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    if log_prob_hook is not None:
        logp_all = log_prob_hook(logp_all, response_mask)
    logp = logp_all.gather(-1, responses[..., None].long()).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy


class Trainer:
    def __init__(self, policy: Policy, ref: Policy | None, config: EngineConfig, injector: Injector):
        self.policy = policy
        self.ref = ref
        self.config = config
        self.injector = injector
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )

    def _router_hook(self, step: int):
        def hook(layer, logits):
            return self.injector.router_logits(step, "trainer", layer, logits)

        return hook

    def _log_prob_hook(self, step: int):
        def hook(logp_all, mask):
            return self.injector.trainer_log_probs(step, logp_all, mask)

        return hook

    @torch.no_grad()
    def old_log_probs(self, step: int, input_ids, attention_mask, responses, response_mask):
        """verl's ``compute_log_prob`` on the trainer before the update: log-probs, entropy, routing."""
        self.policy.model.eval()
        self.policy.router.hook = self._router_hook(step)
        self.policy.router.start()
        try:
            logp, entropy = response_log_probs(
                self.policy, input_ids, attention_mask, responses,
                temperature=self.config.temperature, with_entropy=True,
                log_prob_hook=self._log_prob_hook(step), response_mask=response_mask,
            )
        finally:
            self.policy.router.hook = None
            records = self.policy.router.stop()
        routing = stack_routing(records, self.policy.moe_layers, input_ids.shape[0])
        return logp, entropy, routing

    @torch.no_grad()
    def ref_log_probs(self, input_ids, attention_mask, responses):
        if self.ref is None:
            return None
        self.ref.model.eval()
        logp, _ = response_log_probs(
            self.ref, input_ids, attention_mask, responses, temperature=self.config.temperature
        )
        return logp

    def update(self, step: int, data: TrainBatch) -> dict[str, float]:
        cfg = self.config
        inj = self.injector
        model = self.policy.model
        model.train()
        mb = cfg.ppo_mini_batch_size * cfg.group_size
        n_mb = data.input_ids.shape[0] // mb
        on_policy = n_mb == 1 and cfg.ppo_epochs == 1
        lr = lr_at(cfg, step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        kl_fn = algos.kl_estimator(cfg.kl_loss_type)
        sums = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0}
        totals: list[float] = []  # the whole loss of each mini-batch (TRL logs its mean as `loss`)
        lists: dict[str, list[float]] = {}

        def add(name, value):
            lists.setdefault(name, []).append(float(value))

        self.policy.router.hook = self._router_hook(step)
        try:
            for _ in range(cfg.ppo_epochs):
                for i in range(n_mb):
                    part = data.rows(slice(i * mb, (i + 1) * mb))
                    self.optimizer.zero_grad(set_to_none=True)
                    logp, entropy = response_log_probs(
                        self.policy, part.input_ids, part.attention_mask, part.responses,
                        temperature=cfg.temperature, with_entropy=cfg.entropy_coeff != 0,
                        log_prob_hook=self._log_prob_hook(step), response_mask=part.response_mask,
                    )
                    mask = part.response_mask
                    old = logp.detach() if on_policy else part.old_log_probs
                    pg_loss, pg_m = algos.vanilla_policy_loss(
                        old, logp, part.advantages, mask,
                        clip_low=cfg.clip_ratio_low, clip_high=cfg.clip_ratio_high,
                        clip_ratio_c=cfg.clip_ratio_c, agg_mode=cfg.loss_agg_mode,
                    )
                    for k, v in pg_m.items():
                        add(f"{ENGINE_PREFIX}{k}" if k.startswith("clip_ratio/") else f"actor/{k}", v.item())
                    policy_loss = pg_loss
                    if entropy is not None:
                        policy_loss = policy_loss - cfg.entropy_coeff * algos.agg_loss(entropy, mask, cfg.loss_agg_mode)
                    if cfg.use_kl_loss and part.ref_log_probs is not None:
                        coef, est = inj.kl(step, cfg.kl_loss_coef, kl_fn)
                        kl_loss = algos.agg_loss(est(logp, part.ref_log_probs), mask, cfg.loss_agg_mode)
                        policy_loss = policy_loss + coef * kl_loss
                        sums["actor/kl_loss"] += kl_loss.item()
                        add(f"{ENGINE_PREFIX}kl_mean", kl_loss.item())
                        # The configured coefficient, as a framework logs it: a code bug that flips
                        # or zeroes the coefficient in use does not change what the job logs.
                        add("actor/kl_coef", cfg.kl_loss_coef)
                    sums["actor/pg_loss"] += pg_loss.item()
                    add(f"{ENGINE_PREFIX}pg_loss_mean", pg_loss.item())
                    totals.append(policy_loss.item())
                    loss = inj.loss(step, policy_loss)
                    loss.backward()
                    add("actor/grad_norm", self._optimizer_step(step))
        finally:
            self.policy.router.hook = None
        self.optimizer.zero_grad(set_to_none=True)
        out = {k: float(sum(v) / len(v)) for k, v in lists.items()}
        out.update(sums)
        out[f"{ENGINE_PREFIX}total_loss"] = float(sum(totals) / len(totals))
        out["actor/lr"] = lr
        return out

    def _optimizer_step(self, step: int) -> float:
        inj = self.injector
        inj.gradients(step, self.policy)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm=self.config.grad_clip))
        if not math.isfinite(grad_norm) and inj.skip_nonfinite(step, self.config.skip_nonfinite_grad):
            self.optimizer.zero_grad(set_to_none=True)  # verl: skip the update on a non-finite grad norm
        elif inj.optimizer_step(step):
            self.optimizer.step()
        return grad_norm
