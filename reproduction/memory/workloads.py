"""The figures the project reports: peak tensor bytes of a greedy generation and of RL steps, each
measured with the model load inside the block, and, for comparison, the process RSS of RL steps in
a fresh process (:mod:`.rss_child`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from moeproxy.reproduction.memory import rss_child
from moeproxy.reproduction.memory.meter import TensorMemory, measure_tensor_memory, tensor_bytes
from moeproxy.reproduction.memory.peaks import InvalidMemoryRequest


def _check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise InvalidMemoryRequest(f"{path}: not a checkpoint directory (no config.json)")
    return path


class _PhaseFigure:
    """A measured block whose reported figure is the peak of one of its phases (``FIGURE_PHASE``)."""

    FIGURE_PHASE: ClassVar[str]
    SETUP_PHASE: ClassVar[str]  # the phase before it (the model loaded), reported as <name>_peak_bytes
    memory: TensorMemory

    @property
    def peak(self) -> TensorMemory:
        return self.memory.phases[self.FIGURE_PHASE]

    @property
    def peak_bytes(self) -> int:
        return self.peak.peak_bytes

    def _figures(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes, "by_category": self.peak.by_category,
            f"{self.SETUP_PHASE}_peak_bytes": self.memory.phases[self.SETUP_PHASE].peak_bytes,
            "block": self.memory.to_dict(),
        }


@dataclass(frozen=True)
class GenerationMemory(_PhaseFigure):
    """``memory`` is the whole block, with phases ``load`` and ``generate``; the figure is the
    peak of ``generate``: the weights and everything generation adds (KV cache, activations)."""

    FIGURE_PHASE: ClassVar[str] = "generate"
    SETUP_PHASE: ClassVar[str] = "load"
    model_dir: str
    batch_size: int
    prompt_tokens: int
    max_new_tokens: int
    parameter_bytes: int  # parameters + buffers of the loaded model
    memory: TensorMemory

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir, "batch_size": self.batch_size, "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens, "parameter_bytes": self.parameter_bytes,
            **self._figures(),
        }


def peak_generation_memory(
    model_dir: str | Path,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 9,
    device: str = "cpu",
    categories: bool = False,
) -> GenerationMemory:
    """Load ``model_dir`` in fp32 and greedily generate ``max_new_tokens`` for the batch ``prompts``.

    The load is inside the measured block (phase ``load``), so the weights are counted without a
    baseline; the reported peak is that of phase ``generate``, which leaves out the loader's own
    transient buffers (on CPU the bf16 file buffer being converted; an accelerator never holds it).
    """
    import torch
    from moeproxy.reproduction.policy import load_tokenizer

    path = _check_model_dir(model_dir)
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise InvalidMemoryRequest("prompts must be a non-empty sequence of strings")
    if max_new_tokens < 1:
        raise InvalidMemoryRequest(f"max_new_tokens={max_new_tokens}: generate at least one token")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    with measure_tensor_memory(device, categories=categories) as meter:
        dev = meter.device.string
        with meter.phase("load"):
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(dev)
            model.eval()
        with meter.phase("generate"), torch.no_grad():
            model.generate(
                input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev),
                do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )
        parameter_bytes = tensor_bytes(model)
    return GenerationMemory(
        str(path), len(prompts), int(enc["input_ids"].shape[1]), max_new_tokens, parameter_bytes, meter.result,
    )


@dataclass(frozen=True)
class RLStepMemory(_PhaseFigure):
    """``memory`` is the whole block, with phases ``engine`` (three policy copies loaded) and
    ``steps``; the figure is the peak of ``steps``."""

    FIGURE_PHASE: ClassVar[str] = "steps"
    SETUP_PHASE: ClassVar[str] = "engine"
    model_dir: str
    engine: dict[str, Any]  # EngineConfig.to_dict()
    steps: int
    parameter_bytes: int  # parameters + buffers of one policy copy
    copies: int  # policy copies the engine holds (trainer, rollout, reference)
    memory: TensorMemory

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir, "engine": self.engine, "steps": self.steps,
            "parameter_bytes": self.parameter_bytes, "copies": self.copies, **self._figures(),
        }


def peak_rl_step_memory(
    model_dir: str | Path,
    *,
    config=None,
    steps: int = 1,
    seed: int = 0,
    device: str = "cpu",
    categories: bool = False,
) -> RLStepMemory:
    """Build the GRPO engine on ``model_dir`` and run ``steps`` RL steps: peak tensor bytes.

    The block covers the engine's construction (phase ``engine``: trainer, rollout and reference
    copies) and the steps (phase ``steps``: rollout, log-prob passes, mini-batch updates with their
    gradients and the AdamW moments created on the first optimizer step, weight sync).  The
    reported peak is that of ``steps``, with the three copies counted because they were allocated
    earlier in the block.  ``config`` is an :class:`~moeproxy.reproduction.config.EngineConfig`
    (default: the engine's defaults).
    """
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.engine import GRPOEngine

    path = _check_model_dir(model_dir)
    if steps < 1:
        raise InvalidMemoryRequest(f"steps={steps}: measure at least one RL step")
    config = config or EngineConfig()
    if not isinstance(config, EngineConfig):
        raise InvalidMemoryRequest(f"config must be an EngineConfig, not {type(config).__name__}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with measure_tensor_memory(device, categories=categories) as meter:
        with meter.phase("engine"):
            engine = GRPOEngine(path, config=config, seed=seed, device=device)
        with meter.phase("steps"):
            for k in range(steps):
                engine.step(k)
        parameter_bytes = tensor_bytes(engine.trainer_policy.model)
        copies = 2 + (engine.trainer.ref is not None)
    return RLStepMemory(str(path), config.to_dict(), steps, parameter_bytes, copies, meter.result)


def rss_probe(model_dir: str | Path, config: Any, steps: int = 1) -> dict[str, Any]:
    """Peak RSS of engine construction + ``steps`` RL steps in a fresh process, minus its RSS before
    loading (in one long process freed pages stay mapped, which hides differences). The process
    figure the engine reports as ``perf/peak_memory_mb``, kept for comparison with the tensor peak."""
    import json
    import subprocess
    import sys

    if steps < 1:
        raise InvalidMemoryRequest("steps must be >= 1")
    proc = subprocess.run(
        [sys.executable, "-m", rss_child.__name__, str(model_dir), json.dumps(config.to_dict()), str(steps)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}
