"""Tiny MoE checkpoints for the engine and fault tests, warmed up so rewards are not all zero.

A randomly initialised model never answers a task right, so every GRPO advantage is 0 and
nothing a fault does to the update shows.  ``warm_tiny`` trains a tiny Qwen3-MoE (or DeepSeek-V3)
with the task suite's character tokenizer for a few hundred supervised steps on the one-digit
and yes/no tasks (``counting``, ``brackets``), enough for a reward near 0.3–0.6 with variance in
every group.  Deterministic in its arguments; cached per test session by the caller.
"""

from __future__ import annotations

from pathlib import Path

WARM_TASKS = ("counting", "brackets")


def warm_tiny(out: Path, *, arch: str = "qwen3_moe", seed: int = 0, sft_steps: int = 300, **overrides) -> Path:
    import torch
    from moeproxy.reproduction.tasks import format_text, make_split
    from moeproxy.reproduction.tokenizer import VOCAB_SIZE, build_tokenizer
    from tiny_models import build_model

    torch.set_num_threads(1)
    cfg = {"vocab_size": VOCAB_SIZE, "hidden_size": 48, "num_experts_per_tok": 2}
    if arch == "qwen3_moe":
        cfg.update(num_experts=8, head_dim=12)
    cfg.update(overrides)
    model = build_model(arch, seed=seed, **cfg)
    tok = build_tokenizer()
    tok.padding_side = "right"
    texts = [format_text(e) for e in make_split("train", 2048, seed=seed, tasks=WARM_TASKS)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(sft_steps):
        idx = torch.randint(len(texts), (32,), generator=gen).tolist()
        enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = Path(out)
    model.save_pretrained(out)
    tok.padding_side = "left"
    tok.save_pretrained(out)
    return out


_CACHE: dict[tuple, Path] = {}


def cached_warm_tiny(base: Path, **kwargs) -> Path:
    """One warmed model per argument set and test session (``base`` is a session temp dir)."""
    key = tuple(sorted(kwargs.items()))
    if key not in _CACHE:
        name = "warm-" + "-".join(f"{k}{v}" for k, v in key) if key else "warm"
        _CACHE[key] = warm_tiny(Path(base) / name, **kwargs)
    return _CACHE[key]


def small_config(**overrides):
    """A small, fast engine config on the warm tasks: 8 prompts × 4 samples, 4 mini-batch updates."""
    from moeproxy.reproduction.config import EngineConfig

    base = dict(
        tasks=WARM_TASKS, max_new_tokens=4, lr=1e-4, lr_warmup_steps=1,
        prompts_per_step=8, group_size=4, ppo_mini_batch_size=2,
    )
    base.update(overrides)
    return EngineConfig(**base)
