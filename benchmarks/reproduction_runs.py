"""What the engine's runs look like on an RL starting point (issue 14): a healthy GRPO run, and one
run of each fault family beside its healthy twin (same seed, same prompts), with SVG plots of the
reward (total and accuracy component), entropy, KL to the reference, response length and the
rollout-train mismatch, for docs/reproduction.md.

Resumable: a job whose trace directory already holds a manifest is not run again, so the script
can be stopped at any time and started again.

    OMP_NUM_THREADS=2 nice -n 10 python benchmarks/reproduction_runs.py --model qwen3-moe-64e-rl \\
        --steps 200 --out benchmarks/results/reproduction

Writes ``OUT/<model>/<job>/`` (the reproduce manifest and raw traces), ``OUT/<model>/summary.json``
and ``docs/figures/reproduction-<model>-<job>.svg``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"

#: The batch of these runs (16 prompts x 8 samples); a reference model adds its own RL setting
#: (``ReferenceModel.rl_engine``: LR and the prompt mix under which its healthy run learns).
ENGINE = {"prompts_per_step": 16, "group_size": 8, "ppo_mini_batch_size": 4, "lr": 5e-5}

#: One fault per family: job name -> (class, variant, params). All four are code bugs, started
#: part-way through so the figure shows the healthy stretch before the change; the configuration
#: faults (there from step 0 only) are in campaign v2 and its held-out sets.
FAMILY_JOBS: dict[str, tuple[str, str, dict]] = {
    "framework": ("stale_weight_sync", "skip_from_onset", {"onset": 60}),
    "numerical": ("rollout_logp_precision", "bf16", {"onset": 60}),
    "routing": ("routing_mismatch", "router_logit_noise", {"onset": 60}),
    "optimisation": ("kl_misconfiguration", "sign_flip", {"onset": 60, "magnitude": 3.0}),
}

#: Panels: title -> metric (raw engine names).
PANELS: dict[str, str] = {
    "reward (total)": "critic/score/mean",
    "accuracy component": "engine/reward/accuracy/mean",
    "entropy": "actor/entropy",
    "KL to reference": "actor/kl_loss",
    "response length": "response_length/mean",
    "rollout-train prob. diff": "training/rollout_probs_diff_mean",
}


def run_job(
    model_dir: Path, out: Path, fault: tuple[str, str, dict], steps: int, seed: int, threads: int, engine: dict
) -> Path:
    from moeproxy.reproduction.backend import ModelSpec, get_backend
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.faults import FaultSpec

    if (out / "manifest.json").exists():
        return out
    cls, variant, params = fault
    config = EngineConfig(**engine, threads=threads)
    t0 = time.perf_counter()
    get_backend("local").run(ModelSpec(str(model_dir)), FaultSpec(cls, variant, params), [seed], steps,
                             config=config, out_dir=out, with_healthy=False, view="raw",
                             on_step=lambda label, s, k, v: print(f"{out.name} step {k}", file=sys.stderr)
                             if k % 20 == 0 else None)
    print(f"{out.name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def series(trace_dir: Path, metric: str) -> list[float]:
    from moeproxy.reproduction.backend import read_trace

    (trace,) = [read_trace(p) for p in sorted(trace_dir.glob("*-seed*.jsonl"))]
    return [float(r["values"].get(metric, math.nan)) for r in trace]


def window_rise(xs: list[float], n: int = 20) -> float:
    """Mean of the last ``n`` steps minus the mean of the first ``n`` (the issue's measure)."""
    return statistics.fmean(xs[-n:]) - statistics.fmean(xs[:n])


# --- plots ---------------------------------------------------------------------------------------------

def _polyline(xs: list[float], lo: float, hi: float, x0: float, y0: float, w: float, h: float) -> str:
    span = (hi - lo) or 1.0
    pts = []
    for i, v in enumerate(xs):
        if math.isfinite(v):
            pts.append(f"{x0 + w * i / max(1, len(xs) - 1):.1f},{y0 + h - h * (v - lo) / span:.1f}")
    return " ".join(pts)


def svg_panels(curves: dict[str, dict[str, list[float]]], title: str) -> str:
    """A row of small line plots, one per panel; ``curves[panel][label]`` (healthy grey, fault red)."""
    colors = {"healthy": "#777777", "fault": "#d62728"}
    pw, ph, pad = 220, 120, 36
    width = len(curves) * (pw + pad) + pad
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{ph + 70}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{pad}" y="16" font-size="13">{title}</text>']
    for i, (panel, lines) in enumerate(curves.items()):
        x0, y0 = pad + i * (pw + pad), 30
        finite = [v for xs in lines.values() for v in xs if math.isfinite(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        parts.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>')
        parts.append(f'<text x="{x0}" y="{y0 + ph + 14}">{panel}</text>')
        parts.append(f'<text x="{x0 + pw}" y="{y0 + ph + 14}" text-anchor="end">{lo:.3g} .. {hi:.3g}</text>')
        for label, xs in lines.items():
            parts.append(f'<polyline fill="none" stroke="{colors.get(label, "#1f77b4")}" stroke-width="1.2" '
                         f'points="{_polyline(xs, lo, hi, x0, y0, pw, ph)}"/>')
    parts.append("</svg>")
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-moe-64e-rl", help="reference model name or checkpoint directory")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--families", default=",".join(FAMILY_JOBS), help="which fault families to run (or none)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "reproduction")
    args = ap.parse_args()

    from moeproxy.reproduction.reference import REFERENCE_MODELS, reference_model_path, rl_engine_defaults

    model_dir = reference_model_path(args.model) if args.model in REFERENCE_MODELS else Path(args.model)
    name = args.model if args.model in REFERENCE_MODELS else model_dir.name
    engine = {**ENGINE, **rl_engine_defaults(args.model)}
    base = args.out / name
    healthy = run_job(model_dir, base / "healthy", ("healthy", "none", {}), args.steps, args.seed, args.threads, engine)
    summary: dict = {"model": name, "steps": args.steps, "seed": args.seed,
                     "engine": {k: list(v) if isinstance(v, tuple) else v for k, v in engine.items()},
                     "host": {"platform": platform.platform(), "threads": args.threads}, "runs": {}}
    h = {panel: series(healthy, metric) for panel, metric in PANELS.items()}
    summary["runs"]["healthy"] = {
        "accuracy_rise_last20_minus_first20": window_rise(h["accuracy component"]),
        **{f"{panel} first20/last20": [statistics.fmean(xs[:20]), statistics.fmean(xs[-20:])]
           for panel, xs in h.items()},
    }
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"reproduction-{name}-healthy.svg").write_text(
        svg_panels({p: {"healthy": xs} for p, xs in h.items()}, f"{name}: healthy GRPO run, {args.steps} steps"))
    for family in [f for f in args.families.split(",") if f and f != "none"]:
        cls, variant, params = FAMILY_JOBS[family]
        d = run_job(model_dir, base / family, FAMILY_JOBS[family], args.steps, args.seed, args.threads, engine)
        f = {panel: series(d, metric) for panel, metric in PANELS.items()}
        summary["runs"][family] = {"fault": f"{cls}/{variant}", "params": params,
                                   **{f"{panel} last20 fault/healthy": [statistics.fmean(f[panel][-20:]),
                                                                        statistics.fmean(h[panel][-20:])]
                                      for panel in PANELS}}
        (FIGURES / f"reproduction-{name}-{family}.svg").write_text(svg_panels(
            {p: {"healthy": h[p], "fault": f[p]} for p in PANELS},
            f"{name}: {cls}/{variant} {params} (red) beside its healthy twin (grey)"))
    (base / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["runs"]["healthy"], indent=1))


if __name__ == "__main__":
    main()
