"""Loading a checkpoint and reading its MoE structure through the architecture table, and greedy
generation of task answers: what every fidelity measure starts from."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moeproxy.proxy_builder.architectures import architecture_for
from moeproxy.reproduction.tasks import MAX_ANSWER_CHARS, Example, format_prompt

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class FidelityError(ValueError):
    """Inputs the harness cannot compare (missing files, mismatched models, bad mapping)."""


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
