"""Triage latency: a 2,000-step run with 12 metrics against a library of 100 fingerprints, and
against the shipped library.

Target (issues 7 and 17): <= 0.5 s warm on this machine. The run and the 100-fingerprint library are
synthetic (moeproxy.signatures.synthetic: traces with known answers, not proxy runs) because only
their size matters here. Reports the median of repeats of the whole call (canonicalise, per-metric
signatures, whole-run findings, scoring every fingerprint, evidence, sibling notes) and its two
halves, plus the one-off cold start (tslearn's DTW compilation) measured separately. The same run
is then triaged against ``--library`` (default: the shipped ``signatures/library``, whose
fingerprints were built from the engine's full view and compare every metric it logs), side by
side in the same process.

    OMP_NUM_THREADS=1 python benchmarks/triage_latency.py [--repeats 15] [--library PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

METRICS_12 = (
    "critic/score/mean", "actor/kl_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/pg_loss",
    "actor/pg_clipfrac", "response_length/mean", "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max", "rollout_corr/kl", "moe/routing_agreement",
)


def build_library(n_target: int = 100):
    from moeproxy.signatures.build import build_fingerprint
    from moeproxy.signatures.fingerprint import FingerprintLibrary
    from moeproxy.signatures.synthetic import INJECTORS, synthetic_run

    twins = [synthetic_run("healthy", steps=60, seed=s, metrics=METRICS_12) for s in (0, 1)]
    fps = [build_fingerprint("healthy", twins, provenance={"source": "synthetic"})]
    for c in INJECTORS:
        for onset in (10, 20, 30):
            for mag in (0.7, 1.0, 1.5):
                if len(fps) >= n_target:
                    break
                runs = [synthetic_run(c, steps=60, onset=onset, magnitude=mag, seed=s, metrics=METRICS_12)
                        for s in (0, 1)]
                fps.append(build_fingerprint(c, runs, twins, params={"onset": onset, "magnitude": mag},
                                             provenance={"source": "synthetic"}))
    while len(fps) < n_target:  # top up with healthy variants (different seeds)
        k = len(fps)
        runs = [synthetic_run("healthy", steps=60, seed=1000 + k + s, metrics=METRICS_12) for s in (0, 1)]
        fps.append(build_fingerprint("healthy", runs, params={"seed_block": k}, provenance={"source": "synthetic"}))
    return FingerprintLibrary(tuple(fps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/triage_latency.json")
    ap.add_argument("--library", default=str(Path(__file__).resolve().parents[1] / "signatures" / "library"),
                    help="a library to triage the same run against beside the synthetic one ('' for none)")
    args = ap.parse_args()

    from moeproxy.signatures import dtw
    from moeproxy.signatures.canonical import canonicalise
    from moeproxy.signatures.features import run_signature
    from moeproxy.signatures.matching import triage
    from moeproxy.signatures.synthetic import synthetic_run

    t0 = time.perf_counter()
    dtw.warm()
    cold_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    library = build_library(100)
    build_s = time.perf_counter() - t0
    run = synthetic_run("stale_weight_sync", steps=2000, onset=1200, seed=77, metrics=METRICS_12)
    assert len(run.series) == 12 and len(library.fingerprints) == 100

    from moeproxy.signatures.fingerprint import load_library

    shipped = load_library(args.library) if args.library else None
    triage(run, library)  # first call: imports, caches
    if shipped is not None:
        triage(run, shipped)
    total, sig_only, match_only, shipped_total = [], [], [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        result = triage(run, library)
        total.append(time.perf_counter() - t)
        t = time.perf_counter()
        sig = run_signature(canonicalise(run), library.params)
        sig_only.append(time.perf_counter() - t)
        t = time.perf_counter()
        triage(sig, library)
        match_only.append(time.perf_counter() - t)
        if shipped is not None:  # interleaved with the synthetic library's calls: same load
            t = time.perf_counter()
            shipped_result = triage(run, shipped)
            shipped_total.append(time.perf_counter() - t)

    figures = {
        "run_steps": 2000,
        "run_metrics": 12,
        "fingerprints": len(library.fingerprints),
        "repeats": args.repeats,
        "triage_median_s": statistics.median(total),
        "triage_min_s": min(total),
        "triage_max_s": max(total),
        "signature_median_s": statistics.median(sig_only),
        "matching_median_s": statistics.median(match_only),
        "dtw_cold_start_s": cold_s,
        "library_build_s": build_s,
        "target_s": 0.5,
        "top_candidate": result.candidates[0].fault_class,
        **({"library": args.library, "library_fingerprints": len(shipped.fingerprints),
            "library_triage_median_s": statistics.median(shipped_total),
            "library_triage_min_s": min(shipped_total), "library_triage_max_s": max(shipped_total),
            "library_top_candidate": shipped_result.candidates[0].fault_class} if shipped is not None else {}),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
    }
    for k, v in figures.items():
        print(f"{k:>22}: {v:.4f}" if isinstance(v, float) else f"{k:>22}: {v}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
