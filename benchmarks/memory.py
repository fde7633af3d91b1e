"""Peak tensor memory of a model and its proxies: greedy generation and one GRPO step.

For each ``--models`` checkpoint: build a three-view proxy per ``--keep-ratios`` entry (default
50% and 25%, view weights ``auto``, the task suite's calibration corpus), then measure for the
original and every proxy, each in the same process and with the same engine configuration:

* generation: load in fp32 and greedily generate ``max_new_tokens`` for one rollout batch
  (``prompts_per_step × group_size`` task prompts) — peak tensor bytes while generating, the
  weights included (the loader's transient buffers are reported apart, as ``load_peak_bytes``);
* RL step: build the GRPO engine (trainer, rollout and reference copies) and run one step
  (rollout, log-prob passes, mini-batch updates with AdamW, weight sync) — peak tensor bytes of the
  step, the three copies included, and,
  unless ``--no-categories``, its split into parameter / optimizer state / gradient / ... at the
  peak;
* unless ``--no-rss``: the old figure, for comparison: process peak RSS of one RL step in a fresh
  process (the engine rewinds the high-water mark at the step start), minus the RSS before the
  model is loaded.

Tensor bytes are measured by :mod:`moeproxy.reproduction.memory` (on CPU from the torch
profiler's allocator events; see docs/memory.md).  Ratios are proxy / original.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/memory.py --out benchmarks/results/memory.json \
        [--models reproduction/models/qwen3-moe-64e,reproduction/models/deepseek-v3-64e] \
        [--engine key=value ...] [--work /tmp/moeproxy-memory]

Prints a markdown table and writes the JSON file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "reproduction" / "models" / "qwen3-moe-64e"

#: the engine configuration benchmarks/transfer.py runs with, as ``--engine`` strings
DEFAULT_ENGINE = {"prompts_per_step": "8", "ppo_mini_batch_size": "4", "max_new_tokens": "9", "lr": "1e-4"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_proxies(model: Path, work: Path, keep_ratios: list[float]) -> dict[str, tuple[Path, float]]:
    """``{"original": (model, 1.0), "three_view_50": (dir, 0.5), ...}``; a proxy already in ``work`` is reused."""
    from moeproxy.proxy_builder import BuildRequest, build_proxy
    from moeproxy.reproduction.tasks import calibration_corpus

    out = {"original": (model, 1.0)}
    texts = None
    for ratio in keep_ratios:
        name = f"three_view_{round(ratio * 100)}"
        d = work / model.name / f"proxy-{name}"
        if not (d / "config.json").exists():
            texts = texts or calibration_corpus(2048, seed=0)
            t = time.perf_counter()
            build_proxy(
                BuildRequest(
                    model,
                    d,
                    keep_ratio=ratio,
                    method="three_view",
                    view_weights="auto",
                    calibration=texts,
                    seed=0,
                    overwrite=True,
                )
            )
            log(f"{model.name}: built {name} in {time.perf_counter() - t:.1f} s")
        out[name] = (d, ratio)
    return out


def checkpoint_parameters(path: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                n += math.prod(fh.get_slice(key).get_shape())
    return n


def generation_prompts(config) -> list[str]:
    """One rollout batch of distinct task prompts, as many as the engine samples per step."""
    from moeproxy.reproduction.tasks import format_prompt, make_split

    examples = make_split(config.prompt_split, config.batch_size, seed=0, tasks=config.tasks)
    return [format_prompt(ex) for ex in examples]


def measure(path: Path, config, prompts: list[str], *, categories: bool) -> dict:
    from moeproxy.reproduction.memory import peak_generation_memory, peak_rl_step_memory

    t = time.perf_counter()
    gen = peak_generation_memory(path, prompts, max_new_tokens=config.max_new_tokens)
    t_gen = time.perf_counter() - t
    t = time.perf_counter()
    rl = peak_rl_step_memory(path, config=config, steps=1, categories=categories)
    t_rl = time.perf_counter() - t
    g, r = gen.to_dict(), rl.to_dict()
    r.pop("engine")
    return {"generation": {**g, "wall_s": t_gen}, "rl_step": {**r, "wall_s": t_rl}}


def _ratio(a, b):
    return None if a is None or not b else a / b


def ratios(variants: dict) -> dict:
    """Proxy / original for parameters, both tensor peaks, each category at the RL peak, and RSS."""
    base = variants["original"]
    out = {}
    for name, v in variants.items():
        if name == "original":
            continue
        row = {
            "parameters": _ratio(v["parameters"], base["parameters"]),
            "parameter_bytes": _ratio(v["rl_step"]["parameter_bytes"], base["rl_step"]["parameter_bytes"]),
            "generation_peak": _ratio(v["generation"]["peak_bytes"], base["generation"]["peak_bytes"]),
            "rl_step_peak": _ratio(v["rl_step"]["peak_bytes"], base["rl_step"]["peak_bytes"]),
        }
        cats, base_cats = v["rl_step"].get("by_category"), base["rl_step"].get("by_category")
        if cats and base_cats:
            row["rl_step_by_category"] = {c: _ratio(cats[c], base_cats[c]) for c in cats}
        if "rss" in v and "run_mb" in v["rss"] and "run_mb" in base.get("rss", {}):
            row["rss_run"] = _ratio(v["rss"]["run_mb"], base["rss"]["run_mb"])
            row["rss_peak"] = _ratio(v["rss"]["peak_rss_mb"], base["rss"]["peak_rss_mb"])
        out[name] = row
    return out


def _fmt(x, spec=".2f") -> str:
    return "–" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    mib = 2**20
    lines = [
        ("| model | variant | parameters | param ratio | generation peak MiB | ratio | RL-step peak MiB | ratio "
         "| RSS ratio (old) |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, m in result["models"].items():
        for name, v in m["variants"].items():
            r = m["ratios"].get(name, {"parameters": 1.0, "generation_peak": 1.0, "rl_step_peak": 1.0,
                                       "rss_run": 1.0 if "rss" in v else None})
            lines.append(
                f"| {model} | {name} | {v['parameters']:,} | {_fmt(r['parameters'])} "
                f"| {v['generation']['peak_bytes'] / mib:.1f} | {_fmt(r['generation_peak'])} "
                f"| {v['rl_step']['peak_bytes'] / mib:.1f} | {_fmt(r['rl_step_peak'])} | {_fmt(r.get('rss_run'))} |"
            )
    cat_rows = [(model, name, r["rl_step_by_category"]) for model, m in result["models"].items()
                for name, r in m["ratios"].items() if r.get("rl_step_by_category")]
    if cat_rows:
        from moeproxy.reproduction.memory import CATEGORIES

        lines += ["", "RL-step peak by category, proxy / original:", "",
                  "| model | variant | " + " | ".join(CATEGORIES) + " |", "|---|---|" + "---|" * len(CATEGORIES)]
        for model, name, cats in cat_rows:
            lines.append(f"| {model} | {name} | " + " | ".join(_fmt(cats.get(c)) for c in CATEGORIES) + " |")
    return "\n".join(lines)


def run_model(model: Path, args, config, prompts) -> dict:
    from moeproxy.reproduction.memory import rss_probe

    variants = {}
    for name, (path, ratio) in build_proxies(model, args.work, args.keep_ratios).items():
        t = time.perf_counter()
        v = {"path": str(path), "keep_ratio": ratio, "parameters": checkpoint_parameters(path)}
        v.update(measure(path, config, prompts, categories=args.categories))
        if args.rss:
            v["rss"] = rss_probe(path, config, steps=1)
        log(f"{model.name}/{name}: generation {v['generation']['peak_bytes'] / 2**20:.2f} MiB, "
            f"RL step {v['rl_step']['peak_bytes'] / 2**20:.2f} MiB ({time.perf_counter() - t:.0f} s)")
        variants[name] = v
    return {"path": str(model), "variants": variants, "ratios": ratios(variants)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=str(DEFAULT_MODEL.relative_to(ROOT)),
                    help="comma-separated checkpoint directories (default: the qwen3-moe-64e reference model)")
    ap.add_argument("--keep-ratios", default="0.5,0.25", help="three-view proxies to build, as keep ratios")
    ap.add_argument("--engine", action="append", default=[], help="engine option key=value (over the defaults "
                    + ", ".join(f"{k}={v}" for k, v in DEFAULT_ENGINE.items()) + ")")
    ap.add_argument("--work", type=Path, default=Path("/tmp/moeproxy-memory"), help="where proxies are built")
    ap.add_argument("--no-categories", dest="categories", action="store_false",
                    help="skip the per-category split of the RL-step peak (it traces Python calls: slower)")
    ap.add_argument("--no-rss", dest="rss", action="store_false", help="skip the old peak-RSS figure")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "memory.json")
    args = ap.parse_args(argv)
    args.keep_ratios = [float(x) for x in args.keep_ratios.split(",") if x]

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from moeproxy.reproduction.config import EngineConfig

    config = EngineConfig().with_strings({**DEFAULT_ENGINE, **dict(kv.partition("=")[::2] for kv in args.engine)})
    prompts = generation_prompts(config)
    t0 = time.perf_counter()
    models = {}
    for m in (Path(p) for p in args.models.split(",") if p):
        models[m.name] = run_model(m if m.is_absolute() else ROOT / m, args, config, prompts)
    result = {
        "command": " ".join(["python", "benchmarks/memory.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu_count": os.cpu_count(), "threads": 1, "device": "cpu", "platform": platform.platform(),
                    "torch": torch.__version__},
        "measure": "peak live tensor bytes (moeproxy.reproduction.memory; CPU: torch profiler allocator events)",
        "engine": config.to_dict(),
        "generation_batch": len(prompts),
        "models": models,
        "wall_time_s": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
