"""Real TRL runs (issue 17, item 6): TRL's own ``GRPOTrainer`` on CPU, faults injected through TRL's
own surface, every logged step posted by ``MoeproxyCallback`` to a real moeproxy server.

The policy is the RL starting point ``qwen3-moe-64e-rl`` (a small Qwen3-MoE with the task suite's
character tokenizer, trained on the reasoning format ``<t>…</t><a>…</a>``); its reference model is
the same checkpoint, loaded by TRL itself because ``beta`` is not 0. Prompts are plain text (the
tokenizer has no chat template) from the train split of the tasks the reference model's RL
settings name (``rl_engine_defaults``); two reward functions, ``accuracy_reward`` and
``format_reward``, score with the format's own parser, so TRL logs ``rewards/<function>/mean``.

The runs (:data:`RUNS`), each labelled with its fault class and onset step:

* ``healthy``: the settings of :func:`base_config`;
* ``healthy_warmup``: the same with a cosine LR schedule after a 10% warm-up, on the next seed;
* ``lr_x100``: ``learning_rate`` ×100 in ``GRPOConfig`` (``lr_misconfiguration``, onset 0);
* ``reward_zero``: an ``accuracy_reward`` whose parser never matches, so it returns 0.0 for every
  completion (``reward_fault``, onset 0);
* ``negative_beta``: ``beta`` with its sign flipped (``kl_misconfiguration``, onset 0), when
  ``GRPOConfig``/``GRPOTrainer`` accept it; a refusal is recorded in the manifest instead;
* ``frozen``: every parameter ``requires_grad=False`` with the input embeddings still
  requiring grad (what PEFT with gradient checkpointing does), so backward runs, ``grad_norm`` is 0
  and the optimizer steps over nothing (``actor_update_omission``, onset 0);
* ``nan_grad``: a ``TrainerCallback`` whose gradient hook turns the output layer's gradient into NaN
  at a late step (``gradient_overflow``, onset that step). TRL does not skip a non-finite step:
  the weights turn NaN and sampling then fails, so the trace ends there (SPEC §4).

Batch 2 (``--batch 2``, ``benchmarks/results/trl_runs_2``) adds new variants of the same classes,
each run on a seed of its own (20, 21, ...): a healthy run, one at TRL's default ``beta`` 0 (no KL
logged), one at a constant LR; LR ×10 and ×1000; LR 0 (``actor_update_omission``); both rewards
constant at 1.0 and an accuracy reward replaced by a coin flip (``reward_fault``); a NaN gradient at
a quarter of the run; ``beta`` -0.1. It was frozen before any scoring. Batch 3 (``--batch 3``,
``benchmarks/results/trl_runs_3``, seeds 40-45), frozen after the rules written on batch 2 and
before its own first scoring: healthy with a warm-up and cosine decay, healthy at ``beta`` 0; LR
×300 behind a warm-up, LR ×1000 at ``beta`` 0 (no KL logged); the format reward always 0; a NaN
gradient at 90% of the run. Batch 4 (``--batch 4``, ``benchmarks/results/trl_runs_4``, seeds
60-65), frozen after the rules written on batch 3 and before its own first scoring: healthy under
Dr. GRPO's loss and with two updates per generation batch; every parameter frozen halfway
(``actor_update_omission``), the accuracy reward 0 from halfway (``reward_fault``), a +inf gradient
halfway; LR ×30. Batch 5 (``--batch 5``, ``benchmarks/results/trl_runs_5``, seeds 80-85), frozen
after the rules written on batch 4 and before its own first scoring: healthy at ``beta`` 0.1 and
with rewards scaled per batch; the accuracy reward with its sign flipped; the LR schedule ×100 from
halfway; ``beta`` -0.01; every optimizer update dropped from halfway after the gradient norm was
logged (``actor_update_omission`` with a normal-looking norm). Batch 6 (``--batch 6``,
``benchmarks/results/trl_runs_6``, seeds 100-105), frozen after batch 5 (no rule was written on it)
and before its own first scoring: healthy at ``temperature`` 0.7 and with DAPO's clip-higher
(``epsilon_high`` 0.28); the policy's MoE routers noised at their own scale halfway, and a quarter
of their rows re-initialised at a quarter of the run (``router_corruption``: TRL logs no routing
metric but the load-balancing ``aux_loss``); the accuracy checked against another prompt's answer
(``reward_fault``); a warm-up 100x the run, so the LR never passes 1% of its value
(``actor_update_omission``). Batch 7 (``--batch 7``, ``benchmarks/results/trl_runs_7``, seeds
120-125), frozen after the rules written on batch 6 and before its own first scoring: healthy under
the original GRPO loss and at half the LR; the routers noised at 3x their scale at three quarters of
the run, and round-tripped through bf16 before every step from halfway (``router_corruption``); the
accuracy read from the first 32 characters of each completion only (``reward_fault``); every second
optimizer update dropped from the first (``actor_update_omission``). Batch 8 (``--batch 8``,
``benchmarks/results/trl_runs_8``, seeds 140-145), frozen after the load-balancing rule written on
batches 6 and 7 and before its own first scoring: healthy at ``router_aux_loss_coef`` 0.1 (10x the
model's) and at ``beta`` 0.01; the routers noised at 2x their scale at a quarter of the run, and at
their own scale before the first update; half their rows re-initialised at 60% of the run; an
eighth of their rows x4 halfway (all ``router_corruption``). Batch 9 (``--batch 9``,
``benchmarks/results/trl_runs_9``, seeds 160-165), frozen after batch 8 (no rule was written on it)
and before its own first scoring: healthy at ``temperature`` 1.2 and at ``top_p`` 0.9; milder router
faults (noise at half the routers' scale at a quarter and at three quarters of the run, an eighth
of their rows re-initialised halfway); the LR schedule x10 from halfway (``lr_misconfiguration``).
Batch 10 (``--batch 10``, ``benchmarks/results/trl_runs_10``, seeds 180-185), frozen after batch 9's
tie-share fix and before its own first scoring: healthy at twice the LR and at a narrower clip
(``epsilon`` 0.1); the trainer's ``beta`` negated halfway (``kl_misconfiguration``); the answer key
wrong for 30% of the prompts (label noise) and a checker that pays for length (both
``reward_fault``, onset 0); a NaN gradient in every MoE router at 40% of the run.
Batch 11 (``--batch 11``, ``benchmarks/results/trl_runs_11``, seeds 200-205), frozen after batch 10
(no rule was written on it) and before its own first scoring, asks whether the misses of faults
that only take the learning away are the harness's: its steps are twice as wide (4 prompts x 8
completions, :data:`WIDE`), so a healthy run learns visibly. Healthy, and healthy behind a warm-up
and cosine decay; the accuracy reward a coin flip, with its sign flipped, and wrong on 30% of the
prompts (``reward_fault``, onset 0); every update dropped from halfway (``actor_update_omission``).
Batch 12 (``--batch 12``, ``benchmarks/results/trl_runs_12``, seeds 220-225), frozen after the weight
probe's two rules were written and before its own first scoring: the first runs whose callback sends
what each optimizer step did to the weights (``moeproxy/update_ratio`` ...). Healthy, and healthy
behind a warm-up from LR 0; every update dropped from a quarter of the run and every third update
dropped from the first (``actor_update_omission``); the routers round-tripped through bf16 before
every step from three quarters of the run (``router_corruption``); a NaN gradient at a third.
Batches 13 to 15 (``--batch 13`` to ``--batch 15``, seeds 240-245, 260-265, 280-285), each frozen
after the rules written on the batch before and before its own first scoring, all with the probe:
faults through TRL's own options (a checker returning None from halfway, the reference synced to
the policy every step, an optimizer built over a copy of the model; ``reward_weights`` [-1, 1],
``beta`` x250, ``beta`` set to 0 halfway, LR x10 under warm-up and cosine; the accuracy sign flipped
halfway, the LR x30 from halfway) beside healthy runs under other settings (gradient accumulation,
a warm-up then constant LR, the bnpo loss, ``max_grad_norm`` 0.1, frozen routers, weight decay), and
batch 9's two router faults again, now probed. Batch 16 (``--batch 16``, seeds 300-305): healthy at
``top_k`` 20 and at ``temperature`` 0.7; the LR x0 from halfway (a run resumed with its scheduler at
its end), a checker one call behind, the LR x1000 from halfway, a NaN router gradient at three
quarters.

Each finished run leaves ``OUT/<run>.json``, the REST ingest body (``{"name", "framework",
"steps": [{"step", "values"}]}``, and since batch 2 the run's ``config`` as the callback sent it) as
read back from the server's API, so it is what the service stored; ``OUT/manifest.json`` (versions, settings, wall time and outcome of every run) and
``OUT/labels.json`` (``{run: {"label", "onset", "framework", "steps"}}``, steps as logged, what ``benchmarks/evalsets.py``
reads) and ``OUT/MANIFEST.sha256`` (every JSON file's SHA-256: the freeze evalsets.py checks). A run whose trace exists is skipped on restart.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/trl_runs.py               # batch 1
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/trl_runs.py --batch 2     # batch 2: trl_runs_2
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/trl_runs.py --runs healthy --steps 5 --out /tmp/smoke

Without ``--url``/``--token`` it serves ``moeproxy serve`` over a SQLite file in a temporary
directory for the duration of the script.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "trl_runs"
REFERENCE = "qwen3-moe-64e-rl"
FRAMEWORK = "trl"
#: Steps of one run: about 3.5 minutes on one CPU thread at the measured 1.0-1.5 s a step.
DEFAULT_STEPS = 200
#: The KL coefficient of the healthy run (TRL 1.16 defaults to 0, which loads no reference model);
#: the value SPEC §4's list of what TRL logs was read with.
HEALTHY_BETA = 0.04
#: Where the NaN lands, as a share of the run (a late step).
NAN_AT = 0.75


# --- prompts and rewards ------------------------------------------------------------------------------

def prompt_dataset(n: int, seed: int):
    """``n`` train-split prompts of the reference model's RL tasks, with what the rewards need."""
    from datasets import Dataset
    from moeproxy.reproduction.reference import rl_engine_defaults
    from moeproxy.reproduction.tasks import format_prompt, make_split

    tasks = rl_engine_defaults(REFERENCE).get("tasks")
    rows = [{"prompt": format_prompt(e), "task": e.task, "answer": e.answer}
            for e in make_split("train", n, seed=seed, tasks=tasks)]
    return Dataset.from_list(rows)


def _components(prompts, completions, task, answer) -> list[dict[str, float]]:
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import Example

    fmt = get_format("reasoning")
    return [fmt.score(Example(t, p, a), c) for p, c, t, a in zip(prompts, completions, task, answer)]


def accuracy_reward(prompts, completions, task, answer, **_) -> list[float]:
    """1.0 when the answer inside ``<a>…</a>`` is exactly right (formats.py)."""
    return [c["accuracy"] for c in _components(prompts, completions, task, answer)]


def format_reward(prompts, completions, task, answer, **_) -> list[float]:
    """1.0 when the whole completion follows ``<t>…</t><a>…</a>`` (formats.py)."""
    return [c["format"] for c in _components(prompts, completions, task, answer)]


# --- the runs ------------------------------------------------------------------------------------------

@dataclass
class Setup:
    """What one run hands to ``GRPOTrainer``; a fault edits it and returns its onset step (None for
    the healthy run)."""

    model: Any
    steps: int
    config: dict[str, Any]
    reward_funcs: list[Callable] = field(default_factory=lambda: [accuracy_reward, format_reward])
    callbacks: list[Any] = field(default_factory=list)
    #: Called with the ``GRPOTrainer`` once it is built: a fault that changes the trainer itself.
    on_trainer: list[Callable[[Any], None]] = field(default_factory=list)
    #: ``GRPOTrainer(optimizers=...)``: (optimizer, scheduler), None for the trainer's own.
    optimizers: tuple[Any, Any] = (None, None)


def base_config(steps: int, seed: int, output_dir: str) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments of the healthy run; TRL's defaults for everything else
    (linear LR decay, loss ``dapo``, group-scaled rewards, one iteration per batch)."""
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.reference import rl_engine_defaults

    return {
        "output_dir": output_dir,
        "max_steps": steps,
        "learning_rate": rl_engine_defaults(REFERENCE)["lr"],
        "beta": HEALTHY_BETA,
        "per_device_train_batch_size": 8,
        "num_generations": 4,  # 2 prompts x 4 completions a step
        "max_completion_length": get_format("reasoning").max_new_tokens,
        "temperature": 1.0,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "bf16": False,
        # TRL turns it on by default; it changes no value here, only costs a second forward on CPU.
        # (transformers 5 calls it activation_checkpointing; the old name is a deprecated alias.)
        "activation_checkpointing": False,
        "seed": seed,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def _healthy(setup: Setup) -> None:
    return None


def _healthy_warmup(setup: Setup) -> None:
    # The schedule most GRPO recipes use (TRL's and verl's examples: warm-up, then cosine decay), on
    # a seed of its own: the LR moves through the whole run and must not read as a fault.
    setup.config.update(lr_scheduler_type="cosine", warmup_steps=0.1, seed=setup.config["seed"] + 1)


def constant_reward(name: str, value: float) -> Callable[..., list[float]]:
    """A reward function that TRL logs as ``name`` (it logs a reward under its function's
    ``__name__``) and that gives every completion ``value``: a parser that never matches, a reward
    service answering its default."""

    def reward(prompts, completions, **_) -> list[float]:
        return [value for _c in completions]

    reward.__name__ = reward.__qualname__ = name
    return reward


def _reward_zero(setup: Setup) -> int:
    # An accuracy parser that never matches (it looks for a tag the model never writes): always 0.0.
    setup.reward_funcs = [constant_reward("accuracy_reward", 0.0), format_reward]
    return 0


def _negative_beta(setup: Setup) -> int:
    setup.config["beta"] = -abs(setup.config["beta"])
    return 0


def _frozen_params(setup: Setup) -> int:
    setup.model.requires_grad_(False)
    # PEFT with gradient checkpointing keeps the embeddings' output requiring grad, so the loss
    # still has a graph and backward runs; with the adapter frozen nothing receives a gradient.
    setup.model.enable_input_require_grads()
    return 0


def output_layer(model) -> list:
    return [model.get_output_embeddings().weight]


def nan_gradient_callback(at_step: int, value: float = float("nan"), weights: Callable[[Any], list] = output_layer):
    """A ``TrainerCallback`` that makes the backward of step ``at_step`` (1-based, as TRL logs steps)
    give ``value`` (NaN, or +inf) for every element of the gradient of ``weights(model)`` (the
    output layer's by default), as an overflow in backward would."""
    import torch
    from transformers import TrainerCallback

    class NanGradientAt(TrainerCallback):
        def __init__(self):
            self.handles = []

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == at_step and not self.handles:
                self.handles = [w.register_hook(lambda grad: torch.full_like(grad, value)) for w in weights(model)]

        def on_step_end(self, args, state, control, **kwargs):
            for handle in self.handles:
                handle.remove()
            self.handles = []

    return NanGradientAt()


def _at(setup: Setup, share: float) -> int:
    """The step (1-based) at ``share`` of the run, never the first: a fault needs a step before it."""
    return max(2, round(setup.steps * share))


def _nan_grad_at(share: float, value: float = float("nan"),
                 weights: Callable[[Any], list] = output_layer) -> Callable[[Setup], int]:
    def apply(setup: Setup) -> int:
        at = _at(setup, share)
        setup.callbacks.append(nan_gradient_callback(at, value, weights))
        return at

    return apply


def step_flag_callback(at_step: int, act: Callable[..., None]):
    """A ``TrainerCallback`` that calls ``act`` once, as step ``at_step`` (1-based) begins, with
    what it names of ``model``, ``optimizer`` and ``lr_scheduler``: a fault that starts in the middle
    of a run."""
    import inspect

    from transformers import TrainerCallback

    wants = set(inspect.signature(act).parameters)

    class AtStep(TrainerCallback):
        def __init__(self):
            self.done = False

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == at_step and not self.done:
                self.done = True
                act(**{k: v for k, v in kwargs.items() if k in wants})

    return AtStep()


def _healthy_beta0(setup: Setup) -> None:
    # TRL's own default (GRPOConfig.beta = 0.0): no reference model, so no KL is logged at all.
    setup.config["beta"] = 0.0


def _healthy_constant(setup: Setup) -> None:
    setup.config["lr_scheduler_type"] = "constant"


def _lr_times(factor: float) -> Callable[[Setup], int]:
    def apply(setup: Setup) -> int:
        setup.config["learning_rate"] *= factor
        return 0

    return apply


def _lr_zero(setup: Setup) -> int:
    # SPEC section 3, actor_update_omission: "LR 0 at first step"; the optimizer steps over nothing.
    setup.config["learning_rate"] = 0.0
    return 0


def _reward_constant(setup: Setup) -> int:
    # Every completion scores the same, so every group ties and every advantage is 0.
    setup.reward_funcs = [constant_reward("accuracy_reward", 1.0), constant_reward("format_reward", 1.0)]
    return 0


def _reward_noise(setup: Setup) -> int:
    import random

    rng = random.Random(setup.config["seed"])

    def accuracy_reward(prompts, completions, task, answer, **_) -> list[float]:
        # Label noise at its worst: a coin flip stands in for the checker on every completion.
        return [float(rng.random() < 0.5) for _c in completions]

    setup.reward_funcs = [accuracy_reward, format_reward]
    return 0


def _negative_beta_large(setup: Setup) -> int:
    setup.config["beta"] = -0.1
    return 0


def _healthy_cosine(setup: Setup) -> None:
    setup.config.update(lr_scheduler_type="cosine", warmup_steps=0.1)


def _lr_x300_warmup(setup: Setup) -> int:
    # An SFT learning rate behind the schedule most recipes use: the level is the peak, not step 0.
    setup.config.update(learning_rate=setup.config["learning_rate"] * 300, lr_scheduler_type="cosine",
                        warmup_steps=0.1)
    return 0


def _lr_x1000_beta0(setup: Setup) -> int:
    setup.config.update(learning_rate=setup.config["learning_rate"] * 1000, beta=0.0)
    return 0


def _format_zero(setup: Setup) -> int:
    # A format regex that never matches: this component gives 0.0 to every completion.
    setup.reward_funcs = [accuracy_reward, constant_reward("format_reward", 0.0)]
    return 0


def _healthy_dr_grpo(setup: Setup) -> None:
    # Dr. GRPO's loss (arXiv:2503.20783): no length or std normalisation; the rest as healthy.
    setup.config["loss_type"] = "dr_grpo"


def _healthy_two_iterations(setup: Setup) -> None:
    # Each generation batch serves two updates (GRPO's mu = 2): the second is off-policy, so the
    # clip ratio leaves 0 (on 20 of trl_runs_4's 200 steps), as it does in recipes with mu > 1.
    setup.config["num_iterations"] = 2


def _frozen_late(setup: Setup) -> int:
    def freeze(model) -> None:
        # A run that stops training halfway: every parameter frozen (backward still runs through
        # the inputs, as under PEFT with gradient checkpointing), so the optimizer steps over nothing.
        model.requires_grad_(False)
        model.enable_input_require_grads()

    at = _at(setup, 0.5)
    setup.callbacks.append(step_flag_callback(at, freeze))
    return at


def _accuracy_broken_from(share: float, broken: Callable[[list[float]], list]) -> Callable[[Setup], int]:
    """``accuracy_reward`` as it is until step round(share x steps), ``broken(its scores)`` from then
    on (a checker that a code change or a failing service breaks mid-run)."""

    def apply(setup: Setup) -> int:
        now = {"broken": False}

        # functools.wraps keeps the checker's name, which TRL logs the reward under.
        @functools.wraps(accuracy_reward)
        def checker(prompts, completions, **kw) -> list:
            scores = accuracy_reward(prompts, completions, **kw)
            return broken(scores) if now["broken"] else scores

        at = _at(setup, share)
        setup.reward_funcs = [checker, format_reward]
        setup.callbacks.append(step_flag_callback(at, lambda: now.update(broken=True)))
        return at

    return apply


def _zero(scores: list[float]) -> list[float]:
    return [0.0 for _s in scores]  # a reward service answering its default


def _healthy_beta_high(setup: Setup) -> None:
    setup.config["beta"] = 0.1  # a tighter hold on the reference than the healthy run's


def _healthy_scale_batch(setup: Setup) -> None:
    # Rewards scaled by the batch's standard deviation instead of each group's (TRL's "batch").
    setup.config["scale_rewards"] = "batch"


def _reward_sign_flip(setup: Setup) -> int:
    @functools.wraps(accuracy_reward)
    def flipped(prompts, completions, **kw) -> list[float]:
        # A sign error in the checker: a right answer costs what it should earn.
        return [-r for r in accuracy_reward(prompts, completions, **kw)]

    setup.reward_funcs = [flipped, format_reward]
    return 0


def _lr_times_late(factor: float, share: float) -> Callable[[Setup], int]:
    """The LR schedule multiplied by ``factor`` from step round(share x steps): a resumed run whose
    LR override multiplies the schedule, every later step at ``factor`` times."""

    def apply(setup: Setup) -> int:
        def raise_lr(optimizer, lr_scheduler) -> None:
            for group in optimizer.param_groups:
                group["lr"] *= factor
            lr_scheduler.base_lrs = [b * factor for b in lr_scheduler.base_lrs]

        at = _at(setup, share)
        setup.callbacks.append(step_flag_callback(at, raise_lr))
        return at

    return apply


def _negative_beta_small(setup: Setup) -> int:
    setup.config["beta"] = -0.01
    return 0


def update_dropped_callback(drops: Callable[[int], bool]):
    """A ``TrainerCallback`` that drops the optimizer update of every step (1-based) ``drops``
    names, after the gradient norm was measured and logged: the gradients are cleared before
    ``optimizer.step()``, so the log shows a normal gradient norm and the policy does not move (an
    optimizer wrapper that skips its step, a sharded update that never reaches the weights)."""
    from transformers import TrainerCallback

    class DropUpdates(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            if drops(state.global_step + 1):
                optimizer.zero_grad(set_to_none=True)  # AdamW skips a parameter without a gradient

    return DropUpdates()


def _updates_dropped_from(share: float) -> Callable[[Setup], int]:
    def apply(setup: Setup) -> int:
        at = _at(setup, share)
        setup.callbacks.append(update_dropped_callback(lambda step: step >= at))
        return at

    return apply


_update_dropped_late = _updates_dropped_from(0.5)


def _healthy_temperature(setup: Setup) -> None:
    setup.config["temperature"] = 0.7  # sharper sampling than TRL's default 1.0


def _healthy_clip_higher(setup: Setup) -> None:
    # DAPO's clip-higher (arXiv:2503.14476): a wider upper clip range, 0.28 against 0.2 below.
    setup.config["epsilon_high"] = 0.28


def router_gates(model) -> list:
    """Every MoE layer's router weight (``mlp.gate.weight``: experts x hidden)."""
    gates = [m.mlp.gate.weight for m in model.model.layers if hasattr(getattr(m, "mlp", None), "gate")]
    if not gates:
        raise RuntimeError("the policy has no MoE router (mlp.gate) to corrupt")
    return gates


def _router_noise(share: float | None, scale: float) -> Callable[[Setup], int]:
    """Router noise from step round(share x steps), or before the first update (``share`` None:
    onset 0, a policy loaded from a damaged checkpoint)."""

    def apply(setup: Setup) -> int:
        def noise(model) -> None:
            # Router weights damaged in place (a bad checkpoint merge, a broken transfer): Gaussian
            # noise at ``scale`` times each router's own weight scale, seeded so the run repeats.
            import torch

            gen = torch.Generator().manual_seed(setup.config["seed"])
            with torch.no_grad():
                for w in router_gates(model):
                    w.add_(torch.randn(w.shape, generator=gen).to(w.dtype) * (scale * w.std()))

        at = 1 if share is None else _at(setup, share)
        setup.callbacks.append(step_flag_callback(at, noise))
        return 0 if share is None else at

    return apply


def _router_rows(parts: int, share: float, change: Callable[..., None]) -> Callable[[Setup], int]:
    """One in ``parts`` of every router's rows, drawn with the run's seed, changed in place by
    ``change(w, rows, gen, model)`` at step round(share x steps)."""

    def apply(setup: Setup) -> int:
        def damage(model) -> None:
            import torch

            gen = torch.Generator().manual_seed(setup.config["seed"])
            with torch.no_grad():
                for w in router_gates(model):
                    rows = torch.randperm(w.shape[0], generator=gen)[: w.shape[0] // parts]
                    change(w, rows, gen, model)

        at = _at(setup, share)
        setup.callbacks.append(step_flag_callback(at, damage))
        return at

    return apply


def _reinit_rows(w, rows, gen, model) -> None:
    # Rows loaded from the initialiser instead of the checkpoint (an expert-parallel reshard, a
    # resume that misses those experts' gate rows).
    import torch

    std = model.config.initializer_range
    w[rows] = (torch.randn((rows.numel(), w.shape[1]), generator=gen) * std).to(w.dtype)


def _scale_rows(w, rows, gen, model) -> None:
    # Rows x4 (a shard loaded with its scale applied twice): those experts' logits grow, and the
    # tokens they already won they win by more.
    w[rows] *= 4.0


def _router_reinit(parts: int, share: float) -> Callable[[Setup], int]:
    """One in ``parts`` of every router's rows re-initialised at step round(share x steps)."""
    return _router_rows(parts, share, _reinit_rows)


def _healthy_aux_coef_high(setup: Setup) -> None:
    # A stronger load-balancing loss than the model's own coefficient (TRL's router_aux_loss_coef).
    setup.config["router_aux_loss_coef"] = 0.1


def _healthy_beta_low(setup: Setup) -> None:
    setup.config["beta"] = 0.01  # a looser hold on the reference than the healthy run's 0.04


def _healthy_temperature_high(setup: Setup) -> None:
    setup.config["temperature"] = 1.2  # more exploratory sampling than TRL's default 1.0


def _healthy_top_p(setup: Setup) -> None:
    setup.config["top_p"] = 0.9  # nucleus sampling


def _reward_shuffled(setup: Setup) -> int:
    @functools.wraps(accuracy_reward)
    def shuffled(prompts, completions, task, answer, **kw) -> list[float]:
        # Answers joined to the wrong rows (a dataset column misaligned): each completion is checked
        # against another prompt's answer. TRL passes a batch's completions grouped by prompt, so
        # half a batch on (4 of 8: one prompt's group) is always another prompt.
        half = len(answer) // 2
        rotated = list(answer[half:]) + list(answer[:half])
        return accuracy_reward(prompts, completions, task, rotated, **kw)

    setup.reward_funcs = [shuffled, format_reward]
    return 0


def _warmup_never_ends(setup: Setup) -> int:
    # Warm-up given in samples where steps were meant: 100x the run, so the LR climbs from 0 to
    # 1% of its value and the policy barely moves (the LR is logged at every step).
    setup.config["warmup_steps"] = 100 * setup.steps
    return 0


def _healthy_grpo_loss(setup: Setup) -> None:
    setup.config["loss_type"] = "grpo"  # the original GRPO loss: per-sequence length normalisation


def _healthy_lr_half(setup: Setup) -> None:
    setup.config["learning_rate"] *= 0.5


def _router_downcast_from(share: float) -> Callable[[Setup], int]:
    """The routers round-tripped through bf16 before every step from step round(share x steps)."""
    return lambda setup: _router_downcast(setup, _at(setup, share))


def _router_downcast(setup: Setup, at: int) -> int:
    from transformers import TrainerCallback

    class Downcast(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            # The routers round-tripped through bf16 before every step from ``at`` (a transfer that
            # down-casts them): each update smaller than bf16's resolution is lost.
            if state.global_step + 1 >= at:
                import torch

                with torch.no_grad():
                    for w in router_gates(model):
                        w.copy_(w.to(torch.bfloat16).to(w.dtype))

    setup.callbacks.append(Downcast())
    return at


_router_downcast_mid = _router_downcast_from(0.5)


#: Characters of a completion the windowed checker reads (completions run 20-70 characters here).
REWARD_WINDOW = 32


def _reward_window(setup: Setup) -> int:
    @functools.wraps(accuracy_reward)
    def windowed(prompts, completions, task, answer, **kw) -> list[float]:
        # A reward that reads only the first characters of each completion (a truncation window):
        # an answer after a longer reasoning is never seen, so it scores 0.
        return accuracy_reward(prompts, [c[:REWARD_WINDOW] for c in completions], task, answer, **kw)

    setup.reward_funcs = [windowed, format_reward]
    return 0


def _skip_every(n: int) -> Callable[[Setup], int]:
    """The update of every ``n``-th optimizer step dropped from the first, after the norm was logged
    (every second: an accumulation counter off by one; every third: a wrapper that steps two
    accumulation windows of three)."""

    def apply(setup: Setup) -> int:
        setup.callbacks.append(update_dropped_callback(lambda step: step % n == 0))
        return 0

    return apply


_skip_every_other, _skip_every_third = _skip_every(2), _skip_every(3)


def _healthy_lr_double(setup: Setup) -> None:
    setup.config["learning_rate"] *= 2.0  # twice the healthy run's LR: still a small RL LR


def _healthy_clip_narrow(setup: Setup) -> None:
    setup.config["epsilon"] = 0.1  # a narrower trust region than TRL's default 0.2


def _trainer_beta_from(share: float, beta: Callable[[float], float]) -> Callable[[Setup], int]:
    """The trainer's ``beta`` set to ``beta(its value)`` at step round(share x steps) (a resumed run
    whose override changes the coefficient): TRL reads ``trainer.beta`` at every step, and loaded
    the reference model because beta was not 0 when it was built."""

    def apply(setup: Setup) -> int:
        trainer: dict[str, Any] = {}
        setup.on_trainer.append(lambda t: trainer.update(it=t))
        at = _at(setup, share)
        setup.callbacks.append(step_flag_callback(at, lambda: setattr(trainer["it"], "beta",
                                                                      beta(trainer["it"].beta))))
        return at

    return apply


#: Share of the answer key that is wrong in the label-noise run (one in ten prompts per unit).
LABEL_NOISE_TENTHS = 3


def noisy_label(prompt: str) -> bool:
    """Whether ``prompt``'s answer key is one of the wrong ones: fixed per prompt (CRC-32, not
    Python's salted ``hash``), so a prompt seen twice is wrong both times, as in a noisy data set."""
    return zlib.crc32(prompt.encode()) % 10 < LABEL_NOISE_TENTHS


def _reward_label_noise(setup: Setup) -> int:
    @functools.wraps(accuracy_reward)
    def noisy(prompts, completions, **kw) -> list[float]:
        # Label noise: for 30% of the prompts the answer key is wrong, so a right answer scores
        # 0 and a wrong one 1 there.
        right = accuracy_reward(prompts, completions, **kw)
        return [1.0 - r if noisy_label(p) else r for p, r in zip(prompts, right, strict=True)]

    setup.reward_funcs = [noisy, format_reward]
    return 0


def _reward_length(setup: Setup) -> int:
    from moeproxy.reproduction.formats import get_format

    cap = get_format("reasoning").max_new_tokens

    @functools.wraps(accuracy_reward)
    def by_length(prompts, completions, **kw) -> list[float]:
        # A checker that pays for length instead of correctness (a reward model's length bias):
        # the character tokenizer makes a character a token, so 1.0 at the length limit.
        return [min(len(c), cap) / cap for c in completions]

    setup.reward_funcs = [by_length, format_reward]
    return 0


# --- batch 13: faults through TRL's own surface that no earlier batch tried -------------------------

def _healthy_grad_accum(setup: Setup) -> None:
    # Two micro-batches an optimizer step (the usual memory setting): the same 2 prompts x 4
    # completions a step, half of them a forward (TRL shuffles the completions between the two).
    setup.config.update(per_device_train_batch_size=4, gradient_accumulation_steps=2)


def _healthy_bnpo(setup: Setup) -> None:
    setup.config["loss_type"] = "bnpo"  # normalised by the tokens of the local batch


def _healthy_warmup_constant(setup: Setup) -> None:
    setup.config.update(lr_scheduler_type="constant_with_warmup", warmup_steps=0.1)


def _none(scores: list[float]) -> list[None]:
    # A judge timing out behind a wrapper that returns None, which TRL reads as "this reward does not
    # apply to the sample": TRL leaves it out of the sum, and the format reward alone trains.
    return [None for _s in scores]


def _reference_synced_every_step(setup: Setup) -> int:
    # The reference model replaced by the policy after every step (TRL's sync_ref_model with
    # ref_model_mixup_alpha 1.0 every step): when the next step computes the KL, the reference holds
    # the policy's own weights, so the term is 0 and holds the policy near nothing.
    setup.config.update(sync_ref_model=True, ref_model_mixup_alpha=1.0, ref_model_sync_steps=1)
    return 0


def _optimizer_over_a_copy(setup: Setup) -> int:
    import copy

    import torch

    # An optimizer built over a copy of the model (made before the model was reloaded or wrapped):
    # backward fills the model's gradients, the gradient norm is the model's, and the optimizer
    # steps the copy, whose parameters have no gradient, so AdamW skips every one of them.
    elsewhere = copy.deepcopy(setup.model)
    setup.optimizers = (torch.optim.AdamW(elsewhere.parameters(), lr=setup.config["learning_rate"]), None)
    return 0


# --- batch 14: more of TRL's own surface -----------------------------------------------------------

def _healthy_grad_clip_tight(setup: Setup) -> None:
    setup.config["max_grad_norm"] = 0.1  # a tenth of transformers' default: clipping on most steps


def _reward_weight_flipped(setup: Setup) -> int:
    # A sign typo in GRPOConfig.reward_weights: the accuracy reward counts against the completion.
    # TRL logs each function's reward unweighted and the weighted sum as ``reward``.
    setup.config["reward_weights"] = [-1.0, 1.0]
    return 0


def _beta_times(factor: float) -> Callable[[Setup], int]:
    def apply(setup: Setup) -> int:
        setup.config["beta"] *= factor
        return 0

    return apply


def _lr_x10_cosine(setup: Setup) -> int:
    _healthy_cosine(setup)
    return _lr_times(10)(setup)


# --- batch 15: the probe beside faults of other kinds -----------------------------------------------

def _healthy_routers_frozen(setup: Setup) -> None:
    # Routers kept as they are (a common stabiliser of MoE fine-tuning): only the rest trains.
    for w in router_gates(setup.model):
        w.requires_grad_(False)


def _healthy_weight_decay(setup: Setup) -> None:
    setup.config["weight_decay"] = 0.1


def _negated(scores: list[float]) -> list[float]:
    return [-r for r in scores]  # a sign error that a code change brings in: a right answer costs


# --- batch 16: more settings and reward bugs -------------------------------------------------------

def _healthy_top_k(setup: Setup) -> None:
    setup.config["top_k"] = 20


def _healthy_temperature_low(setup: Setup) -> None:
    setup.config["temperature"] = 0.7


def _reward_of_the_previous_call(setup: Setup) -> int:
    last: dict[str, list[float]] = {}

    @functools.wraps(accuracy_reward)
    def one_call_behind(prompts, completions, **kw) -> list[float]:
        # A stateful checker that hands back the scores it computed for the previous batch (a
        # cached or queued result read one call late): each completion gets another one's reward.
        now = accuracy_reward(prompts, completions, **kw)
        before = last.get("scores", [0.0] * len(now))
        last["scores"] = now
        return before if len(before) == len(now) else [0.0] * len(now)

    setup.reward_funcs = [one_call_behind, format_reward]
    return 0


#: Batch 11's wider steps: 4 prompts x 8 completions (the earlier batches: 2 x 4), so that a healthy
#: run's learning shows (120 steps of a healthy run: accuracy 0.47 -> 0.57, a reward slope of 3.2
#: standard errors, against 1.7-2.2 at 2 x 4).
WIDE = {"per_device_train_batch_size": 32, "num_generations": 8}


def _wide(apply: Callable[[Setup], int | None]) -> Callable[[Setup], int | None]:
    """``apply`` on batch 11's wider steps (:data:`WIDE`)."""

    def wide(setup: Setup) -> int | None:
        setup.config.update(WIDE)
        return apply(setup)

    return wide


@dataclass(frozen=True)
class RunKind:
    label: str  # the fault class (SPEC §3)
    what: str
    apply: Callable[[Setup], int | None]  # edits the setup, returns the onset step


RUNS: dict[str, RunKind] = {
    "healthy": RunKind("healthy", "nothing injected", _healthy),
    "healthy_warmup": RunKind("healthy", "nothing injected; cosine LR after a 10% warm-up, seed + 1",
                              _healthy_warmup),
    "lr_x100": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x100", _lr_times(100)),
    "reward_zero": RunKind("reward_fault", "accuracy_reward returns 0.0 for every completion", _reward_zero),
    "negative_beta": RunKind("kl_misconfiguration", "GRPOConfig.beta with its sign flipped", _negative_beta),
    "frozen": RunKind("actor_update_omission", "all parameters requires_grad=False, inputs require grad",
                             _frozen_params),
    "nan_grad": RunKind("gradient_overflow", f"NaN output-layer gradient at step round({NAN_AT} x steps)",
                        _nan_grad_at(NAN_AT)),
    # Batch 2: new variants of the same classes through TRL's surface, each on a seed of its own,
    # frozen before their first scoring (docs/benchmarks.md says what changed after it).
    "healthy_seed": RunKind("healthy", "nothing injected (batch 2's own seed)", _healthy),
    "healthy_beta0": RunKind("healthy", "nothing injected; GRPOConfig.beta 0.0, TRL's default: no KL logged",
                             _healthy_beta0),
    "healthy_constant": RunKind("healthy", "nothing injected; constant LR", _healthy_constant),
    "lr_x10": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x10", _lr_times(10)),
    "lr_x1000": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x1000", _lr_times(1000)),
    "lr_zero": RunKind("actor_update_omission", "GRPOConfig.learning_rate 0", _lr_zero),
    "reward_constant": RunKind("reward_fault", "both reward functions return 1.0 for every completion",
                               _reward_constant),
    "reward_noise": RunKind("reward_fault", "accuracy_reward replaced by a coin flip", _reward_noise),
    "nan_grad_early": RunKind("gradient_overflow", "NaN output-layer gradient at step round(0.25 x steps)",
                              _nan_grad_at(0.25)),
    "negative_beta_large": RunKind("kl_misconfiguration", "GRPOConfig.beta -0.1", _negative_beta_large),
    # Batch 3: frozen after this release's rules, before their first scoring.
    "healthy_cosine": RunKind("healthy", "nothing injected; cosine LR after a 10% warm-up", _healthy_cosine),
    "healthy_beta0_seed": RunKind("healthy", "nothing injected; GRPOConfig.beta 0.0 (batch 3's seed)",
                                  _healthy_beta0),
    "lr_x300_warmup": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x300 behind a warm-up and cosine",
                              _lr_x300_warmup),
    "lr_x1000_beta0": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x1000 with beta 0 (no KL logged)",
                              _lr_x1000_beta0),
    "format_zero": RunKind("reward_fault", "format_reward returns 0.0 for every completion", _format_zero),
    "nan_grad_late": RunKind("gradient_overflow", "NaN output-layer gradient at step round(0.9 x steps)",
                             _nan_grad_at(0.9)),
    # Batch 4: frozen after the rules written on batch 3, before its own first scoring; faults that
    # start halfway as well as from step 0, and healthy runs under TRL's other loss settings.
    "healthy_dr_grpo": RunKind("healthy", "nothing injected; GRPOConfig.loss_type dr_grpo", _healthy_dr_grpo),
    "healthy_two_iterations": RunKind("healthy", "nothing injected; GRPOConfig.num_iterations 2",
                                      _healthy_two_iterations),
    "frozen_late": RunKind("actor_update_omission", "every parameter frozen at step round(0.5 x steps)",
                           _frozen_late),
    "reward_zero_late": RunKind("reward_fault", "accuracy_reward returns 0.0 from step round(0.5 x steps)",
                                _accuracy_broken_from(0.5, _zero)),
    "inf_grad_mid": RunKind("gradient_overflow", "+inf output-layer gradient at step round(0.5 x steps)",
                            _nan_grad_at(0.5, float("inf"))),
    "lr_x30": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x30", _lr_times(30)),
    # Batch 5: frozen after the rules written on batch 4, before its own first scoring.
    "healthy_beta_high": RunKind("healthy", "nothing injected; GRPOConfig.beta 0.1", _healthy_beta_high),
    "healthy_scale_batch": RunKind("healthy", "nothing injected; GRPOConfig.scale_rewards 'batch'",
                                   _healthy_scale_batch),
    "reward_sign_flip": RunKind("reward_fault", "accuracy_reward with its sign flipped", _reward_sign_flip),
    "lr_x100_late": RunKind("lr_misconfiguration", "the LR schedule x100 from step round(0.5 x steps)",
                            _lr_times_late(100, 0.5)),
    "negative_beta_small": RunKind("kl_misconfiguration", "GRPOConfig.beta -0.01", _negative_beta_small),
    "update_dropped_late": RunKind("actor_update_omission",
                                   "gradients cleared after the logged norm, before every optimizer step from "
                                   "step round(0.5 x steps)", _update_dropped_late),
    # Batch 6: frozen after batch 5 (no rule was written on it), before its own first scoring; the
    # first router faults of the real runs, through the policy's own MoE routers.
    "healthy_temperature": RunKind("healthy", "nothing injected; GRPOConfig.temperature 0.7", _healthy_temperature),
    "healthy_clip_higher": RunKind("healthy", "nothing injected; GRPOConfig.epsilon_high 0.28 (DAPO)",
                                   _healthy_clip_higher),
    "router_noise_mid": RunKind("router_corruption", "Gaussian noise at each router's own scale added to every "
                                "mlp.gate.weight at step round(0.5 x steps)", _router_noise(0.5, 1.0)),
    "router_reinit_quarter": RunKind("router_corruption", "a quarter of every router's rows re-initialised at "
                                     "step round(0.25 x steps)", _router_reinit(4, 0.25)),
    "reward_shuffled": RunKind("reward_fault", "accuracy_reward checks each completion against another prompt's "
                               "answer", _reward_shuffled),
    "warmup_never_ends": RunKind("actor_update_omission", "GRPOConfig.warmup_steps 100 x steps: the LR stays "
                                 "under 1% of its value", _warmup_never_ends),
    # Batch 7: frozen after the rules written on batch 6, before its own first scoring.
    "healthy_grpo_loss": RunKind("healthy", "nothing injected; GRPOConfig.loss_type grpo", _healthy_grpo_loss),
    "healthy_lr_half": RunKind("healthy", "nothing injected; GRPOConfig.learning_rate x0.5", _healthy_lr_half),
    "router_noise_late": RunKind("router_corruption", "Gaussian noise at 3x each router's own scale added to every "
                                 "mlp.gate.weight at step round(0.75 x steps)", _router_noise(0.75, 3.0)),
    "router_downcast_mid": RunKind("router_corruption", "every mlp.gate.weight round-tripped through bf16 before "
                                   "each step from step round(0.5 x steps)", _router_downcast_mid),
    "reward_window": RunKind("reward_fault", f"accuracy_reward reads the first {REWARD_WINDOW} characters of each "
                             "completion only", _reward_window),
    "skip_every_other": RunKind("actor_update_omission", "every second optimizer update dropped from the first, "
                                "after the gradient norm was logged", _skip_every_other),
    # Batch 8: frozen after the load-balancing rule written on batches 6 and 7, before its own first
    # scoring; router faults of new kinds, onsets and scales, and healthy runs that move the balance.
    "healthy_aux_coef_high": RunKind("healthy", "nothing injected; GRPOConfig.router_aux_loss_coef 0.1 (the "
                                     "model's own 0.01 x10)", _healthy_aux_coef_high),
    "healthy_beta_low": RunKind("healthy", "nothing injected; GRPOConfig.beta 0.01", _healthy_beta_low),
    "router_noise_early": RunKind("router_corruption", "Gaussian noise at 2x each router's own scale added to "
                                  "every mlp.gate.weight at step round(0.25 x steps)", _router_noise(0.25, 2.0)),
    "router_noise_start": RunKind("router_corruption", "Gaussian noise at each router's own scale added to every "
                                  "mlp.gate.weight before the first update", _router_noise(None, 1.0)),
    "router_reinit_half_late": RunKind("router_corruption", "half of every router's rows re-initialised at step "
                                       "round(0.6 x steps)", _router_reinit(2, 0.6)),
    "router_rows_scaled_mid": RunKind("router_corruption", "an eighth of every router's rows x4 at step "
                                      "round(0.5 x steps)", _router_rows(8, 0.5, _scale_rows)),
    # Batch 9: frozen after batch 8 (no rule was written on it), before its own first scoring; milder
    # router faults than before and an LR raised mid-run (which moves the routers through the optimizer).
    "healthy_temperature_high": RunKind("healthy", "nothing injected; GRPOConfig.temperature 1.2",
                                        _healthy_temperature_high),
    "healthy_top_p": RunKind("healthy", "nothing injected; GRPOConfig.top_p 0.9", _healthy_top_p),
    "router_noise_mild_late": RunKind("router_corruption", "Gaussian noise at half each router's own scale added "
                                      "to every mlp.gate.weight at step round(0.75 x steps)",
                                      _router_noise(0.75, 0.5)),
    "router_noise_mild_early": RunKind("router_corruption", "Gaussian noise at half each router's own scale added "
                                       "to every mlp.gate.weight at step round(0.25 x steps)",
                                       _router_noise(0.25, 0.5)),
    "router_reinit_eighth_mid": RunKind("router_corruption", "an eighth of every router's rows re-initialised at "
                                        "step round(0.5 x steps)", _router_reinit(8, 0.5)),
    "lr_x10_late": RunKind("lr_misconfiguration", "the LR schedule x10 from step round(0.5 x steps)",
                           _lr_times_late(10, 0.5)),
    # batch 10
    "healthy_lr_double": RunKind("healthy", "nothing injected; GRPOConfig.learning_rate x2", _healthy_lr_double),
    "healthy_clip_narrow": RunKind("healthy", "nothing injected; GRPOConfig.epsilon 0.1", _healthy_clip_narrow),
    "negative_beta_late": RunKind("kl_misconfiguration", "the trainer's beta negated at step round(0.5 x steps)",
                                  # the KL term's sign flipped: the loss pays the policy for leaving its reference
                                  _trainer_beta_from(0.5, lambda b: -abs(b))),
    "reward_label_noise": RunKind("reward_fault", f"accuracy_reward inverted on the {LABEL_NOISE_TENTHS}0% of prompts "
                                  "whose answer key is wrong (fixed per prompt)", _reward_label_noise),
    "reward_length": RunKind("reward_fault", "accuracy_reward replaced by the completion's length over the limit",
                             _reward_length),
    "nan_router_grad": RunKind("gradient_overflow", "NaN gradient in every MoE router at step round(0.4 x steps)",
                               _nan_grad_at(0.4, weights=router_gates)),
    # batch 12: the first runs sent with the callback's weight probe
    "probe_healthy": RunKind("healthy", "nothing injected; the callback's weight probe on", _healthy),
    "probe_healthy_cosine": RunKind("healthy", "nothing injected; cosine LR after a 10% warm-up (LR 0 at step 1)",
                                    _healthy_cosine),
    "update_dropped_quarter": RunKind("actor_update_omission", "every optimizer update dropped from step "
                                      "round(0.25 x steps) after the norm was logged", _updates_dropped_from(0.25)),
    "skip_every_third": RunKind("actor_update_omission", "every third optimizer update dropped from the first, after "
                                "the norm was logged", _skip_every_third),
    "router_downcast_late": RunKind("router_corruption", "every mlp.gate.weight round-tripped through bf16 before "
                                    "each step from step round(0.75 x steps)", _router_downcast_from(0.75)),
    "nan_grad_third": RunKind("gradient_overflow", "NaN output-layer gradient at step round(steps / 3)",
                              _nan_grad_at(1 / 3)),
    # batch 11: faults that take the learning away, on steps wide enough for a healthy run to learn
    "wide_healthy": RunKind("healthy", "nothing injected; 4 prompts x 8 completions a step", _wide(_healthy)),
    "wide_healthy_cosine": RunKind("healthy", "nothing injected; 4 x 8 a step, cosine LR after a 10% warm-up",
                                   _wide(_healthy_cosine)),
    "wide_reward_noise": RunKind("reward_fault", "accuracy_reward replaced by a coin flip; 4 x 8 a step",
                                 _wide(_reward_noise)),
    "wide_reward_sign_flip": RunKind("reward_fault", "accuracy_reward with its sign flipped; 4 x 8 a step",
                                     _wide(_reward_sign_flip)),
    "wide_reward_label_noise": RunKind("reward_fault", "accuracy_reward inverted on the 30% of prompts whose answer "
                                       "key is wrong; 4 x 8 a step", _wide(_reward_label_noise)),
    "wide_update_dropped_late": RunKind("actor_update_omission", "every optimizer update dropped from step "
                                        "round(0.5 x steps) after the norm was logged; 4 x 8 a step",
                                        _wide(_update_dropped_late)),
    # batch 13: faults through TRL's own surface that no earlier batch tried
    "healthy_grad_accum": RunKind("healthy", "nothing injected; gradient_accumulation_steps 2: 2 micro-batches of 4 "
                                  "completions an optimizer step, 2 prompts x 4 completions in all", _healthy_grad_accum),
    "healthy_warmup_constant": RunKind("healthy", "nothing injected; constant LR after a 10% warm-up",
                                       _healthy_warmup_constant),
    "healthy_bnpo": RunKind("healthy", "nothing injected; loss_type bnpo", _healthy_bnpo),
    "reward_none_late": RunKind("reward_fault", "accuracy_reward returns None for every completion from step "
                                "round(0.5 x steps)", _accuracy_broken_from(0.5, _none)),
    "reference_synced_every_step": RunKind("kl_misconfiguration", "sync_ref_model with ref_model_mixup_alpha 1.0 "
                                           "and ref_model_sync_steps 1: the reference is the policy of the step "
                                           "before", _reference_synced_every_step),
    "optimizer_over_a_copy": RunKind("actor_update_omission", "GRPOTrainer(optimizers=...) given an AdamW built "
                                     "over a deep copy of the model", _optimizer_over_a_copy),
    # batch 14: more of TRL's own surface
    "healthy_again": RunKind("healthy", "nothing injected (batch 14's own seed)", _healthy),
    "healthy_grad_clip_tight": RunKind("healthy", "nothing injected; max_grad_norm 0.1", _healthy_grad_clip_tight),
    "reward_weight_flipped": RunKind("reward_fault", "GRPOConfig.reward_weights [-1, 1]: the accuracy reward "
                                     "weighted -1", _reward_weight_flipped),
    "beta_x250": RunKind("kl_misconfiguration", "GRPOConfig.beta x250 (10.0)", _beta_times(250)),
    "kl_off_late": RunKind("kl_misconfiguration", "the trainer's beta set to 0 at step round(0.5 x steps)",
                           # TRL stops computing and logging the KL
                           _trainer_beta_from(0.5, lambda _b: 0.0)),
    "lr_x10_cosine": RunKind("lr_misconfiguration", "GRPOConfig.learning_rate x10, cosine LR after a 10% warm-up",
                             _lr_x10_cosine),
    # batch 15: the probe beside faults of other kinds (batch 9's two router faults again, now probed)
    "healthy_routers_frozen": RunKind("healthy", "nothing injected; every mlp.gate.weight requires_grad=False",
                                      _healthy_routers_frozen),
    "healthy_weight_decay": RunKind("healthy", "nothing injected; weight_decay 0.1", _healthy_weight_decay),
    "reward_sign_flip_late": RunKind("reward_fault", "accuracy_reward with its sign flipped from step "
                                     "round(0.5 x steps)", _accuracy_broken_from(0.5, _negated)),
    "lr_x30_late": RunKind("lr_misconfiguration", "the LR schedule x30 from step round(0.5 x steps)",
                           _lr_times_late(30, 0.5)),
    # batch 16: more settings and reward bugs
    "healthy_top_k": RunKind("healthy", "nothing injected; top_k 20", _healthy_top_k),
    "healthy_temperature_low": RunKind("healthy", "nothing injected; temperature 0.7", _healthy_temperature_low),
    "lr_zero_late": RunKind("actor_update_omission", "the LR schedule x0 from step round(0.5 x steps): a run "
                            "resumed with a scheduler already at its end", _lr_times_late(0.0, 0.5)),
    "reward_previous_call": RunKind("reward_fault", "accuracy_reward returns the scores of its previous call",
                                    _reward_of_the_previous_call),
    "lr_x1000_late": RunKind("lr_misconfiguration", "the LR schedule x1000 from step round(0.5 x steps)",
                             _lr_times_late(1000, 0.5)),
    "nan_router_grad_late": RunKind("gradient_overflow", "NaN gradient in every MoE router at step "
                                    "round(0.75 x steps)", _nan_grad_at(0.75, weights=router_gates)),
}

#: The runs of batches 2 on, each in ``benchmarks/results/trl_runs_<n>``, each run on a seed of its
#: own (so no fault run is the twin of a healthy one): 20 x (n - 1), one more a run in the order listed.
LATER_BATCHES: dict[int, tuple[str, ...]] = {
    2: ("healthy_seed", "healthy_beta0", "healthy_constant", "lr_x10", "lr_x1000", "lr_zero", "reward_constant",
        "reward_noise", "nan_grad_early", "negative_beta_large"),
    3: ("healthy_cosine", "healthy_beta0_seed", "lr_x300_warmup", "lr_x1000_beta0", "format_zero", "nan_grad_late"),
    4: ("healthy_dr_grpo", "healthy_two_iterations", "frozen_late", "reward_zero_late", "inf_grad_mid", "lr_x30"),
    5: ("healthy_beta_high", "healthy_scale_batch", "reward_sign_flip", "lr_x100_late", "negative_beta_small",
        "update_dropped_late"),
    6: ("healthy_temperature", "healthy_clip_higher", "router_noise_mid", "router_reinit_quarter", "reward_shuffled",
        "warmup_never_ends"),
    7: ("healthy_grpo_loss", "healthy_lr_half", "router_noise_late", "router_downcast_mid", "reward_window",
        "skip_every_other"),
    8: ("healthy_aux_coef_high", "healthy_beta_low", "router_noise_early", "router_noise_start",
        "router_reinit_half_late", "router_rows_scaled_mid"),
    9: ("healthy_temperature_high", "healthy_top_p", "router_noise_mild_late", "router_noise_mild_early",
        "router_reinit_eighth_mid", "lr_x10_late"),
    10: ("healthy_lr_double", "healthy_clip_narrow", "negative_beta_late", "reward_label_noise", "reward_length",
         "nan_router_grad"),
    11: ("wide_healthy", "wide_healthy_cosine", "wide_reward_noise", "wide_reward_sign_flip", "wide_reward_label_noise",
         "wide_update_dropped_late"),
    12: ("probe_healthy", "probe_healthy_cosine", "update_dropped_quarter", "skip_every_third", "router_downcast_late",
         "nan_grad_third"),
    13: ("healthy_grad_accum", "healthy_warmup_constant", "healthy_bnpo", "reward_none_late",
         "reference_synced_every_step", "optimizer_over_a_copy"),
    14: ("healthy_again", "healthy_grad_clip_tight", "reward_weight_flipped", "beta_x250", "kl_off_late",
         "lr_x10_cosine"),
    15: ("healthy_routers_frozen", "healthy_weight_decay", "reward_sign_flip_late", "lr_x30_late",
         "router_noise_mild_late", "router_reinit_eighth_mid"),
    16: ("healthy_top_k", "healthy_temperature_low", "lr_zero_late", "reward_previous_call", "lr_x1000_late",
         "nan_router_grad_late"),
}
#: Kinds a later batch runs again on purpose, by batch: every other run of a batch is new. Batch 15
#: runs batch 9's two router faults, which batch 9 read ``healthy``, again with the weight probe.
REPEATED: dict[int, tuple[str, ...]] = {15: ("router_noise_mild_late", "router_reinit_eighth_mid")}
#: batch -> (its runs, where they go, the first run's seed, whether each run has a seed of its own).
BATCHES: dict[str, tuple[tuple[str, ...], Path, int, bool]] = {
    "1": (("healthy", "healthy_warmup", "lr_x100", "reward_zero", "negative_beta", "frozen", "nan_grad"),
          RESULTS, 0, False),
    **{str(n): (keys, RESULTS.parent / f"trl_runs_{n}", 20 * (n - 1), True) for n, keys in LATER_BATCHES.items()},
}


# --- the server ----------------------------------------------------------------------------------------

class LocalServer:
    """``moeproxy serve`` over a migrated SQLite file in ``workdir``, with a token of its own."""

    def __init__(self, workdir: Path):
        from moeproxy.service.db import Database
        from moeproxy.service.tokens import repository

        from moeproxy import migrations

        database_url = f"sqlite:///{workdir / 'service.db'}"
        migrations.upgrade(database_url)
        database = Database(database_url)
        try:
            with database.scope() as session:
                self.token = repository.create_token(session, "trl-runs")[1]
        finally:
            database.dispose()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from moeproxy.cli import main; main()", "serve", "--port", str(port),
             "--database-url", database_url, "--no-upgrade", "--log-level", "warning"],
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("moeproxy serve did not become ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class Api:
    def __init__(self, url: str, token: str):
        self.http = httpx.Client(base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def run_id(self, name: str) -> int | None:
        offset = 0
        while True:
            page = self.http.get("/api/v1/runs", params={"limit": 200, "offset": offset}).raise_for_status().json()
            for run in page["runs"]:
                if run["name"] == name:
                    return run["id"]
            offset += len(page["runs"])
            if not page["runs"] or offset >= page["total"]:
                return None

    def delete(self, run_id: int) -> None:
        self.http.delete(f"/api/v1/runs/{run_id}").raise_for_status()

    def trace(self, run_id: int) -> dict[str, Any]:
        """The run as the service stored it, in the ingest body's form (values as the API writes them)."""
        run = self.http.get(f"/api/v1/runs/{run_id}").raise_for_status().json()
        metrics = self.http.get(f"/api/v1/runs/{run_id}/metrics").raise_for_status().json()["metrics"]
        by_step: dict[int, dict[str, Any]] = {}
        for name, series in sorted(metrics.items()):
            for step, value in zip(series["steps"], series["values"]):
                by_step.setdefault(step, {})[name] = value
        return {"name": run["name"], "framework": run["framework"], "config": run.get("config") or {},
                "steps": [{"step": s, "values": by_step[s]} for s in sorted(by_step)]}


# --- one run -------------------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import torch
    import transformers
    import trl

    return {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
            "accelerate": accelerate.__version__, "datasets": datasets.__version__,
            "python": platform.python_version()}


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "output_dir"}


def run_one(key: str, *, steps: int, seed: int, api: Api, url: str, token: str, workdir: Path,
            model_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train one run; returns its manifest entry (``trace`` included when it reached the server).

    ``model_path`` (default: the reference model) and ``overrides`` (``GRPOConfig`` arguments) let
    the tests run the same harness on a tiny checkpoint."""
    import torch
    from moeproxy.reproduction.reference import reference_model_path
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from moeproxy.integrations import MoeproxyCallback

    kind = RUNS[key]
    hf_logging.disable_progress_bar()
    set_seed(seed)
    path = Path(model_path) if model_path is not None else reference_model_path(REFERENCE)
    # Loaded here in float32 (the checkpoint is saved in bf16); TRL builds the reference model
    # from the same path in the policy's dtype.
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    config = {**base_config(steps, seed, str(workdir / key)), **(overrides or {})}
    setup = Setup(model=model, steps=steps, config=config)
    onset = kind.apply(setup)
    entry: dict[str, Any] = {"label": kind.label, "onset": onset, "framework": FRAMEWORK, "fault": kind.what,
                             "seed": seed, "steps": steps, "config": _jsonable(setup.config),
                             "reward_funcs": [f.__name__ for f in setup.reward_funcs]}
    prompts_per_step = (setup.config["per_device_train_batch_size"] * setup.config.get("gradient_accumulation_steps", 1)
                        // setup.config["num_generations"])
    dataset = prompt_dataset(steps * prompts_per_step, seed)

    run_name = f"trl-{key}-seed{seed}"
    stale = api.run_id(run_name)
    if stale is not None:  # an attempt that did not finish (a finished one left its trace file)
        api.delete(stale)
    callback = MoeproxyCallback(url, token, run_name, model=path.name, tags=["trl-runs"],
                                flush_interval_s=0.5, spill_path=workdir / f"{key}.spill.jsonl")
    try:
        trainer = GRPOTrainer(model=setup.model, reward_funcs=setup.reward_funcs, args=GRPOConfig(**setup.config),
                              train_dataset=dataset, processing_class=tokenizer,
                              callbacks=[callback, *setup.callbacks], optimizers=setup.optimizers)
    except ValueError as exc:  # TRL refuses the setting: that is the finding
        return {**entry, "refused": f"{type(exc).__name__}: {exc}"}
    for hook in setup.on_trainer:
        hook(trainer)

    start = time.perf_counter()
    try:
        trainer.train()
        entry["ended"] = "finished"
    except Exception as exc:  # noqa: BLE001 - a fault may crash TRL (NaN weights -> sampling fails)
        entry["ended"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if callback.client is not None:
            callback.client.close(status="failed")
            callback.client = None
    entry["wall_s"] = round(time.perf_counter() - start, 1)
    run_id = api.run_id(run_name)
    entry["trace"] = api.trace(run_id) if run_id is not None else None
    logged = len(entry["trace"]["steps"]) if entry["trace"] else 0
    entry["steps_logged"] = logged
    entry["s_per_step"] = round(entry["wall_s"] / logged, 2) if logged else None
    return entry


# --- the script ----------------------------------------------------------------------------------------

def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    tmp.replace(path)


def _load_manifest(out: Path) -> dict[str, Any]:
    path = out / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def _save(out: Path, manifest: dict[str, Any]) -> None:
    _write_json(out / "manifest.json", manifest)
    labels = {k: {"label": e["label"], "onset": e["onset"], "framework": e["framework"],
                  "steps": e.get("steps_logged")}
              for k, e in sorted(manifest["runs"].items()) if (out / f"{k}.json").exists()}
    _write_json(out / "labels.json", labels)
    # The freeze benchmarks/evalsets.py checks before it scores (sha256sum format).
    lines = [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}" for f in sorted(out.glob("*.json"))]
    (out / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1", choices=sorted(BATCHES), help="which runs, where, from which seed")
    ap.add_argument("--runs", help=f"comma-separated, of {', '.join(RUNS)} (default: the batch's)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--seed", type=int, help="the first run's seed (default: the batch's)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--out", help="where the traces go (default: the batch's directory)")
    ap.add_argument("--url", help="a running moeproxy server (default: serve one over a temporary SQLite)")
    ap.add_argument("--token", help="a token of that server (`moeproxy token create --project NAME | tail -1`)")
    args = ap.parse_args(argv)
    batch_keys, batch_out, batch_seed, own_seeds = BATCHES[args.batch]
    keys = [k for k in args.runs.split(",") if k] if args.runs else list(batch_keys)
    first_seed = batch_seed if args.seed is None else args.seed
    unknown = [k for k in keys if k not in RUNS]
    if unknown:
        ap.error(f"unknown run(s) {unknown}; known: {', '.join(RUNS)}")
    if bool(args.url) != bool(args.token):
        ap.error("--url and --token go together")

    out = Path(args.out) if args.out else batch_out
    out.mkdir(parents=True, exist_ok=True)
    manifest = _load_manifest(out)
    # Done: its trace is on disk, or TRL refused its setting (a finding, not a failure).
    todo = [k for k in keys if not (out / f"{k}.json").exists() and "refused" not in manifest["runs"].get(k, {})]
    for k in keys:
        if k not in todo:
            print(f"{k}: done before, skipped", flush=True)
    if not todo:
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    manifest.update(versions=versions(), reference_model=REFERENCE, threads=args.threads,
                    server=args.url or "moeproxy serve over a temporary SQLite file")

    with tempfile.TemporaryDirectory(prefix="trl-runs-") as tmp:
        workdir = Path(tmp)
        server = None if args.url else LocalServer(workdir)
        url, token = (args.url, args.token) if args.url else (server.url, server.token)
        api = Api(url, token)
        try:
            for key in todo:
                print(f"{key}: {RUNS[key].what}, {args.steps} steps", flush=True)
                seed = first_seed + (batch_keys.index(key) if own_seeds and key in batch_keys else 0)
                entry = run_one(key, steps=args.steps, seed=seed, api=api, url=url, token=token,
                                workdir=workdir)
                trace = entry.pop("trace", None)
                entry["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
                if trace is not None:
                    _write_json(out / f"{key}.json", trace)
                manifest["runs"][key] = entry
                _save(out, manifest)
                print(f"{key}: {entry.get('refused') or entry['ended']}; {entry.get('steps_logged')} steps logged, "
                      f"{entry.get('wall_s')} s ({entry.get('s_per_step')} s/step)", flush=True)
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
