"""Transfer check: does a fault's signature on a proxy match the one on its original model?

For every fault class (one variant each, onset ``--onset``), on the original model, its 50%
three-view proxy and a 50% random proxy, over several seeds, each fault run next to its healthy
twin (same seed): per key metric of the class, the direction of the fault effect (fault − healthy
after the onset; ``nonfinite`` when the fault run turns NaN/inf), the onset step of the change
(first step where the twins differ beyond noise), and the Pearson correlation of the mean effect
trace with the original's.  Plus wall time and peak memory per RL step per model, and the
planner's device count for the model's shape.  When ``moeproxy.signatures.consistency`` is
importable, its verdict on (original fault run, proxy fault run) is reported too — from the runs
alone, with no healthy twin, as production would see them.

Usage::

    nice -n 10 python benchmarks/transfer.py --model reproduction/models/qwen3-moe-64e \
        --steps 30 --onset 10 --seeds 0,1 [--work /tmp/transfer]

Writes benchmarks/results/transfer.json and prints a markdown table.
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

#: one variant per class and the metrics its signature is judged on
CLASSES: dict[str, tuple[str, dict, tuple[str, ...]]] = {
    "actor_update_omission": ("skip_step", {}, ("actor/ppo_kl", "actor/kl_loss", "critic/score/mean")),
    "stale_weight_sync": ("skip_from_onset", {}, ("training/rollout_probs_diff_mean", "rollout_corr/kl", "actor/kl_loss")),
    "rollout_logp_precision": ("bf16", {}, ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/k3_kl")),
    "operator_numeric_noise": ("attention_seq_len", {}, ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/k3_kl")),
    "routing_mismatch": ("router_logit_noise", {}, ("moe/routing_agreement", "training/rollout_probs_diff_mean", "rollout_corr/k3_kl")),
    "router_corruption": ("noise", {}, ("moe/expert_entropy", "actor/kl_loss", "critic/score/mean")),
    "gradient_overflow": ("loss_scale_no_handling", {}, ("actor/grad_norm", "actor/pg_loss", "critic/score/mean")),
    "lr_misconfiguration": ("lr_multiplier", {}, ("actor/ppo_kl", "actor/kl_loss", "actor/pg_clipfrac")),
    "kl_misconfiguration": ("sign_flip", {"magnitude": 10.0}, ("actor/kl_loss", "actor/kl_coef")),
    "reward_fault": ("constant", {}, ("critic/score/mean", "critic/advantages/max", "actor/pg_loss")),
}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def effect_of(fault: list[float], healthy: list[float], onset: int) -> dict:
    """Direction, onset step and effect trace (fault − healthy) of one metric.

    Direction: ``nonfinite`` when the fault run turns NaN/inf and the twin does not; ``to_zero``
    when the fault run sits at exactly 0 from the onset while the twin does not (ppo_kl of a
    skipped update); else the sign of the mean effect after the onset when it exceeds twice its
    standard error over those steps (training metrics are noisy step to step), otherwise 0.
    Onset: the first step at which the twins differ (they are bit-identical before the fault)."""
    post_f, post_h = fault[onset:], healthy[onset:]
    if any(not _finite(x) for x in post_f) and all(_finite(x) for x in post_h):
        first = next(i for i, x in enumerate(fault) if not _finite(x))
        return {"direction": "nonfinite", "onset": first, "trace": None}
    eff = [(f - h) if _finite(f) and _finite(h) else float("nan") for f, h in zip(fault, healthy)]
    first = next((i for i, e in enumerate(eff) if _finite(e) and e != 0.0), None)
    if all(x == 0.0 for x in post_f) and any(_finite(x) and x != 0.0 for x in post_h):
        return {"direction": "to_zero", "onset": first, "trace": eff}
    post = [e for e in eff[onset:] if _finite(e)]
    if len(post) < 2:
        return {"direction": 0, "onset": first, "trace": eff}
    m = statistics.fmean(post)
    se = statistics.stdev(post) / math.sqrt(len(post))
    scale = statistics.fmean(abs(h) for h in healthy if _finite(h)) if any(_finite(h) for h in healthy) else 0.0
    significant = abs(m) > max(2 * se, 1e-3 * scale, 1e-12)
    direction = (1 if m > 0 else -1) if significant else 0
    return {"direction": direction, "onset": first, "trace": eff}


def pearson(a: list[float], b: list[float]) -> float:
    pairs = [(x, y) for x, y in zip(a, b) if _finite(x) and _finite(y)]
    if len(pairs) < 3:
        return float("nan")
    xs, ys = zip(*pairs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return float("nan")
    return sum((x - mx) * (y - my) for x, y in pairs) / (sx * sy)


def majority(values: list) -> object:
    return max(set(map(str, values)), key=[str(v) for v in values].count)


def build_proxies(model: Path, work: Path, keep_ratio: float, view_weights: str | None = "auto") -> dict[str, Path]:
    from moeproxy.proxy_builder import BuildRequest, build_proxy
    from moeproxy.reproduction.tasks import calibration_corpus

    out = {"original": model}
    texts = calibration_corpus(2048, seed=0)
    for method in ("three_view", "random"):
        d = work / f"proxy-{method}"
        if not (d / "config.json").exists():
            t = time.perf_counter()
            weights = view_weights if method == "three_view" else None
            build_proxy(
                BuildRequest(
                    model,
                    d,
                    keep_ratio=keep_ratio,
                    method=method,
                    calibration=texts,
                    seed=0,
                    overwrite=True,
                    view_weights=weights,
                )
            )
            print(f"built {method} proxy in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        out[method] = d
    return out


def device_plan(model: Path, keep_ratio: float) -> dict | None:
    try:
        from moeproxy.proxy_builder.plan import load_config_file, load_preset, plan
    except ImportError:
        return None
    out = {}
    try:
        out["this_model"] = plan(load_config_file(model / "config.json"), keep_ratio=keep_ratio).to_dict()["saving"]
    except Exception as exc:  # noqa: BLE001 - a planner that cannot size a toy model is reported, not fatal
        out["this_model"] = {"error": str(exc)}
    for preset in ("qwen3-30b-a3b", "deepseek-v3.2"):
        try:
            p = plan(load_preset(preset), keep_ratio=keep_ratio).to_dict()
            out[preset] = {"devices": [p["original"]["devices"], p["proxy"]["devices"]], **p["saving"]}
        except Exception as exc:  # noqa: BLE001
            out[preset] = {"error": str(exc)}
    return out


def _save_traces(work: Path, traces: dict) -> None:
    tmp = work / "traces.json.tmp"
    tmp.write_text(json.dumps({f"{m}|{c}|{s}": t for (m, c, s), t in traces.items()}, allow_nan=True))
    tmp.replace(work / "traces.json")


def run_all(models: dict[str, Path], seeds: list[int], steps: int, onset: int, config, work: Path) -> dict:
    from moeproxy.reproduction.backend import LocalTorchBackend, ModelSpec
    from moeproxy.reproduction.catalogue import at_onset
    from moeproxy.reproduction.faults import FaultSpec

    backend = LocalTorchBackend()
    traces: dict = {}
    costs: dict[str, list[dict]] = {m: [] for m in models}
    jobs = [("healthy", None, {})] + [(c, v, p) for c, (v, p, _) in CLASSES.items()]
    for cls, variant, params in jobs:
        for seed in seeds:
            for name, path in models.items():  # models interleaved: machine noise hits all alike
                spec = FaultSpec(cls, variant, at_onset(cls, variant, params, onset) if cls != "healthy" else {})
                t = time.perf_counter()
                trace, info = backend.run_one(ModelSpec(str(path)), spec, seed, steps, config=config)
                traces[(name, cls, seed)] = trace
                costs[name].append(info["cost"])
                _save_traces(work, traces)  # partial results survive an interrupted benchmark
                print(f"{cls:24s} seed {seed} {name:10s} {time.perf_counter() - t:6.1f} s", file=sys.stderr, flush=True)
    return {"traces": traces, "costs": costs, "describe": info["model"]}


def _pooled_direction(effs: list[dict], onset: int, healthy_scale: float) -> object:
    """One label per (model, metric) from all seeds: non-finite / to_zero when every seed says so
    (non-finite: a majority), else the 2-SE test on the seed-averaged effect trace."""
    labels = [e["direction"] for e in effs]
    if labels.count("nonfinite") * 2 > len(labels):
        return "nonfinite"
    if all(lbl == "to_zero" for lbl in labels):
        return "to_zero"
    traces = [e["trace"] for e in effs if e["trace"] is not None]
    if not traces:
        return "nonfinite"
    mean = [statistics.fmean(v) for v in zip(*traces) if all(_finite(x) for x in v)][onset:]
    if len(mean) < 2:
        return 0
    m, se = statistics.fmean(mean), statistics.stdev(mean) / math.sqrt(len(mean))
    return (1 if m > 0 else -1) if abs(m) > max(2 * se, 1e-3 * healthy_scale, 1e-12) else 0


def _agree(a: object, b: object, healthy_sign: int) -> bool:
    """Equal labels, or 'to_zero' against the sign a fall to zero has (−sign of the healthy level)."""
    if a == b:
        return True
    zero_as = -healthy_sign if healthy_sign else None
    return (a == "to_zero" and b == zero_as) or (b == "to_zero" and a == zero_as)


def analyse(res: dict, models: list[str], seeds: list[int], onset: int) -> dict:
    traces = res["traces"]
    rows = []
    for cls, (variant, _, keys) in CLASSES.items():
        if not all((m, cls, s) in traces for m in models for s in seeds):
            continue  # an interrupted benchmark: analyse what finished
        for metric in keys:
            row = {"class": cls, "variant": variant, "metric": metric}
            mean_eff: dict[str, list[float] | None] = {}
            h0 = [r["values"].get(metric, float("nan")) for s in seeds for r in traces[(models[0], "healthy", s)][onset:]]
            h0 = [x for x in h0 if _finite(x)]
            h_level = statistics.fmean(h0) if h0 else 0.0
            healthy_sign = (h_level > 0) - (h_level < 0)
            for m in models:
                effs = []
                scale = []
                for s in seeds:
                    f = [r["values"].get(metric, float("nan")) for r in traces[(m, cls, s)]]
                    h = [r["values"].get(metric, float("nan")) for r in traces[(m, "healthy", s)]]
                    effs.append(effect_of(f, h, onset))
                    scale += [abs(x) for x in h if _finite(x)]
                row[f"{m}_direction"] = _pooled_direction(effs, onset, statistics.fmean(scale) if scale else 0.0)
                row[f"{m}_directions"] = [e["direction"] for e in effs]
                ons = [e["onset"] for e in effs if e["onset"] is not None]
                row[f"{m}_onset"] = int(statistics.median(ons)) if ons else None
                tr = [e["trace"] for e in effs if e["trace"] is not None]
                mean_eff[m] = [statistics.fmean(v) if all(_finite(x) for x in v) else float("nan")
                               for v in zip(*tr)] if tr else None
            for m in models[1:]:
                row[f"{m}_direction_agrees"] = _agree(row[f"{models[0]}_direction"], row[f"{m}_direction"], healthy_sign)
                o0, om = row[f"{models[0]}_onset"], row[f"{m}_onset"]
                row[f"{m}_onset_within_2"] = (o0 is None and om is None) or (
                    o0 is not None and om is not None and abs(o0 - om) <= 2)
                a, b = mean_eff[models[0]], mean_eff[m]
                row[f"{m}_effect_corr"] = pearson(a[onset:], b[onset:]) if a and b else float("nan")
            rows.append(row)
    verdicts = consistency_verdicts(traces, models, seeds)
    summary = {}
    for m in models[1:]:
        n = max(1, len(rows))
        summary[m] = {
            "rows": len(rows),
            "direction_agreement": sum(r[f"{m}_direction_agrees"] for r in rows) / n,
            "onset_within_2": sum(r[f"{m}_onset_within_2"] for r in rows) / n,
            "effect_corr_median": _nanmedian([r[f"{m}_effect_corr"] for r in rows]),
        }
        if verdicts:
            vs = [v for k, seeds_v in verdicts.items() if k.endswith("/" + m) for v in seeds_v]
            summary[m]["consistency_verdicts"] = {v: vs.count(v) for v in sorted(set(vs))}
    return {"rows": rows, "summary": summary, "consistency": verdicts}


def _nanmedian(xs):
    ys = [x for x in xs if _finite(x)]
    return statistics.median(ys) if ys else float("nan")


def consistency_verdicts(traces, models, seeds) -> dict | None:
    try:
        from moeproxy.signatures.canonical import RunMetrics
        from moeproxy.signatures.consistency import consistency
    except ImportError:
        return None
    out: dict = {}
    for cls in CLASSES:
        if not all((m, cls, s) in traces for m in models for s in seeds):
            continue
        for m in models[1:]:
            vs = []
            for s in seeds:
                try:
                    a = RunMetrics.from_steps(traces[(models[0], cls, s)], framework="verl")
                    b = RunMetrics.from_steps(traces[(m, cls, s)], framework="verl")
                    vs.append(consistency(a, b).verdict)
                except Exception as exc:  # noqa: BLE001 - a library error is a finding, not a crash
                    vs.append(f"error: {exc}")
            out[f"{cls}/{m}"] = vs
    return out


def cost_summary(costs: dict[str, list[dict]]) -> dict:
    out = {}
    for m, cs in costs.items():
        out[m] = {
            "step_time_s_median": statistics.median(c["step_time_s_median"] for c in cs),
            "peak_memory_mb_median": statistics.median(c["peak_memory_mb"] for c in cs),
            "peak_memory_above_baseline_mb_median": statistics.median(c["peak_memory_above_baseline_mb"] for c in cs),
            "runs": len(cs),
        }
    base = out["original"]
    for m in out:
        out[m]["step_time_ratio"] = out[m]["step_time_s_median"] / base["step_time_s_median"]
        out[m]["memory_above_baseline_ratio"] = (
            out[m]["peak_memory_above_baseline_mb_median"] / base["peak_memory_above_baseline_mb_median"])
    return out


def memory_probe(models: dict[str, Path], config, steps: int = 3) -> dict:
    """Peak RSS of a few RL steps in a fresh process per model, minus its RSS before loading
    (in one long process freed pages stay mapped, which hides the difference)."""
    from moeproxy.reproduction.memory import rss_probe

    out = {name: rss_probe(path, config, steps) for name, path in models.items()}
    base = out["original"].get("run_mb")
    for name in out:
        if base and "run_mb" in out[name]:
            out[name]["run_mb_ratio"] = out[name]["run_mb"] / base
    return out


def parameter_counts(models: dict[str, Path]) -> dict[str, int]:
    from safetensors import safe_open

    out = {}
    for name, path in models.items():
        n = 0
        for f in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(f), "pt") as fh:
                for k in fh.keys():
                    shape = fh.get_slice(k).get_shape()
                    n += math.prod(shape)
        out[name] = n
    return out


def markdown(result: dict) -> str:
    models = result["models"]
    lines = ["| class (variant) | metric | " + " | ".join(f"{m} dir / onset" for m in models)
             + " | " + " | ".join(f"{m} corr" for m in models[1:]) + " |",
             "|---|---|" + "---|" * (len(models) + len(models) - 1)]
    for r in result["analysis"]["rows"]:
        cells = [f"{r[f'{models[0]}_direction']} / {r[f'{models[0]}_onset']}"] + [
            f"{r[f'{m}_direction']} / {r[f'{m}_onset']}" + ("" if r[f"{m}_direction_agrees"] else " ✗")
            for m in models[1:]]
        corr = [f"{r[f'{m}_effect_corr']:.2f}" for m in models[1:]]
        lines.append(f"| {r['class']} ({r['variant']}) | {r['metric']} | " + " | ".join(cells) + " | " + " | ".join(corr) + " |")
    return "\n".join(lines)


def reanalyse(work: Path, out: Path, args=None) -> int:
    if out.exists():
        result = json.loads(out.read_text())
    else:  # partial run: no result file yet
        result = {"models": ["original", "three_view", "random"], "partial": True,
                  "seeds": [int(x) for x in args.seeds.split(",")], "onset": args.onset, "steps": args.steps}
    raw = json.loads((work / "traces.json").read_text())
    traces = {}
    for key, trace in raw.items():
        m, c, sd = key.split("|")
        traces[(m, c, int(sd))] = trace
    result["analysis"] = analyse({"traces": traces}, result["models"], result["seeds"], result["onset"])
    out.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    print(markdown(result))
    print(json.dumps({"summary": result["analysis"]["summary"]}, indent=2))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--onset", type=int, default=10)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--keep-ratio", type=float, default=0.5)
    ap.add_argument("--view-weights", default="auto", choices=("auto", "equal"),
                    help="fusion weights of the three-view proxy: auto (KL-searched, as the builder's "
                    "--view-weights auto) or equal")
    ap.add_argument("--work", type=Path, default=Path("/tmp/moeproxy-transfer"))
    ap.add_argument("--engine", action="append", default=[], help="engine option key=value")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "transfer.json")
    ap.add_argument("--reanalyse", action="store_true",
                    help="recompute the analysis from WORK/traces.json and the existing --out file, no runs")
    args = ap.parse_args(argv)
    if args.reanalyse:
        return reanalyse(args.work, args.out, args)

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from moeproxy.reproduction.config import EngineConfig

    config = EngineConfig().with_strings(dict(kv.partition("=")[::2] for kv in args.engine))
    seeds = [int(s) for s in args.seeds.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    models = build_proxies(args.model, args.work, args.keep_ratio,
                           None if args.view_weights == "equal" else args.view_weights)
    res = run_all(models, seeds, args.steps, args.onset, config, args.work)
    names = list(models)
    result = {
        "command": " ".join(["python", "benchmarks/transfer.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpu_count": os.cpu_count(), "threads": 1, "device": "cpu"},
        "model": str(args.model),
        "models": names,
        "seeds": seeds, "steps": args.steps, "onset": args.onset, "keep_ratio": args.keep_ratio,
        "engine": config.to_dict(),
        "parameters": parameter_counts(models),
        "analysis": analyse(res, names, seeds, args.onset),
        "cost": cost_summary(res["costs"]),
        "memory": memory_probe(models, config),
        "plan": device_plan(args.model, args.keep_ratio),
        "wall_time_s": time.perf_counter() - t0,
    }
    p = result["parameters"]
    result["parameter_ratio"] = {m: p[m] / p["original"] for m in names}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")
    print(markdown(result))
    print(json.dumps({"summary": result["analysis"]["summary"], "cost": result["cost"], "memory": result["memory"],
                      "parameter_ratio": result["parameter_ratio"], "plan": result["plan"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
