"""Campaign v2 (issue 20): every fault variant on the Qwen3-MoE RL proxy, sized from a measured step
cost, run resumably through ``moeproxy.reproduction.campaign.run_campaign``.

Stages (each reuses what is on disk, so the script can be stopped at any time and started again):

1. ``proxy``: the Qwen3-MoE RL starting point (``qwen3-moe-64e-rl``) pruned to ``--keep-ratio`` of
   its experts (default 0.75: 48 of 64; three-view clustering, synthetic task calibration). At 0.5
   the proxy of this starting point answers nothing (accuracy and format reward 0 on every rollout,
   every GRPO group tied), so a healthy run cannot learn; the measure stage refuses such a proxy.
2. ``measure``: a short healthy run on the proxy at each batch of :data:`BATCHES` (largest first);
   the first whose whole campaign fits ``--budget-h`` CPU-hours is kept (the issue: shrink the
   batch, then the seeds, before dropping variants or onset 0). Written to ``OUT/sizing.json``.
3. ``run``: the default campaign v2 (``default_campaign``) at that batch, into ``--work``.
4. ``library`` (not in the default stages): the shipped library rebuilt from the finished campaign
   (``moeproxy fingerprints generate`` on the same campaign, written to ``--library``); its manifest
   names ``benchmarks/results/campaign-v2/manifest.json`` and its SHA-256.

    OMP_NUM_THREADS=2 nice -n 10 python benchmarks/campaign_v2.py --work runs/campaign-v2

The campaign manifest (every job: seed, onset, wall time, the trace's SHA-256) is copied to
``benchmarks/results/campaign-v2/manifest.json`` after each job, and each finished trace, gzipped, to
``benchmarks/results/campaign-v2/traces/`` (committed: the diagnosis benchmark reads them there). The
work directory is scratch: when it is lost, the proxy is rebuilt (its weights hash must equal the
manifest's, or the campaign stops rather than mix two proxies), and the committed traces are put back
(each checked against its hash), so only unfinished jobs run again.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "campaign-v2"
REFERENCE = "qwen3-moe-64e-rl"

#: (prompts per step, samples per prompt, mini-batches); the largest is the 200-step runs' batch.
BATCHES: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (8, 8, 4), (8, 4, 2), (4, 4, 2))
MEASURE_STEPS = 6
#: A proxy whose healthy rollouts score below this on average gives GRPO (almost) no signal.
MIN_SCORE = 0.05


def stage_proxy(work: Path, keep_ratio: float) -> Path:
    out = work / f"proxy-keep{keep_ratio:g}"  # one directory per ratio: a campaign never mixes two proxies
    if not (out / "proxy_report.json").exists():
        from moeproxy.reproduction.reference import reference_model_path

        cmd = [sys.executable, "-c", "from moeproxy.cli import main; main()", "build",
               "--model", str(reference_model_path(REFERENCE)), "--out", str(out), "--keep-ratio", str(keep_ratio),
               "--calibration", "synthetic:tasks", "--view-weights", "auto", "--overwrite", "--quiet"]
        print("$ " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "proxy_report.json", RESULTS / "proxy_report.json")
    return out


def engine_for(batch: tuple[int, int, int], threads: int) -> dict:
    from moeproxy.reproduction.reference import rl_engine_defaults

    prompts, group, minis = batch
    return {**rl_engine_defaults(REFERENCE), "prompts_per_step": prompts, "group_size": group,
            "ppo_mini_batch_size": prompts // minis, "threads": threads}


def _measured(path: Path, weights: str | None) -> dict | None:
    """A sizing measured on this very proxy (same weights hash), or None."""
    if not path.exists():
        return None
    sizing = json.loads(path.read_text())
    return sizing if sizing.get("proxy_weights_sha256") == weights else None


def stage_measure(proxy: Path, work: Path, budget_h: float, threads: int, steps: int) -> dict:
    from moeproxy.reproduction.campaign import JobInput, weights_hash, default_campaign, run_job
    from moeproxy.reproduction.config import EngineConfig

    weights = weights_hash(proxy)
    sizing_file = work / "sizing.json"
    sizing = _measured(sizing_file, weights) or _measured(RESULTS / "sizing.json", weights)
    if sizing is not None:  # measured once on this proxy; a new work directory keeps it
        sizing_file.write_text(json.dumps(sizing, indent=1) + "\n")
        return sizing

    jobs = default_campaign(steps=steps).jobs()
    total_steps = sum(j.steps for j in jobs)
    tried = []
    chosen = None
    for batch in BATCHES:
        engine = EngineConfig(**engine_for(batch, threads)).to_dict()
        t0 = time.perf_counter()
        out = run_job(JobInput(str(proxy), engine, {"class": "healthy", "variant": "none", "params": {}}, 0,
                               MEASURE_STEPS))
        step_times = [r["values"]["timing_s/step"] for r in out.trace[1:]]  # the first step warms up
        cost = statistics.median(step_times)
        score = statistics.fmean(r["values"]["critic/score/mean"] for r in out.trace)
        projected_h = total_steps * cost / 3600
        tried.append({"batch": list(batch), "step_time_s_median": round(cost, 3), "projected_h": round(projected_h, 2),
                      "score_mean": round(score, 4), "wall_s": round(time.perf_counter() - t0, 1)})
        print(f"batch {batch}: {cost:.2f} s/step -> {projected_h:.1f} h for {len(jobs)} runs; "
              f"healthy score {score:.3f}", flush=True)
        if score < MIN_SCORE:
            raise SystemExit(f"the proxy {proxy} scores {score:.3f} on a healthy run (below {MIN_SCORE}): its "
                             "rollouts earn no reward, every GRPO group ties and a healthy run cannot learn; "
                             "build it with a higher --keep-ratio")
        if projected_h <= budget_h:
            chosen = batch
            break
    if chosen is None:
        chosen = BATCHES[-1]
    sizing = {"proxy_weights_sha256": weights, "jobs": len(jobs), "steps_per_run": steps, "total_steps": total_steps, "budget_h": budget_h,
              "threads": threads, "tried": tried, "batch": list(chosen), "engine": engine_for(chosen, threads),
              "host": {"platform": platform.platform(), "cpu_count": os.cpu_count()}}
    sizing_file.write_text(json.dumps(sizing, indent=1) + "\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(sizing_file, RESULTS / "sizing.json")
    return sizing


TRACES = RESULTS / "traces"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def keep_trace(campaign: Path, record: dict) -> None:
    """Gzip a finished job's trace into the committed copy (deterministic: no name or time in the header)."""
    src = campaign / record["trace"]
    dst = TRACES / (record["trace"] + ".gz")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(src.read_bytes())


def restore(proxy: Path, campaign: Path) -> int:
    """Put the committed manifest and traces back into a work directory that lost them; returns how many."""
    saved = RESULTS / "manifest.json"
    if not saved.exists():
        return 0
    manifest = json.loads(saved.read_text())
    from moeproxy.reproduction.campaign import weights_hash

    have = weights_hash(proxy)
    if have != manifest["model"]["weights_sha256"]:
        raise SystemExit(f"the rebuilt proxy's weights hash {have[:12]} is not the campaign's "
                         f"{manifest['model']['weights_sha256'][:12]}; the committed traces were made on another "
                         "proxy: move benchmarks/results/campaign-v2 aside to start the campaign again")
    campaign.mkdir(parents=True, exist_ok=True)
    manifest["model"]["path"] = str(proxy.resolve())  # the same weights, wherever the work directory is now
    restored = 0
    for rec in manifest["jobs"]:
        if rec.get("state") != "finished":
            continue
        dst = campaign / rec["trace"]
        gz = TRACES / (rec["trace"] + ".gz")
        if dst.is_file() and _sha256(dst) == rec["trace_sha256"]:
            continue
        if gz.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(gzip.decompress(gz.read_bytes()))
            if _sha256(dst) == rec["trace_sha256"]:
                restored += 1
                continue
            dst.unlink()
        rec.update(state="pending", trace=None, trace_sha256=None)  # lost: it runs again
    if not (campaign / "manifest.json").exists() or restored:
        (campaign / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return restored


def stage_run(proxy: Path, work: Path, sizing: dict, steps: int, workers: int = 1) -> None:
    from moeproxy.reproduction.campaign import ProcessPoolBackend, default_campaign, run_campaign

    RESULTS.mkdir(parents=True, exist_ok=True)
    jobs = default_campaign(steps=steps).jobs()
    print(f"restored {restore(proxy, work / 'campaign')} committed traces", flush=True)

    def keep_manifest(job, record) -> None:
        if record["state"] == "finished":
            keep_trace(work / "campaign", record)
        shutil.copy(work / "campaign" / "manifest.json", RESULTS / "manifest.json")
        print(f"{record['state']}: {job.id} ({record.get('wall_time_s')} s)", flush=True)

    # Several one-thread jobs side by side beat one job on every thread (ProcessPoolBackend says why).
    backend = ProcessPoolBackend(workers, threads=max(1, sizing["engine"]["threads"] // workers)) if workers > 1 else "local"
    result = run_campaign(proxy, jobs, sizing["engine"], work / "campaign", backend=backend, progress=False,
                          on_job=keep_manifest)
    shutil.copy(work / "campaign" / "manifest.json", RESULTS / "manifest.json")
    print(f"ran {len(result.ran)}, reused {len(result.skipped)}, failed {len(result.failed)}", flush=True)


def stage_library(proxy: Path, work: Path, sizing: dict, steps: int, out: Path, *, partial: bool = False) -> None:
    """Build the fingerprint library from the campaign's traces (``moeproxy fingerprints generate``
    on the same campaign: every job is found finished and reused), calibrated leave-one-seed-out
    and per framework view; its manifest names the committed campaign manifest and its hash."""
    from dataclasses import replace

    from moeproxy.reproduction.campaign import default_campaign

    campaign_dir = work / "campaign"
    restore(proxy, campaign_dir)
    manifest = json.loads((campaign_dir / "manifest.json").read_text())
    pending = [j["id"] for j in manifest["jobs"] if j["state"] != "finished"]
    if pending and not partial:
        raise SystemExit(f"{len(pending)} of {len(manifest['jobs'])} campaign jobs are not finished (first: "
                         f"{pending[0]}); run the 'run' stage first, or give --partial for a library of what is done")
    campaign = replace(default_campaign(steps=steps), engine=sizing["engine"])
    if partial:  # only the entries whose every job has finished
        done = {j["entry"] for j in manifest["jobs"]} - {j["entry"] for j in manifest["jobs"] if j["id"] in pending}
        campaign = replace(campaign, entries=tuple(e for e in campaign.entries if e.slug in done))
    spec = (RESULTS if not partial else work) / "campaign.json"
    spec.write_text(json.dumps(campaign.to_dict(), indent=1) + "\n")
    cmd = [sys.executable, "-c", "from moeproxy.cli import main; main()", "fingerprints", "generate",
           "--model", str(proxy), "--out", str(out), "--work", str(campaign_dir), "--campaign", str(spec),
           "--quiet", "--json"]
    print("$ moeproxy " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    # Name the committed copy of the campaign manifest (the work directory is scratch).
    if not partial:
        shutil.copy(campaign_dir / "manifest.json", RESULTS / "manifest.json")
    lib_manifest_path = out / "manifest.json"
    lib_manifest = json.loads(lib_manifest_path.read_text())
    committed = RESULTS / "manifest.json"
    lib_manifest["campaign"]["manifest"] = str(committed.relative_to(ROOT)) if not partial else str(campaign_dir / "manifest.json")
    lib_manifest["campaign"]["manifest_sha256"] = _sha256(committed if not partial else campaign_dir / "manifest.json")
    lib_manifest["campaign"]["partial"] = partial
    lib_manifest_path.write_text(json.dumps(lib_manifest, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(ROOT / "runs" / "campaign-v2"))
    ap.add_argument("--stages", default="proxy,measure,run")
    ap.add_argument("--budget-h", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="run stage: jobs side by side, the threads shared")
    ap.add_argument("--keep-ratio", type=float, default=0.75)
    ap.add_argument("--library", default=str(ROOT / "signatures" / "library"), help="where the library stage writes")
    ap.add_argument("--partial", action="store_true",
                    help="library stage: build from the entries finished so far (a check, not for shipping)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    stages = set(args.stages.split(","))
    proxy = stage_proxy(work, args.keep_ratio)
    if stages & {"measure", "run", "library"}:
        sizing = stage_measure(proxy, work, args.budget_h, args.threads, args.steps)
    if "run" in stages:
        stage_run(proxy, work, sizing, args.steps, args.workers)
    if "library" in stages:
        stage_library(proxy, work, sizing, args.steps, Path(args.library), partial=args.partial)


if __name__ == "__main__":
    main()
