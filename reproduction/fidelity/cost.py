"""The cost side of fidelity: parameter count, the peak memory a fresh process adds to load and
generate, and generation throughput measured side by side."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moeproxy.reproduction.memory import generation_rss_child
from moeproxy.reproduction.tasks import MAX_ANSWER_CHARS, Example, format_prompt

# --- cost ---------------------------------------------------------------------------------------------

def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def measure_peak_memory_mb(path: Path | str, prompts: Sequence[str]) -> float:
    """Peak resident memory a fresh process adds to load the checkpoint (fp32) and generate a batch:
    the RSS high-water mark (reset after the imports) minus the RSS before loading, so the
    interpreter and libraries cancel out.  The process is
    :mod:`~moeproxy.reproduction.memory.generation_rss_child`."""
    argv = [sys.executable, "-m", generation_rss_child.__name__, str(path), json.dumps(list(prompts))]
    res = subprocess.run(argv, capture_output=True, text=True, check=True, env=_one_thread_env())
    return float(json.loads(res.stdout.strip().splitlines()[-1])["run_mb"])


def _one_thread_env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def generation_throughput(models: Sequence[Any], tokenizer, examples: Sequence[Example],
                          repeats: int = 5) -> list[float]:
    """Generated tokens per second of each model (median of ``repeats``), measured side by side:
    the models take turns within every repeat so machine noise hits all of them alike.  Every
    sequence is forced to 9 new tokens so all models do the same work."""
    import torch

    enc = tokenizer([format_prompt(e) for e in examples], padding=True, return_tensors="pt")
    new = MAX_ANSWER_CHARS + 1
    rates: list[list[float]] = [[] for _ in models]
    for _ in range(repeats):
        for i, model in enumerate(models):
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
            rates[i].append(len(examples) * new / (time.perf_counter() - t0))
    return [statistics.median(r) for r in rates]


