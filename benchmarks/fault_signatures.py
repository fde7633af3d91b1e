"""Measured signature of every fault variant: the fault run vs its healthy twin on one model.

For each registered (class, variant) with its default parameters and ``onset``, one run per seed
next to the healthy twin (same seed): per metric, the mean over the steps from the onset in the
healthy run and in the fault run, and the first step at which they differ.  The table feeds
docs/faults.md ("signature as measured").

    nice -n 10 python benchmarks/fault_signatures.py --model DIR --steps 12 --onset 4 --seeds 0

Writes benchmarks/results/fault_signatures.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

METRICS = (
    "critic/score/mean", "actor/ppo_kl", "actor/kl_loss", "actor/grad_norm", "actor/pg_loss", "actor/pg_clipfrac",
    "actor/entropy", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/k3_kl",
    "moe/routing_agreement", "moe/expert_entropy", "response_length/mean", "actor/lr",
)


def _mean(xs):
    xs = list(xs)
    if any(not math.isfinite(x) for x in xs):
        return float("nan") if any(math.isnan(x) for x in xs) else float("inf")
    return statistics.fmean(xs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--onset", type=int, default=4)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--engine", action="append", default=[])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fault_signatures.json")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from moeproxy.reproduction.backend import LocalTorchBackend, ModelSpec
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.catalogue import at_onset
    from moeproxy.reproduction.faults import INJECTORS, FaultSpec

    config = EngineConfig().with_strings(dict(kv.partition("=")[::2] for kv in args.engine))
    seeds = [int(s) for s in args.seeds.split(",")]
    backend, model = LocalTorchBackend(), ModelSpec(str(args.model))
    t0 = time.perf_counter()
    healthy = {s: backend.run_one(model, FaultSpec("healthy"), s, args.steps, config=config)[0] for s in seeds}
    rows = []
    for (cls, variant) in INJECTORS:
        if cls == "healthy":
            continue
        spec = FaultSpec(cls, variant, at_onset(cls, variant, {}, args.onset))
        per_metric: dict[str, dict] = {}
        for s in seeds:
            trace, _ = backend.run_one(model, spec, s, args.steps, config=config)
            for m in METRICS:
                f = [r["values"][m] for r in trace]
                h = [r["values"][m] for r in healthy[s]]
                first = next((i for i, (a, b) in enumerate(zip(f, h)) if not (a == b or (math.isnan(a) and math.isnan(b)))), None)
                d = per_metric.setdefault(m, {"healthy": [], "fault": [], "first_diff": []})
                d["healthy"].append(_mean(h[args.onset:]))
                d["fault"].append(_mean(f[args.onset:]))
                d["first_diff"].append(first)
        row = {"class": cls, "variant": variant, "params": spec.to_dict()["params"], "metrics": per_metric}
        rows.append(row)
        brief = " ".join(
            f"{m.split('/')[-1]}={statistics.fmean(v['healthy']):.3g}->{_mean(v['fault']):.3g}"
            for m, v in per_metric.items() if m in METRICS[:12]
        )
        print(f"{cls}/{variant}: {brief}", flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/fault_signatures.py", *(argv if argv is not None else sys.argv[1:])]),
        "model": str(args.model), "steps": args.steps, "onset": args.onset, "seeds": seeds,
        "engine": config.to_dict(), "rows": rows, "wall_time_s": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    print(markdown(result))
    return 0


#: per class, the metrics its row in docs/faults.md shows
SHOWN: dict[str, tuple[str, ...]] = {
    "actor_update_omission": ("actor/ppo_kl", "actor/grad_norm", "actor/kl_loss"),
    "stale_weight_sync": ("training/rollout_probs_diff_mean", "rollout_corr/k3_kl", "moe/routing_agreement"),
    "rollout_logp_precision": ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/k3_kl"),
    "operator_numeric_noise": ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "critic/score/mean"),
    "routing_mismatch": ("moe/routing_agreement", "training/rollout_probs_diff_mean", "rollout_corr/k3_kl"),
    "router_corruption": ("moe/expert_entropy", "actor/kl_loss", "critic/score/mean"),
    "gradient_overflow": ("actor/grad_norm", "actor/pg_loss", "critic/score/mean"),
    "lr_misconfiguration": ("actor/lr", "actor/ppo_kl", "actor/kl_loss"),
    "kl_misconfiguration": ("actor/kl_loss", "actor/ppo_kl", "actor/entropy"),
    "reward_fault": ("critic/score/mean", "actor/pg_loss", "actor/grad_norm"),
}


def _fmt(x: float) -> str:
    return "NaN" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.3g}")


def markdown(result: dict) -> str:
    lines = ["| class / variant | metric: healthy → fault (mean from onset), first differing step |", "|---|---|"]
    for row in result["rows"]:
        cells = []
        for m in SHOWN.get(row["class"], ()):
            v = row["metrics"][m]
            firsts = [f for f in v["first_diff"] if f is not None]
            cells.append(f"`{m}` {_fmt(statistics.fmean(v['healthy']))} → {_fmt(_mean(v['fault']))}"
                         f" (step {min(firsts) if firsts else '–'})")
        lines.append(f"| {row['class']} / {row['variant']} | " + "; ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
