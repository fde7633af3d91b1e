"""Reference MoE models: their shapes, their training recipe and the shipped checkpoints.

No model can be downloaded where this project is built and tested, so it trains
its own small reference models on the synthetic task suite
(:mod:`moeproxy.reproduction.tasks`), shaped like the real ones as far as one
CPU thread allows (issue 5): 64 routed experts, top-4, 8 layers.

- ``qwen3_moe``: Qwen3-MoE (softmax top-k router, ``norm_topk_prob``), trained
  with the Switch-style load-balancing loss that Qwen3-MoE uses
  (``router_aux_loss_coef``), computed per layer over non-padding tokens.
- ``deepseek_v3``: DeepSeek-V3 (MLA attention, sigmoid router with
  ``e_score_correction_bias``, group-limited routing ``n_group``/``topk_group``,
  one shared expert, a dense first layer via ``first_k_dense_replace``), balanced
  the DeepSeek-V3 way: the auxiliary-loss-free bias update (the correction bias
  moves by ``bias_update_speed`` against each expert's load after every step)
  plus a small complementary balance loss.  transformers' DeepseekV3ForCausalLM
  has no aux loss of its own, so both are computed here from the router logits.

Loss: next-token cross-entropy on the answer tokens and the end marker (the
prompt is random by construction, so predicting it teaches nothing).

Imports torch/transformers inside the functions that need them.  Never imports
``moeproxy.signatures`` or ``moeproxy.service``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder.architectures import architecture_named
from moeproxy.reproduction.formats import CONFIG_KEY, DEFAULT_FORMAT, FORMATS, ResponseFormat, get_format
from moeproxy.reproduction.tasks import TASKS, Example, format_prompt, iter_train
from moeproxy.reproduction.tokenizer import VOCAB_SIZE

MODELS_DIR = Path(__file__).resolve().parent / "models"


class UnknownReferenceModel(KeyError):
    """A reference model or architecture name that is not registered."""


class CheckpointMissing(FileNotFoundError):
    """A registered reference model whose checkpoint is not in the repository."""


@dataclass(frozen=True)
class TrainingRecipe:
    steps: int = 6000
    batch_size: int = 64
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    aux_loss_coef: float = 0.01  # Switch-style balance loss (Qwen3) / complementary loss (DeepSeek)
    bias_update_speed: float = 0.0  # DeepSeek-V3 auxiliary-loss-free balancing; 0 = off
    seed: int = 0
    save_dtype: str = "bfloat16"
    task_format: str = DEFAULT_FORMAT  # what the model learns to write (reproduction.formats)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be >= 1")
        if self.task_format not in FORMATS:
            raise ValueError(f"task_format must be one of {sorted(FORMATS)}")
        if not 0 < self.lr < 1:
            raise ValueError("lr must be in (0, 1)")
        if self.save_dtype not in ("bfloat16", "float32"):
            raise ValueError("save_dtype must be bfloat16 or float32")


# --- architectures ------------------------------------------------------------------------------------

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "num_experts_per_tok": 4,
    "norm_topk_prob": True,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        **_COMMON,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 256,  # unused: every layer is sparse (mlp_only_layers = [])
        "moe_intermediate_size": 32,
        "num_experts": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.01,
    },
    "deepseek_v3": {
        **_COMMON,
        "num_key_value_heads": 4,
        "intermediate_size": 256,  # the dense first layer
        "moe_intermediate_size": 32,
        "n_routed_experts": 64,
        "n_shared_experts": 1,
        "n_group": 8,
        "topk_group": 4,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "head_dim": 8,  # rope part, as DeepseekV3Config sets it
        "rope_interleave": True,
    },
}


def _config_class(arch: str):
    """The transformers config class the architecture entry names."""
    import transformers

    return getattr(transformers, architecture_named(arch).config_class)


def build_config(arch: str, **overrides: Any):
    if arch not in ARCH_CONFIGS:
        raise UnknownReferenceModel(f"unknown architecture {arch!r}; known: {sorted(ARCH_CONFIGS)}")
    return _config_class(arch)(**{**ARCH_CONFIGS[arch], **overrides})


def build_model(arch: str, seed: int = 0, **overrides: Any):
    """A freshly initialised causal LM of ``arch`` (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(build_config(arch, **overrides), dtype=torch.float32)


# --- shipped models -----------------------------------------------------------------------------------

#: What a reference checkpoint is for (``moeproxy reference list --json``): ``rl`` = an RL starting
#: point whose healthy GRPO run still learns; ``fidelity`` = a well-trained model for proxy fidelity.
USES = ("rl", "fidelity")


@dataclass(frozen=True)
class ReferenceModel:
    name: str
    arch: str
    recipe: TrainingRecipe
    config_overrides: dict[str, Any] = field(default_factory=dict)
    use: tuple[str, ...] = ("fidelity",)
    #: Engine settings (``EngineConfig`` fields) a GRPO run from this checkpoint starts from when it is
    #: named by ``--model NAME``: the measured setting under which its healthy run learns.
    rl_engine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.use or set(self.use) - set(USES):
            raise ValueError(f"use must be a non-empty subset of {USES}")
        if self.rl_engine and "rl" not in self.use:
            raise ValueError(f"{self.name}: rl_engine is for RL starting points (use includes 'rl')")

    @property
    def seed(self) -> int:
        return self.recipe.seed

    @property
    def path(self) -> Path:
        return MODELS_DIR / self.name

    def config(self) -> dict[str, Any]:
        return {**ARCH_CONFIGS[self.arch], **self.config_overrides}

    @property
    def task_format(self) -> ResponseFormat:
        return get_format(self.recipe.task_format)


#: Room for the reasoning format: 19 prompt positions + 72 new tokens fit in 128.
_REASONING_OVERRIDES: dict[str, Any] = {"max_position_embeddings": 128}


REFERENCE_MODELS: dict[str, ReferenceModel] = {
    m.name: m
    for m in (
        ReferenceModel("qwen3-moe-64e", "qwen3_moe",
                       TrainingRecipe(steps=8000, lr=4e-3, warmup_steps=200, aux_loss_coef=0.02, seed=0)),
        ReferenceModel(
            "deepseek-v3-64e", "deepseek_v3",
            TrainingRecipe(steps=8000, lr=4e-3, warmup_steps=200, seed=0, aux_loss_coef=0.001,
                           bias_update_speed=1e-3),
        ),
        # RL starting points (issue 14): the reasoning format, trained only until moderate accuracy
        # so that a healthy GRPO run still has something to learn.
        ReferenceModel("qwen3-moe-64e-rl", "qwen3_moe",
                       # 501 steps: held-out accuracy 0.36 (format 1.00), picked from snapshots of
                       # `reference train --snapshot-every 250` (0.13 at 251, 0.45 at 751)
                       TrainingRecipe(steps=501, lr=3e-3, warmup_steps=100, min_lr_ratio=1.0,
                                      aux_loss_coef=0.02, seed=0, task_format="reasoning"),
                       config_overrides=_REASONING_OVERRIDES, use=("rl",),
                       # RL prompts filtered by pass rate, as practitioners do (DAPO's dynamic
                       # sampling drops all-correct and all-wrong groups): the tasks whose held-out
                       # accuracy is within 0.2-0.8 (multiplication 0.24, reversal 0.78, sorting
                       # 0.70, brackets 0.50). On all seven tasks a healthy 200-step run rose
                       # +0.075; on these four +0.134 (docs/benchmarks.md#rl_start_pilot).
                       rl_engine={"lr": 5e-5, "tasks": ("multiplication", "reversal", "sorting", "brackets")}),
        ReferenceModel("deepseek-v3-64e-rl", "deepseek_v3",
                       # 1001 steps: held-out accuracy 0.41 (format 1.00), from snapshots of
                       # `reference train --steps 1001 --snapshot-every 250` (0.11 at 251, 0.21 at
                       # 501, 0.30 at 751); DeepSeek-V3 balancing learns slower than Qwen3-MoE's.
                       TrainingRecipe(steps=1001, lr=3e-3, warmup_steps=100, min_lr_ratio=1.0, seed=0,
                                      aux_loss_coef=0.001, bias_update_speed=1e-3, task_format="reasoning"),
                       config_overrides=_REASONING_OVERRIDES, use=("rl",),
                       # The same rule as qwen3-moe-64e-rl (the tasks whose stored held-out accuracy,
                       # training.json, is within 0.2-0.8: addition 0.56, subtraction 0.58,
                       # multiplication 0.24, sorting 0.58, brackets 0.66). A healthy 200-step run on
                       # them rose +0.177 (docs/reproduction.md, "RL starting points").
                       rl_engine={"lr": 5e-5,
                                  "tasks": ("addition", "subtraction", "multiplication", "sorting", "brackets")}),
    )
}


def rl_engine_defaults(name: str) -> dict[str, Any]:
    """The engine settings a GRPO run of the reference model ``name`` starts from ({} for others)."""
    model = REFERENCE_MODELS.get(name)
    return dict(model.rl_engine) if model is not None else {}


def reference_model_path(name: str) -> Path:
    """Checkpoint directory of a shipped reference model (loadable with ``from_pretrained``)."""
    if name not in REFERENCE_MODELS:
        raise UnknownReferenceModel(f"unknown reference model {name!r}; known: {sorted(REFERENCE_MODELS)}")
    path = REFERENCE_MODELS[name].path
    if not (path / "config.json").exists():
        raise CheckpointMissing(
            f"{name}: no checkpoint at {path}; rebuild it with "
            f"`moeproxy reference train --name {name} --out {path}`"
        )
    return path


def list_reference_models() -> list[dict[str, Any]]:
    rows = []
    for m in REFERENCE_MODELS.values():
        info_file = m.path / "training.json"
        info = json.loads(info_file.read_text()) if info_file.exists() else {}
        rows.append({
            "name": m.name,
            "arch": m.arch,
            "path": str(m.path),
            "present": (m.path / "config.json").exists(),
            "use": list(m.use),
            "rl_engine": {k: list(v) if isinstance(v, tuple) else v for k, v in m.rl_engine.items()},
            "task_format": m.recipe.task_format,
            "seed": m.seed,
            "recipe": asdict(m.recipe),
            "heldout_accuracy": info.get("heldout_accuracy"),
            "train_time_s": info.get("train_time_s"),
        })
    return rows


# --- training -----------------------------------------------------------------------------------------

def encode_batch(tokenizer, examples: list[Example], fmt: ResponseFormat | None = None):
    """Right-padded ``input_ids``/``attention_mask``/``labels`` with labels only on the response (the
    format's target: the answer, or scratchpad and answer) and the end marker."""
    import torch

    fmt = fmt or get_format(None)
    rows, label_rows = [], []
    for ex in examples:
        prompt_ids = tokenizer(format_prompt(ex)).input_ids  # <bos> + prompt
        answer_ids = tokenizer(fmt.target(ex), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        label_rows.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])
    return input_ids, attention_mask, labels


def answer_loss(logits, labels):
    """Mean next-token cross-entropy over labelled positions."""
    import torch.nn.functional as F

    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def balance_loss(router_logits, attention_mask, top_k: int, scoring: str):
    """Per-layer Switch-style load-balancing loss E * sum_i f_i * P_i, averaged over layers, over
    non-padding tokens.  ``f_i``: share of top-k slots given to expert i; ``P_i``: mean routing
    probability (softmax for Qwen3, normalised sigmoid scores for DeepSeek-V3)."""
    import torch

    mask = attention_mask.reshape(-1).bool()
    losses = []
    for logits in router_logits:
        logits = logits.float()[mask]
        probs = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
        probs = probs / probs.sum(-1, keepdim=True)
        n_experts = probs.shape[-1]
        top = probs.topk(top_k, dim=-1).indices
        f = torch.zeros(n_experts, device=probs.device).scatter_add_(
            0, top.reshape(-1), torch.ones(top.numel(), device=probs.device)) / top.numel()
        losses.append(n_experts * (f * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def _update_correction_bias(model, router_logits, attention_mask, speed: float) -> None:
    """DeepSeek-V3 auxiliary-loss-free balancing: raise the bias of under-loaded experts and lower
    that of over-loaded ones by ``speed`` (sign of the load error), using the choices the router made."""
    import torch

    mask = attention_mask.reshape(-1).bool()
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    with torch.no_grad():
        for gate, logits in zip(gates, router_logits):
            scores = logits.float()[mask].sigmoid() + gate.e_score_correction_bias
            n_experts = scores.shape[-1]
            group_scores = scores.view(-1, gate.num_group, n_experts // gate.num_group).topk(2, -1)[0].sum(-1)
            group_idx = group_scores.topk(gate.topk_group, dim=-1)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            score_mask = group_mask.repeat_interleave(n_experts // gate.num_group, dim=1).bool()
            top = scores.masked_fill(~score_mask, float("-inf")).topk(gate.top_k, dim=-1).indices
            load = torch.bincount(top.reshape(-1), minlength=n_experts).float()
            gate.e_score_correction_bias += speed * torch.sign(load.mean() - load)


def _lr_at(step: int, recipe: TrainingRecipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cosine)


@dataclass
class TrainResult:
    model: Any
    tokenizer: Any
    losses: list[float]
    train_time_s: float


def train_model(
    arch: str,
    recipe: TrainingRecipe,
    config_overrides: dict[str, Any] | None = None,
    progress: Callable[[int, dict[str, float]], None] | None = None,
    log_every: int = 50,
    checkpoint: Callable[[int, Any, Any], None] | None = None,
    checkpoint_every: int = 500,
) -> TrainResult:
    """Train a fresh ``arch`` model on the train split with ``recipe``; returns the fp32 model."""
    import torch
    from moeproxy.reproduction.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    fmt = get_format(recipe.task_format)
    overrides = dict(config_overrides or {})
    if recipe.task_format != DEFAULT_FORMAT:
        overrides[CONFIG_KEY] = recipe.task_format  # travels in config.json, to proxies too
    model = build_model(arch, seed=recipe.seed, **overrides)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay,
                                  betas=(0.9, 0.98))
    stream = iter_train(seed=recipe.seed, tasks=list(TASKS))
    top_k = model.config.num_experts_per_tok
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, recipe)
        input_ids, attention_mask, labels = encode_batch(tokenizer, [next(stream) for _ in range(recipe.batch_size)],
                                                         fmt)
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_router_logits=True)
        lm = answer_loss(out.logits, labels)
        aux = balance_loss(out.router_logits, attention_mask, top_k, architecture_named(arch).router_scoring)
        loss = lm + recipe.aux_loss_coef * aux
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        if recipe.bias_update_speed > 0:
            _update_correction_bias(model, out.router_logits, attention_mask, recipe.bias_update_speed)
        losses.append(lm.item())
        if checkpoint is not None and step > 0 and step % checkpoint_every == 0:
            model.eval()
            checkpoint(step, model, tokenizer)
            model.train()
        if progress is not None and (step % log_every == 0 or step == recipe.steps - 1):
            progress(step, {"loss": lm.item(), "aux": aux.item(), "grad_norm": grad_norm.item(),
                            "lr": _lr_at(step, recipe), "elapsed_s": time.perf_counter() - start})
    model.eval()
    return TrainResult(model, tokenizer, losses, time.perf_counter() - start)


def save_checkpoint(result: TrainResult, out: Path, recipe: TrainingRecipe, extra: dict[str, Any]) -> Path:
    """Write safetensors + config + tokenizer + ``training.json`` (recipe, loss curve, figures)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, recipe.save_dtype)
    model = result.model.to(dtype)
    model.config.dtype = recipe.save_dtype
    model.save_pretrained(out, safe_serialization=True)
    result.model.to(torch.float32)
    result.tokenizer.save_pretrained(out)
    every = max(1, len(result.losses) // 200)
    info = {
        "recipe": asdict(recipe),
        "train_time_s": round(result.train_time_s, 1),
        "final_loss": sum(result.losses[-50:]) / max(1, len(result.losses[-50:])),
        "loss_curve": {"every": every, "values": [round(x, 4) for x in result.losses[::every]]},
        **extra,
    }
    (out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def heldout_accuracy(model, tokenizer, prompts_per_task: int = 500, save_dtype: str = "float32",
                     seed: int = 0) -> dict[str, Any]:
    """Greedy exact-match accuracy per task on the held-out split, of the weights as they will be
    saved (rounded to ``save_dtype``, then run in fp32 as loaders do), in the model's own response
    format; for a format with more components than accuracy, each component's mean too."""
    import copy

    import torch
    from moeproxy.reproduction.fidelity import generate_completions, task_accuracy
    from moeproxy.reproduction.tasks import make_split

    from moeproxy.reproduction.formats import format_of_config, score_batch

    fmt = format_of_config(model.config.to_dict())
    rounded = copy.deepcopy(model).to(getattr(torch, save_dtype)).to(torch.float32).eval()
    examples = make_split("heldout", prompts_per_task * len(TASKS), seed=seed)
    completions = generate_completions(rounded, tokenizer, examples, max_new_tokens=fmt.max_new_tokens)
    per_task = task_accuracy(examples, completions, fmt)
    acc = {t: v["accuracy"] for t, v in per_task.items()}
    out = {**acc, "mean": sum(acc.values()) / len(acc), "n_per_task": prompts_per_task}
    if len(fmt.component_names) > 1:
        scores = score_batch(fmt, examples, completions)
        out["components"] = {c: sum(s[c] for s in scores) / len(scores) for c in fmt.component_names}
    return out
