"""One full-size closed-loop job on a reference model (issue 18, done when 3): wall time and
device-hours of the job's work (``service.loop.pipeline.run_loop``: the proxy, every variant of the
candidate classes at the campaign-v2 length, batch and seeds, the layer), and the planner's
device counts for the same loop on the original — for the reference itself and, since a 3M-parameter
reference fits one device either way, for a production-size preset at the same keep ratio.

Device-hours here are CPU core-hours: each reproduction runs in one one-thread process
(``ProcessPoolBackend``), so a reproduction's seconds are one core's. The original-model figure is
the planner's device count times the same reproduction seconds: an assumption (the step time on
the original's devices is not measured), said so in the results.

Resumable (the job's campaign is; a finished layer is reused):

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/loop_full.py --work runs/loop-full

Writes ``benchmarks/results/loop_full.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "loop_full.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default="qwen3-moe-64e-rl")
    ap.add_argument("--classes", default="stale_weight_sync,rollout_logp_precision",
                    help="the candidates (a sibling pair the engine confuses, as a weak match names them)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--keep-ratio", type=float, default=0.75)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="the production-size model of the planner's figure")
    ap.add_argument("--work", default=str(ROOT / "runs" / "loop-full"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    from diagnosis import campaign_batch, engine_config
    from moeproxy.proxy_builder.plan import load_preset, plan
    from moeproxy.reproduction.campaign import ProcessPoolBackend
    from moeproxy.reproduction.reference import reference_model_path
    from moeproxy.service.loop.pipeline import LoopSpec, run_loop
    from moeproxy.signatures.fingerprint import load_library

    model = reference_model_path(args.reference)
    engine = engine_config(args.reference, campaign_batch(), threads=1).to_dict()
    spec = LoopSpec(model, tuple(args.classes.split(",")), steps=args.steps,
                    seeds=tuple(int(s) for s in args.seeds.split(",")), keep_ratio=args.keep_ratio, engine=engine)
    t0 = time.perf_counter()
    outcome = run_loop(spec, Path(args.work), load_library(), job_id="bench",
                       backend=ProcessPoolBackend(args.workers, threads=1), accelerators_per_job=1.0,
                       on_progress=lambda p: print(json.dumps(p), flush=True))
    wall = time.perf_counter() - t0
    production = plan(load_preset(args.preset), keep_ratio=args.keep_ratio)
    cost = dict(outcome.cost)
    reproduction_h = float(cost["reproduction_s"]) / 3600
    report = {
        "reference": args.reference, "classes": list(spec.classes), "steps": spec.steps, "seeds": list(spec.seeds),
        "keep_ratio": spec.keep_ratio, "engine": engine, "workers": args.workers,
        "wall_time_s": round(wall, 1),  # this call: less than the job's when the campaign resumed
        "job": cost,  # the job's own record: wall time of the run that wrote the layer, reproduction seconds
        "layer": {"version": outcome.version, "fingerprints": outcome.fingerprints,
                  "strong_threshold": outcome.strong_threshold, "path": str(outcome.layer_dir)},
        "device_hours": {"measured_core_hours": round(reproduction_h, 3)},
        "planner": {
            "reference": cost.get("planner_devices"),
            args.preset: {"original_devices": production.original.devices, "proxy_devices": production.proxy.devices,
                          "saving": production.saving,
                          "device_hours_if_step_time_equal": {
                              "original": round(reproduction_h * production.original.devices, 2),
                              "proxy": round(reproduction_h * production.proxy.devices, 2)}},
        },
        "assumption": "device-hours on the preset scale the measured reproduction seconds by the planner's "
                      "device counts; the step time on those devices is not measured",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
