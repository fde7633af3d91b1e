"""Proxy-fidelity ablation (issue 5): every builder method at 50% and 25% of the routed experts, on
both reference models, scored by the fidelity harness on held-out tasks.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fidelity.py [--models qwen3-moe-64e,deepseek-v3-64e]
        [--prompts-per-task 500] [--random-seeds 0,1,2] [--out benchmarks/results/fidelity.json]

For each model the original is evaluated once; routing statistics are collected once (the first
build) and reused by every method except the auto-weighted three-view one, whose weight search needs
the model and calibration data.  The result file is rewritten after every row, so a long run that is
stopped keeps what it finished.

Statistics: a Wilson 95% interval on each mean accuracy (all prompts pooled: the tasks have equal
counts), an exact McNemar test (two-sided binomial on the discordant prompts) of every method
against the auto-weighted three-view proxy, and Spearman correlations across all proxies between
accuracy and the routing/KL measures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "fidelity.json"

# (row name, builder method, view_weights); random is expanded over seeds.
METHOD_ROWS: list[tuple[str, str, Any]] = [
    ("three_view_auto", "three_view", "auto"),
    ("three_view", "three_view", None),
    ("three_view_unweighted", "three_view_unweighted", None),
    ("router_coact", "router_coact", None),
    ("router_proto", "router_proto", None),
    ("coact_proto", "coact_proto", None),
    ("router", "router", None),
    ("coact", "coact", None),
    ("proto", "proto", None),
    ("frequency", "frequency", None),
    ("random", "random", None),
    ("first_k", "first_k", None),
]
FRACTIONS = (0.5, 0.25)


def mcnemar_p(a: list[float], b: list[float]) -> float:
    """Exact two-sided McNemar p-value of paired 0/1 outcomes."""
    from scipy.stats import binomtest

    only_a = sum(1 for x, y in zip(a, b) if x > y)
    only_b = sum(1 for x, y in zip(a, b) if y > x)
    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def _row(name: str, keep: int, seed: int | None, report: dict[str, Any], correct: list[float],
         build_report: dict[str, Any], build_s: float) -> dict[str, Any]:
    from moeproxy.reproduction.fidelity import wilson_interval

    k, n = int(sum(correct)), len(correct)
    return {
        "method": name,
        "keep": keep,
        "seed": seed,
        "mean_accuracy": report["proxy"]["mean_accuracy"],
        "mean_accuracy_ci95": list(wilson_interval(k, n)),
        "accuracy": report["proxy"]["accuracy"],
        "retention": report["retention"],
        "kl": report["kl"],
        "kl_answer": report["kl_answer"],
        "routing_coverage": report["routing_coverage"],
        "routing_agreement": report["routing_agreement"],
        "hidden_cosine_mean": report["hidden_cosine_mean"],
        "hidden_cosine_last": report["hidden_cosine_per_layer"][-1],
        "expert_entropy_proxy": report["expert_utilisation_entropy"]["proxy_mean"],
        "parameter_ratio": report["parameter_ratio"],
        "memory_ratio": report.get("memory_ratio"),
        "view_weights": build_report.get("view_weights"),
        "routing_mass_kept": statistics.fmean(
            v["routing_mass_kept"] for v in build_report["layers"].values() if v.get("routing_mass_kept") is not None
        ) if any(v.get("routing_mass_kept") is not None for v in build_report["layers"].values()) else None,
        "build_s": round(build_s, 2),
        "correct": correct,
    }


def _build(build_proxy, path, out, keep, method, weights, seed, stats, calibration, args):
    from moeproxy.proxy_builder.build import BuildRequest

    return build_proxy(
        BuildRequest(
            path,
            out,
            keep=keep,
            method=method,
            view_weights=weights,
            seed=seed or 0,
            calibration=None if stats is not None else calibration,
            max_tokens=args.max_tokens,
            seq_len=64,
            batch_size=32,
        ),
        statistics=stats,
    )


def run_model(name: str, args, results: dict[str, Any], save) -> None:
    import torch
    from moeproxy.proxy_builder.build import build_proxy
    from moeproxy.proxy_builder.errors import InvalidPruneRequest
    from moeproxy.reproduction.fidelity import (
        EvalSettings,
        compare,
        evaluate_model,
        load_tokenizer,
        measure_peak_memory_mb,
        throughput_sample,
    )
    from moeproxy.reproduction.reference import reference_model_path
    from moeproxy.reproduction.tasks import calibration_corpus, format_prompt

    torch.set_num_threads(1)
    path = Path(name) if Path(name).is_dir() else reference_model_path(name)
    config = json.loads((path / "config.json").read_text())
    n_experts = config.get("n_routed_experts") or config.get("num_experts") or config["num_local_experts"]
    settings = EvalSettings(prompts_per_task=args.prompts_per_task, kl_texts_per_task=args.kl_texts_per_task,
                            measure_cost=False)
    tok = load_tokenizer(path)
    t = time.perf_counter()
    original = evaluate_model(path, settings, tok)
    sample = [format_prompt(e) for e in throughput_sample(settings)]
    orig_mem = measure_peak_memory_mb(path, sample)
    entry = results["models"].setdefault(name, {})
    entry.update({
        "path": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "arch": config["model_type"],
        "num_experts": n_experts,
        "top_k": config["num_experts_per_tok"],
        "original": {**original.summary(), "peak_memory_mb": orig_mem, "correct": original.correct},
        "original_eval_s": round(time.perf_counter() - t, 1),
        "rows": entry.get("rows", []),
    })
    print(f"[{name}] original mean accuracy {entry['original']['mean_accuracy']:.3f}", flush=True)
    save()
    calibration = calibration_corpus(args.calibration_texts, seed=0)
    stats = None
    done = {(r["method"], r["keep"], r["seed"]) for r in entry["rows"]}
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for fraction in FRACTIONS:
            keep = int(n_experts * fraction)
            for row_name, method, weights in METHOD_ROWS:
                seeds = args.random_seeds if method == "random" else [None]
                for seed in seeds:
                    if (row_name, keep, seed) in done:
                        continue
                    out = Path(tmp) / f"{row_name}-{keep}-{seed}"
                    t = time.perf_counter()
                    use_stats = stats if weights != "auto" else None
                    try:
                        built = _build(build_proxy, path, out, keep, method, weights, seed, use_stats,
                                       calibration, args)
                    except InvalidPruneRequest as exc:
                        print(f"[{name}] keep {keep} {row_name}: not possible: {exc}", flush=True)
                        continue
                    build_s = time.perf_counter() - t
                    if stats is None and built.statistics:
                        stats = built.statistics
                    proxy = evaluate_model(out, settings, tok)
                    report = compare(original, proxy, out)
                    if row_name == "three_view":
                        mem = measure_peak_memory_mb(out, sample)
                        report["memory_ratio"] = mem / orig_mem if orig_mem > 0 else None
                    row = _row(row_name, keep, seed, report, proxy.correct, built.report, build_s)
                    entry["rows"].append(row)
                    print(f"[{name}] keep {keep:3d} {row_name:22} seed {seed!s:4} acc {row['mean_accuracy']:.3f} "
                          f"ret {row['retention']:.3f} KL {row['kl']:.4f} cov {row['routing_coverage']:.3f} "
                          f"agr {row['routing_agreement']:.3f}", flush=True)
                    save()


def analyse(entry: dict[str, Any]) -> dict[str, Any]:
    """Per keep: method table (random averaged), McNemar vs three_view_auto, Spearman correlations."""
    from scipy.stats import spearmanr

    out: dict[str, Any] = {}
    for keep in sorted({r["keep"] for r in entry["rows"]}, reverse=True):
        rows = [r for r in entry["rows"] if r["keep"] == keep]
        ref = next((r for r in rows if r["method"] == "three_view_auto"), None)
        table = {}
        for method in dict.fromkeys(r["method"] for r in rows):
            group = [r for r in rows if r["method"] == method]
            acc = [r["mean_accuracy"] for r in group]
            cell = {k: statistics.fmean(r[k] for r in group) for k in (
                "mean_accuracy", "retention", "kl", "kl_answer", "routing_coverage", "routing_agreement",
                "hidden_cosine_mean", "expert_entropy_proxy")}
            cell["n_seeds"] = len(group)
            cell["mean_accuracy_sd"] = statistics.stdev(acc) if len(acc) > 1 else 0.0
            cell["mean_accuracy_ci95"] = group[0]["mean_accuracy_ci95"] if len(group) == 1 else None
            if ref is not None and method != "three_view_auto":
                cell["mcnemar_p_vs_three_view_auto"] = [mcnemar_p(ref["correct"], r["correct"]) for r in group]
            cell["accuracy"] = {t: statistics.fmean(r["accuracy"][t] for r in group) for t in group[0]["accuracy"]}
            table[method] = cell
        corr = {}
        for key in ("routing_coverage", "routing_agreement", "kl", "hidden_cosine_mean"):
            rho, p = spearmanr([r[key] for r in rows], [r["mean_accuracy"] for r in rows])
            corr[key] = {"rho": float(rho), "p": float(p)}
        out[str(keep)] = {"methods": table, "spearman_vs_accuracy": corr,
                          "memory_ratio_three_view": next((r["memory_ratio"] for r in rows
                                                           if r["method"] == "three_view"), None),
                          "parameter_ratio": rows[0]["parameter_ratio"]}
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = []
    for name, entry in results["models"].items():
        if "analysis" not in entry:
            continue
        o = entry["original"]
        lines.append(f"**{name}** ({entry['arch']}, {entry['num_experts']} routed experts, top-{entry['top_k']}): "
                     f"original mean accuracy {o['mean_accuracy']:.3f}\n")
        for keep, a in entry["analysis"].items():
            lines.append(f"Keep {keep} of {entry['num_experts']} (parameters x{a['parameter_ratio']:.3f}, measured "
                         f"peak memory x{(a['memory_ratio_three_view'] or float('nan')):.3f}):\n")
            lines.append("| method | mean acc | retention | KL | KL answer | coverage | agreement | hidden cos "
                         "| p vs auto |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for method, c in a["methods"].items():
                acc = f"{c['mean_accuracy']:.3f}"
                if c["n_seeds"] > 1:
                    acc += f" ± {c['mean_accuracy_sd']:.3f} ({c['n_seeds']} seeds)"
                ps = c.get("mcnemar_p_vs_three_view_auto")
                p = "—" if ps is None else ", ".join(f"{x:.2g}" for x in ps)
                lines.append(f"| {method} | {acc} | {c['retention']:.3f} | {c['kl']:.4f} | {c['kl_answer']:.4f} | "
                             f"{c['routing_coverage']:.3f} | {c['routing_agreement']:.3f} | "
                             f"{c['hidden_cosine_mean']:.3f} | {p} |")
            corr = ", ".join(f"{k} ρ={v['rho']:.2f}" for k, v in a["spearman_vs_accuracy"].items())
            lines.append(f"\nSpearman correlation with accuracy over all proxies: {corr}\n")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3-moe-64e,deepseek-v3-64e")
    parser.add_argument("--prompts-per-task", type=int, default=500)
    parser.add_argument("--kl-texts-per-task", type=int, default=100)
    parser.add_argument("--random-seeds", default="0,1,2")
    parser.add_argument("--calibration-texts", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--resume", action="store_true", help="keep finished rows of an earlier --out file")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="merge these result files into --out and print the table (no evaluation)")
    args = parser.parse_args()
    if args.merge:
        merged: dict[str, Any] = {"models": {}}
        for path in args.merge:
            part = json.loads(path.read_text())
            merged.update({k: v for k, v in part.items() if k != "models"})
            merged["models"].update(part["models"])
        args.out.write_text(json.dumps(merged, indent=1) + "\n")
        print(markdown(merged))
        return 0
    args.random_seeds = [int(s) for s in args.random_seeds.split(",")]
    results: dict[str, Any] = {"models": {}}
    if args.resume and args.out.exists():
        results = json.loads(args.out.read_text())
    results.update({
        "command": " ".join(["python", "benchmarks/fidelity.py", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, 2 cores shared, CPU only, torch threads 1",
        "prompts_per_task": args.prompts_per_task,
        "kl_texts_per_task": args.kl_texts_per_task,
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        for entry in results["models"].values():
            if entry.get("rows"):
                entry["analysis"] = analyse(entry)
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    for name in args.models.split(","):
        run_model(name, args, results, save)
    save()
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
