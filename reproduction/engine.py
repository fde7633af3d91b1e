"""One GRPO run: rollout engine + trainer + frozen reference + explicit weight sync, step by step.

Why not TRL or verl here (issue 6): on a CPU both generate with the trained model itself, which
hides exactly the rollout/trainer faults this product is about.  This engine keeps the
production structure — a separate rollout copy with its own precision, a trainer that recomputes
log-probs, a weight transfer after every update — and a fault :class:`Injector` plugged into the
hook points of :mod:`moeproxy.reproduction.hooks`.

Randomness, all derived from the run's seed so a fault run and its healthy twin see the same
prompts and the same sampler stream until the fault changes what is sampled: prompts from the
task suite (``make_split(split, n, seed=seed * 1_000_003 + step)``), the sampler's own
``torch.Generator(seed)``, the injector's own ``torch.Generator(seed + 7919)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from moeproxy.proxy_builder.process_memory import current_rss_mb
from moeproxy.reproduction import device as devmod
from moeproxy.reproduction.algos import grpo_advantages
from moeproxy.reproduction.config import EngineConfig
from moeproxy.reproduction.hooks import FaultContext, Injector, SyncPlan
from moeproxy.reproduction.formats import format_of_config, score_batch
from moeproxy.reproduction.metrics import data_metrics, reward_metrics, rollout_train_metrics, routing_metrics
from moeproxy.reproduction.policy import load_policy, load_tokenizer
from moeproxy.reproduction.rollout import RolloutEngine
from moeproxy.reproduction.trainer import TrainBatch, Trainer

StepCallback = Callable[[int, dict[str, float]], None]


class GRPOEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        config: EngineConfig | None = None,
        injector: Injector | None = None,
        seed: int = 0,
        device: str = "cpu",
    ):
        self.injector = injector or Injector()
        # A configuration fault is the configuration the job was given (logged as such from step 0).
        self.config = cfg = self.injector.configure(config or EngineConfig())
        self.seed = int(seed)
        devmod.set_cpu_threads(cfg.threads)
        self.device = devmod.resolve_device(device)
        dev = self.device.string
        for dt in {cfg.trainer_dtype, cfg.rollout_dtype}:
            devmod.require_dtype(dev, dt)
        torch.manual_seed(self.seed)
        # process RSS before any copy is loaded: peak minus this is what the run itself costs on CPU
        self.baseline_rss_mb = current_rss_mb() if self.device.kind == "cpu" else 0.0
        self.model_dir = Path(model_dir)
        self.tokenizer = load_tokenizer(model_dir)
        self.tokenizer.padding_side = "left"
        common = {"device": dev, "experts_implementation": cfg.experts_implementation}
        tdtype = devmod.torch_dtype(cfg.trainer_dtype)
        self.trainer_policy = load_policy(model_dir, dtype=tdtype, trainable=True, **common)
        self.rollout_policy = load_policy(model_dir, dtype=devmod.torch_dtype(cfg.rollout_dtype), **common)
        ref = load_policy(model_dir, dtype=tdtype, **common) if cfg.use_kl_loss else None
        # What the model was trained to write decides the reward components and the length budget.
        self.format = format_of_config(self.trainer_policy.model.config.to_dict())
        self.max_new_tokens = cfg.max_new_tokens or self.format.max_new_tokens
        self.rollout = RolloutEngine(
            self.rollout_policy,
            eos_id=self.tokenizer.eos_token_id,
            pad_id=self.tokenizer.pad_token_id,
            max_new_tokens=self.max_new_tokens,
            temperature=cfg.temperature,
        )
        self.trainer = Trainer(self.trainer_policy, ref, cfg, self.injector)
        self.sampler = torch.Generator(device=dev).manual_seed(self.seed)
        self.ctx = FaultContext(generator=torch.Generator(device=dev).manual_seed(self.seed + 7919))
        self.ctx.extras["response_format"] = self.format
        self.rollout.load_weights(self.trainer_policy)  # start in sync, whatever the load path did
        self.injector.bind(self.ctx, self.trainer_policy, self.rollout_policy)

    # --- data ----------------------------------------------------------------------------------------

    def prompts(self, step: int):
        from moeproxy.reproduction.tasks import format_prompt, make_split

        cfg = self.config
        examples = make_split(cfg.prompt_split, cfg.prompts_per_step, seed=self.seed * 1_000_003 + step, tasks=cfg.tasks)
        # verl repeats each prompt n times, interleaved: [p0, p0, …, p1, p1, …]
        repeated = [ex for ex in examples for _ in range(cfg.group_size)]
        enc = self.tokenizer([format_prompt(ex) for ex in repeated], return_tensors="pt", padding=True)
        dev = self.device.string
        return repeated, enc["input_ids"].to(dev), enc["attention_mask"].to(dev)

    def completions(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        rows = [r[m.bool()].tolist() for r, m in zip(responses.cpu(), mask.cpu())]
        return [self.tokenizer.decode(r, skip_special_tokens=False) for r in rows]

    def reward_components(self, step: int, examples, completions: list[str]) -> list[dict[str, float]]:
        """Per sample, the reward components as the (possibly faulty) reward function returns them."""
        clean = score_batch(self.format, examples, completions)
        return list(self.injector.reward(step, examples, completions, clean))

    @staticmethod
    def total(components: list[dict[str, float]]) -> list[float]:
        """The reward of each sample: the sum of its components (TRL adds reward functions with weight 1)."""
        return [float(sum(c.values())) for c in components]

    def score(self, step: int, examples, completions: list[str]) -> list[float]:
        return self.total(self.reward_components(step, examples, completions))

    # --- one step ------------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        cfg, inj, dev = self.config, self.injector, self.device
        self.ctx.step = step
        devmod.reset_peak(dev)
        t0 = time.perf_counter()
        inj.on_step_start(step, self.trainer_policy, self.rollout_policy)

        examples, prompt_ids, prompt_mask = self.prompts(step)
        rb = self.rollout.generate(
            prompt_ids, prompt_mask, step=step, generator=self.sampler, injector=inj, ctx=self.ctx
        )
        completions = self.completions(rb.responses, rb.response_mask)
        components = self.reward_components(step, examples, completions)
        scores = torch.tensor(self.total(components), dtype=torch.float32)
        devmod.synchronize(dev)
        t_gen = time.perf_counter()

        input_ids, attn = rb.input_ids, rb.attention_mask
        old_logp, entropy, train_routing = self.trainer.old_log_probs(
            step, input_ids, attn, rb.responses, rb.response_mask
        )
        ref_logp = self.trainer.ref_log_probs(input_ids, attn, rb.responses)
        adv = grpo_advantages(scores, cfg.group_size, norm_by_std=cfg.norm_adv_by_std_in_grpo)
        devmod.synchronize(dev)
        t_old = time.perf_counter()

        behaviour = rb.rollout_log_probs if cfg.old_logprob_source == "rollout" else old_logp
        data = TrainBatch(
            input_ids, attn, rb.responses, rb.response_mask, adv.to(dev.string), behaviour, ref_logp, rb.rollout_log_probs
        )
        actor = self.trainer.update(step, data)
        devmod.synchronize(dev)
        t_upd = time.perf_counter()

        plan = inj.weight_sync(step, SyncPlan())
        self.rollout.load_weights(self.trainer_policy, plan)
        devmod.synchronize(dev)
        t_end = time.perf_counter()

        mask = rb.response_mask
        values: dict[str, float] = {}
        values.update(data_metrics(scores, adv.cpu(), mask.cpu(), self.max_new_tokens))
        terminated = (rb.responses == self.tokenizer.eos_token_id).any(dim=1)
        values.update(reward_metrics(components, scores, cfg.group_size, mask.cpu(), terminated.cpu()))
        values.update(actor)
        from moeproxy.reproduction.algos import agg_loss

        values["actor/entropy"] = float(agg_loss(entropy, mask, cfg.loss_agg_mode).item())
        values.update(rollout_train_metrics(old_logp.cpu(), rb.rollout_log_probs.cpu(), mask.cpu()))
        values.update(
            routing_metrics(
                None if rb.routing is None else rb.routing.cpu(),
                None if train_routing is None else train_routing.cpu(),
                mask.cpu(), prompt_ids.shape[1], self.trainer_policy.num_experts, self.trainer_policy.moe_layers,
            )
        )
        values["timing_s/gen"] = t_gen - t0
        values["timing_s/old_log_prob"] = t_old - t_gen
        values["timing_s/update_actor"] = t_upd - t_old
        values["timing_s/sync"] = t_end - t_upd
        values["timing_s/step"] = t_end - t0
        values["perf/peak_memory_mb"] = devmod.peak_memory_mb(dev)
        return values

    def run(self, steps: int, on_step: StepCallback | None = None) -> list[dict]:
        """``steps`` RL steps; returns trace records ``{"step": k, "values": {...}}``."""
        trace = []
        for k in range(int(steps)):
            values = self.step(k)
            trace.append({"step": k, "values": values})
            if on_step is not None:
                on_step(k, values)
        return trace

    def describe(self) -> dict:
        p = self.trainer_policy
        cfg = p.model.config
        return {
            "model_type": cfg.model_type,
            "parameters": p.parameters_count(),
            "num_experts": p.num_experts,
            "top_k": p.top_k,
            "moe_layers": len(p.moe_layers),
            "num_hidden_layers": int(cfg.num_hidden_layers),
            "hidden_size": int(cfg.hidden_size),
            "baseline_rss_mb": self.baseline_rss_mb,
        }
