"""Diagnosis benchmark v1: a proxy-built fingerprint library diagnosing runs of the ORIGINAL model.
Kept to reproduce the v1 figures of docs/benchmarks.md ("diagnosis"); the four-set benchmark of
issue 17 is benchmarks/diagnosis.py.

Stages (each skips work already on disk, so the script can be re-run after an interruption):

1. ``original``: the original MoE model. ``--original DIR`` uses an existing checkpoint; without it
   the stand-in is built: the warmed tiny Qwen3-MoE of the reproduction tests
   (tests/reproduction/repro_models.warm_tiny, seed 0, 300 SFT steps; 8 routed experts, top-2).
2. ``proxy``: ``moeproxy build --keep-ratio 0.5`` (three-view clustering, synthetic task calibration).
3. ``library``: ``moeproxy fingerprints generate`` on the proxy with signatures/library/campaign.json
   (library seeds and calibration seeds run on the proxy only).
4. ``heldout``: the original model runs every campaign fault with seeds, an onset and magnitudes
   not used for the library (``moeproxy reproduce``), plus healthy runs.
5. ``evaluate``: triage of every held-out original run against the library: top-1 / top-3 per
   class, confusion matrix, healthy false alarms, leave-one-class-out weak rate, latency.
   Writes benchmarks/results/diagnosis.json.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/diagnosis_v1.py --work runs/diagnosis \
        --library signatures/library
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELDOUT_SEEDS = (200, 201, 202)
HELDOUT_ONSET = 14  # the library runs use onset 10 (signatures/library/campaign.json)
HELDOUT_MAGNITUDE_FACTOR = 1.5  # where a variant takes a magnitude


def moeproxy(*args: str) -> None:
    cmd = [sys.executable, "-c", "from moeproxy.cli import main; main()", *args]
    print("$ moeproxy " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def stage_original(work: Path, given: str | None) -> Path:
    if given:
        return Path(given)
    out = work / "original"
    if not (out / "config.json").exists():
        sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "reproduction")]
        from repro_models import warm_tiny

        warm_tiny(out, seed=0, sft_steps=300)
    return out


def stage_proxy(work: Path, original: Path) -> Path:
    out = work / "proxy"
    if not (out / "proxy_report.json").exists():
        moeproxy("build", "--model", str(original), "--out", str(out), "--keep-ratio", "0.5",
                 "--calibration", "synthetic:tasks", "--max-tokens", "4096", "--overwrite")
    return out


def stage_library(work: Path, proxy: Path, library: Path, campaign: Path) -> None:
    moeproxy("fingerprints", "generate", "--model", str(proxy), "--out", str(library),
             "--work", str(work / "campaign"), "--campaign", str(campaign))


def heldout_jobs(campaign: Path, onset: int = HELDOUT_ONSET) -> list[tuple[str, dict]]:
    from moeproxy.reproduction.catalogue import FAULT_CLASSES, at_onset
    from moeproxy.reproduction.faults import injector_class

    jobs, seen = [], set()
    for job in json.loads(campaign.read_text())["jobs"]:
        cls, params = job["fault_class"], dict(job.get("params") or {})
        if cls == "healthy":
            continue
        variant = params.pop("variant", FAULT_CLASSES[cls].variants[0])
        # One held-out job per class and variant: the library may hold several magnitudes of it,
        # the held-out runs use their own (the default × HELDOUT_MAGNITUDE_FACTOR).
        if (cls, variant) in seen:
            continue
        seen.add((cls, variant))
        params.pop("magnitude", None)
        params = at_onset(cls, variant, params, onset)
        defaults = injector_class(cls, variant).defaults
        if isinstance(defaults.get("magnitude"), int | float):
            params["magnitude"] = defaults["magnitude"] * HELDOUT_MAGNITUDE_FACTOR
        jobs.append((cls, {"variant": variant, **params}))
    return jobs


def stage_heldout(work: Path, original: Path, campaign: Path, steps: int, seeds: tuple[int, ...],
                  name: str, onset: int = HELDOUT_ONSET) -> Path:
    base = work / name
    seeds = ",".join(map(str, seeds))
    todo = [("healthy", {})] + heldout_jobs(campaign, onset)
    for cls, params in todo:
        d = base / cls
        if (d / "manifest.json").exists():
            continue
        p = dict(params)
        variant = p.pop("variant", None)
        args = ["reproduce", "--model", str(original), "--fault", cls, "--steps", str(steps), "--seeds", seeds,
                "--no-healthy", "--quiet", "--out", str(d)]
        if variant:
            args += ["--variant", variant]
        for k, v in p.items():
            args += ["--param", f"{k}={v}"]
        moeproxy(*args)
    return base


def stage_evaluate(base: Path, library_path: Path, out: Path, original: Path, seeds: tuple[int, ...],
                   onset: int = HELDOUT_ONSET) -> dict:
    from moeproxy.signatures import dtw
    from moeproxy.signatures.build import load_trace_dir
    from moeproxy.signatures.canonical import canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.fingerprint import load_library
    from moeproxy.signatures.matching import triage

    dtw.warm()
    lib = load_library(library_path)
    classes = list(lib.fault_classes)
    runs = []
    for d in sorted(base.iterdir()):
        if not (d / "manifest.json").exists():
            print(f"skipping {d}: no manifest (run not finished)")
            continue
        ts = load_trace_dir(d)
        runs += [(ts.fault_class, seed, r) for seed, r in sorted(ts.fault_runs.items())]
    confusion: dict[str, dict[str, int]] = {c: {} for c in classes}
    per_class: dict[str, dict[str, int]] = {}
    latencies, rows = [], []
    healthy_false_alarms = healthy_runs = 0
    loco_weak = loco_total = 0
    for cls, seed, run in runs:
        t = time.perf_counter()
        sig = run_signature(canonicalise(run), lib.params)
        res = triage(sig, lib)
        latencies.append(time.perf_counter() - t)
        ranked = [c.fault_class for c in res.candidates]
        top = res.candidates[0]
        stats = per_class.setdefault(cls, {"runs": 0, "top1": 0, "top3": 0})
        stats["runs"] += 1
        stats["top1"] += ranked[0] == cls
        stats["top3"] += cls in ranked[:3]
        confusion.setdefault(cls, {})
        confusion[cls][ranked[0]] = confusion[cls].get(ranked[0], 0) + 1
        row = {"class": cls, "seed": seed, "top": ranked[:3], "top_score": round(top.score, 3),
               "top_strength": top.strength, "verdict": res.verdict}
        if cls == "healthy":
            healthy_runs += 1
            alarm = top.fault_class != "healthy" and top.strength == "strong"
            healthy_false_alarms += alarm
        elif cls in classes:
            loo = triage(sig, lib.without_class(cls))
            weak = loo.candidates[0].strength == "weak"
            loco_weak += weak
            loco_total += 1
            row["left_out_top"] = [loo.candidates[0].fault_class, round(loo.candidates[0].score, 3),
                                   loo.candidates[0].strength]
        rows.append(row)
    n = len(runs)
    figures = {
        "library": str(library_path),
        "fingerprints": len(lib.fingerprints),
        "strong_threshold": lib.calibration.strong_threshold,
        "heldout_runs": n,
        "top1": sum(s["top1"] for s in per_class.values()) / n,
        "top3": sum(s["top3"] for s in per_class.values()) / n,
        "per_class": per_class,
        "confusion": confusion,
        # Ranked first AND reported strong: what a user gets as a confident answer.
        "correct_strong": sum(r["top"][0] == r["class"] and r["top_strength"] == "strong" for r in rows) / n,
        "healthy_runs": healthy_runs,
        "healthy_false_alarms": healthy_false_alarms,
        "loco_weak_rate": loco_weak / loco_total if loco_total else None,
        "loco_runs": loco_total,
        "triage_latency_median_s": statistics.median(latencies),
        "rows": rows,
        "heldout": {"original": str(original), "seeds": list(seeds), "onset": onset,
                    "magnitude_factor": HELDOUT_MAGNITUDE_FACTOR, "traces": str(base)},
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"top-1 {figures['top1']:.0%} (strong {figures['correct_strong']:.0%})  top-3 {figures['top3']:.0%}  healthy false alarms "
          f"{healthy_false_alarms}/{healthy_runs}  LOCO weak {figures['loco_weak_rate']}")
    for c, s in per_class.items():
        print(f"  {c:<24} top-1 {s['top1']}/{s['runs']}  top-3 {s['top3']}/{s['runs']}  -> {confusion.get(c)}")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="runs/diagnosis")
    ap.add_argument("--original", default=None)
    ap.add_argument("--library", default=str(ROOT / "signatures" / "library"))
    ap.add_argument("--campaign", default=str(ROOT / "signatures" / "library" / "campaign.json"))
    ap.add_argument("--steps", type=int, default=None, help="held-out run length (default: the campaign's)")
    ap.add_argument("--stages", default="original,proxy,library,heldout,evaluate")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "diagnosis.json"))
    ap.add_argument("--heldout-seeds", default=",".join(map(str, HELDOUT_SEEDS)))
    ap.add_argument("--heldout-onset", type=int, default=HELDOUT_ONSET,
                    help="fault onset of the held-out runs (the library's runs use the campaign's)")
    ap.add_argument("--heldout-dir", default="heldout-original",
                    help="folder under --work for the held-out runs (one per original model)")
    args = ap.parse_args()
    seeds = tuple(int(s) for s in args.heldout_seeds.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    stages = set(args.stages.split(","))
    campaign = Path(args.campaign)
    steps = args.steps or json.loads(campaign.read_text()).get("steps", 24)
    original = stage_original(work, args.original)
    if "proxy" in stages or "library" in stages:
        proxy = stage_proxy(work, original)
    if "library" in stages:
        stage_library(work, proxy, Path(args.library), campaign)
    if "heldout" in stages or "evaluate" in stages:
        base = (stage_heldout(work, original, campaign, steps, seeds, args.heldout_dir,
                                     args.heldout_onset) if "heldout" in stages
                else work / args.heldout_dir)
    if "evaluate" in stages:
        stage_evaluate(base, Path(args.library), Path(args.out), original, seeds, args.heldout_onset)


if __name__ == "__main__":
    main()
