"""The fresh process behind :func:`~moeproxy.reproduction.memory.workloads.rss_probe`: build the GRPO
engine on a checkpoint, run RL steps, print the process's peak RSS and its RSS before the load as
one JSON line.

    python -m moeproxy.reproduction.memory.rss_child MODEL_DIR ENGINE_CONFIG_JSON STEPS

A process of its own because in one long process freed pages stay mapped, which hides differences.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    model_dir, config_json, steps = argv if argv is not None else sys.argv[1:]
    import torch

    torch.set_num_threads(1)
    from moeproxy.proxy_builder.process_memory import current_rss_mb
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.engine import GRPOEngine
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # import every module the model needs, allocate nothing
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    base = current_rss_mb()
    engine = GRPOEngine(model_dir, config=EngineConfig.from_dict(json.loads(config_json)), seed=0)
    peaks = [engine.step(k)["perf/peak_memory_mb"] for k in range(int(steps))]
    print(json.dumps({"peak_rss_mb": max(peaks), "rss_before_load_mb": base, "run_mb": max(peaks) - base}))


if __name__ == "__main__":
    main()
