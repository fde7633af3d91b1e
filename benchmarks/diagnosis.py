"""Diagnosis benchmark v2 (issue 17, item 7): twenty-one evaluation sets side by side, each beside the
one-line NaN rule and a random ranking, every share with its Wilson 95% interval.

The sets:

- ``heldout-qwen3``: in-engine held-out runs of the Qwen3-MoE RL starting point itself
  (``qwen3-moe-64e-rl``, the *original* the campaign-v2 proxy was cut from): every campaign-v2
  variant once, seeds never used by the library (100; healthy 100-102), a magnitude between the
  library's two (x1.5 the default), code bugs alternately at onset 0 and at a mid-run onset drawn from
  the seed, configuration faults at onset 0. In-distribution in the sense that matters least: the
  same engine and fault injectors made the library.
- ``heldout-deepseek``: the same jobs on the DeepSeek-V3 RL starting point (``deepseek-v3-64e-rl``),
  an architecture the library was never built from.
- ``field``: 38 reconstructions of public verl / TRL / OpenRLHF reports (benchmarks/field).
- ``trl_runs``: 7 real TRL ``GRPOTrainer`` runs (benchmarks/results/trl_runs).
- ``trl_runs_2``: 10 more, new variants on seeds of their own, exported with each run's config and
  frozen before their first scoring (benchmarks/results/trl_runs_2, ``trl_runs.py --batch 2``).
- ``trl_runs_3``: 6 more (``--batch 3``), frozen after the rules written on batch 2 and before
  their own first scoring; ``trl_runs_4`` to ``trl_runs_16``: 6 more each (``--batch 4`` to ``--batch 16``), the same
  way after the batch before.
- ``public_runs``: 18 real verl and TRL logs other people published, labelled by what their authors
  say (benchmarks/public_runs; 17 healthy): runs the project neither made nor chose.
- ``public_runs_2``: a second batch of 9 (benchmarks/public_runs_2), frozen after the engine had
  changed because of the first.

Each in-engine run is written in one framework's view (verl, TRL, OpenRLHF in turn, by job), as
that framework's logger would write it, so the in-engine sets are not all verl-shaped.

Stages (each reuses what is on disk; stop and start again at will):

1. ``heldout``: run the held-out jobs on each reference through ``run_campaign`` (resumable), at the
   campaign-v2 batch (benchmarks/results/campaign-v2/sizing.json).
2. ``export``: write each reference's finished runs as a labelled set (``labels.json``,
   ``traces/<id>.jsonl``, ``MANIFEST.sha256``) under ``benchmarks/heldout/<set>/``. A set that already
   has a manifest is frozen: export refuses to change it. Commit the sets before ``evaluate``.
3. ``evaluate``: score the twenty-one sets (``benchmarks/evalsets.py``, each scoring appended to
   ``benchmarks/results/field-scores.jsonl``), the left-out-class weak rate on the in-engine sets
   (each fault run triaged with its class removed from the library: the share answered ``weak``), and
   print the markdown table docs/benchmarks.md carries. Writes ``benchmarks/results/diagnosis_v2.json``.
   When ``benchmarks/results/view_visibility.json`` (``benchmarks/visibility.py``) was measured on the
   same library, the in-engine sets also get their figures on the runs whose variant the library's
   own runs show in the run's view: the ceiling a framework's loggers leave to the library.

    OMP_NUM_THREADS=2 nice -n 10 python benchmarks/diagnosis.py --work runs/diagnosis-v2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import evalsets  # the scorer of every labelled set (found through the path above)

#: set name -> reference model of the in-engine held-out sets.
REFERENCES: dict[str, str] = {"heldout-qwen3": "qwen3-moe-64e-rl", "heldout-deepseek": "deepseek-v3-64e-rl"}
#: The real TRL batches, in the order they were frozen (trl_runs.py --batch 1 to 16).
TRL_SETS: tuple[str, ...] = ("trl_runs",) + tuple(f"trl_runs_{k}" for k in range(2, 17))
FIELD_SETS: dict[str, Path] = {"field": ROOT / "benchmarks" / "field",
                               **{name: ROOT / "benchmarks" / "results" / name for name in TRL_SETS},
                               "public_runs": ROOT / "benchmarks" / "public_runs",
                               "public_runs_2": ROOT / "benchmarks" / "public_runs_2"}
HELDOUT_ROOT = ROOT / "benchmarks" / "heldout"
HELDOUT_SEED = 100
HEALTHY_SEEDS = (100, 101, 102)
MAGNITUDE_FACTOR = 1.5  # the library holds x1 and x3 (campaign.SECOND_MAGNITUDE)
STEPS = 120
VIEW_ORDER = ("verl", "trl", "openrlhf")
#: Framework name a set's label carries for each view (the importer's names).
VIEW_FRAMEWORK = {"verl": "verl", "trl": "trl", "openrlhf": "openrlhf"}


def heldout_jobs(steps: int = STEPS) -> list:
    """Healthy x3 and every campaign-v2 variant once (see the module docstring)."""
    from moeproxy.reproduction.campaign import HEALTHY, CampaignJob, FaultEntry, onset_rules, scaled_params
    from moeproxy.reproduction.catalogue import FAULT_CLASSES

    jobs = [CampaignJob(HEALTHY, s, steps, "heldout") for s in HEALTHY_SEEDS]
    code_bugs = 0
    for name, fc in FAULT_CLASSES.items():
        if name == "healthy":
            continue
        for variant in fc.variants:
            rules = onset_rules(name, variant)
            if len(rules) > 1:  # a code bug: its onsets in turn across the variants, one run each
                rules = (rules[code_bugs % len(rules)],)
                code_bugs += 1
            entry = FaultEntry(name, variant, scaled_params(name, variant, MAGNITUDE_FACTOR), rules[0])
            jobs.append(CampaignJob(entry, HELDOUT_SEED, steps, "heldout"))
    return jobs


def engine_config(reference: str, batch: Sequence[int], threads: int):
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.reference import rl_engine_defaults

    prompts, group, minis = batch
    return EngineConfig.from_dict({**EngineConfig(**rl_engine_defaults(reference)).to_dict(),
                                   "prompts_per_step": prompts, "group_size": group,
                                   "ppo_mini_batch_size": prompts // minis, "threads": threads})


def campaign_batch() -> tuple[int, int, int]:
    """The batch campaign v2 was sized to (its sizing.json), so held-out and library runs match."""
    sizing = json.loads((ROOT / "benchmarks" / "results" / "campaign-v2" / "sizing.json").read_text())
    return tuple(sizing["batch"])


def stage_heldout(work: Path, set_name: str, threads: int, steps: int, workers: int = 1) -> Path:
    from moeproxy.reproduction.campaign import ProcessPoolBackend, run_campaign
    from moeproxy.reproduction.reference import reference_model_path

    reference = REFERENCES[set_name]
    out = work / set_name
    t0 = time.perf_counter()
    backend = ProcessPoolBackend(workers, threads=max(1, threads // workers)) if workers > 1 else "local"
    result = run_campaign(reference_model_path(reference), heldout_jobs(steps),
                          engine_config(reference, campaign_batch(), threads), out, backend=backend)
    print(f"{set_name}: {len(result.ran)} runs made, {len(result.skipped)} reused, {len(result.failed)} failed, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    if result.failed:
        raise SystemExit(f"{set_name}: failed jobs: {', '.join(result.failed)} (run again to retry them)")
    return out


def export_set(campaign_dir: Path, target: Path, set_name: str) -> Path:
    """Write the finished runs of a held-out campaign as a labelled, frozen set."""
    from moeproxy.reproduction.views import project
    from moeproxy.signatures.values import format_value

    manifest = json.loads((campaign_dir / "manifest.json").read_text())
    done = [j for j in manifest["jobs"] if j["state"] == "finished"]
    if len(done) != len(manifest["jobs"]):
        raise SystemExit(f"{campaign_dir}: {len(manifest['jobs']) - len(done)} job(s) not finished; run heldout first")
    files: dict[str, bytes] = {}
    labels: dict[str, dict[str, Any]] = {}
    for i, job in enumerate(sorted(done, key=lambda j: j["id"])):
        view = VIEW_ORDER[i % len(VIEW_ORDER)]
        rid = job["id"].split("/", 1)[1].replace("/", "__")
        records = [json.loads(line) for line in (campaign_dir / job["trace"]).read_text().splitlines() if line.strip()]
        lines = [json.dumps({"step": r["step"], "values": {k: format_value(v) for k, v in r["values"].items()}})
                 for r in project(records, view)]
        files[f"traces/{rid}.jsonl"] = ("\n".join(lines) + "\n").encode()
        labels[rid] = {"label": job["fault_class"], "variant": job["variant"], "onset": job["onset"],
                       "framework": VIEW_FRAMEWORK[view], "seed": job["seed"], "steps": job["steps"],
                       "fault": job["fault"], "source_trace_sha256": job["trace_sha256"]}
    files["labels.json"] = (json.dumps(labels, indent=1, sort_keys=True) + "\n").encode()
    files["README.md"] = _readme(set_name, manifest, len(labels)).encode()
    listing = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items()))
    existing = target / "MANIFEST.sha256"
    if existing.exists():
        if existing.read_text() != listing:
            raise SystemExit(f"{target} is frozen (MANIFEST.sha256) and the export differs from it: "
                             "a scored set is not rewritten; export into a new directory")
        print(f"{target}: unchanged (frozen)")
        return target
    for name, data in files.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(data)
    existing.write_text(listing)
    print(f"{target}: {len(labels)} runs written and frozen (commit it before scoring)")
    return target


def _readme(set_name: str, manifest: Mapping[str, Any], n: int) -> str:
    model = manifest.get("model", {})
    # The path relative to the checkout, so the frozen README reads the same on every clone.
    model_path = os.path.relpath(model["path"], ROOT) if "path" in model else "?"
    return (f"# {set_name}\n\n"
            f"{n} in-engine held-out runs made by `benchmarks/diagnosis.py` (stages heldout, export) on "
            f"`{model_path}`: healthy seeds {', '.join(map(str, HEALTHY_SEEDS))} and every "
            f"campaign-v2 variant once at seed {HELDOUT_SEED}, magnitude x{MAGNITUDE_FACTOR} where a variant "
            f"takes one, code bugs alternately at onset 0 and mid-run, {STEPS} steps. Each run is written in "
            "one framework's view (verl, TRL, OpenRLHF in turn). `labels.json` holds the class, variant, onset "
            "and the hash of the engine's raw trace; `MANIFEST.sha256` freezes the set before any scoring.\n")


def stage_evaluate(library: Path, log: Path | None, note: str, out: Path,
                   heldout_root: Path = HELDOUT_ROOT, visibility_path: Path | None = None) -> dict[str, Any]:
    from moeproxy.signatures.canonical import load_run
    from moeproxy.signatures.fingerprint import load_library
    from moeproxy.signatures.matching import triage

    sets = {**{name: heldout_root / name for name in REFERENCES}, **FIELD_SETS}
    lib = load_library(library)
    visibility = _visibility(visibility_path, library)
    results: dict[str, Any] = {}
    for name, root in sets.items():
        if not (root / "labels.json").exists():
            print(f"{name}: no set at {root} (run heldout and export first); left out")
            continue
        figures = evalsets.score_set(root, library, name=name, log=log, note=note)
        if name in REFERENCES:
            weak = total = 0
            for item in evalsets.load_set(root):
                if item.label == "healthy" or item.label not in lib.fault_classes:
                    continue
                res = triage(load_run(item.path, framework=item.framework), lib.without_class(item.label),
                             framework=item.framework)
                weak += res.candidates[0].strength == "weak"
                total += 1
            figures["left_out_class_weak"] = evalsets.share(weak, total)
        if name in REFERENCES and visibility is not None:
            figures["visible"] = visible_figures(root, figures["rows"], visibility)
        results[name] = figures
    report = {"library": str(library), "library_sha256": evalsets._file_hash(library), "sets": results,
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(results))
    if any("visible" in f for f in results.values()):
        print(visible_table(results))
    return report


def _visibility(path: Path | None, library: Path) -> dict[str, Any] | None:
    """benchmarks/visibility.py's measurement, when it was made on this very library."""
    if path is None or not path.exists():
        return None
    vis = json.loads(path.read_text())
    if vis.get("library_sha256") != evalsets._file_hash(library):
        print(f"{path}: measured on another library; the visible-run figures are left out "
              "(run benchmarks/visibility.py again)")
        return None
    return vis


def visible_figures(root: Path, rows: Sequence[Mapping[str, Any]], visibility: Mapping[str, Any]) -> dict[str, Any]:
    """The held-out figures on the runs whose variant the library's own runs show in the run's view
    (benchmarks/visibility.py): the runs the view lets the library name at all."""
    from visibility import run_visible

    labels = json.loads((root / "labels.json").read_text())
    seen, hidden, unknown = [], [], []
    for r in rows:
        meta = labels[r["id"]]
        v = run_visible(r["label"], meta.get("variant"), r["onset"], r["framework"], visibility)
        (seen if v else hidden if v is False else unknown).append(r)
    return {"runs": len(seen), "of": len(rows),
            "top1": evalsets.share(sum(r["ranked"][0] == r["label"] for r in seen), len(seen)),
            "top3": evalsets.share(sum(r["label"] in r["ranked"][:3] for r in seen), len(seen)),
            "hidden": [r["id"] for r in hidden], "not_measured": [r["id"] for r in unknown],
            "hidden_named": sum(r["ranked"][0] == r["label"] for r in hidden),
            "visibility_commit": visibility.get("commit")}


def visible_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    rows = ["| set | runs the view can show | top-1 on them | top-3 on them | hidden runs named anyway |",
            "|---|---|---|---|---|"]
    for name, f in results.items():
        v = f.get("visible")
        if v is None:
            continue
        t1, t3 = v["top1"], v["top3"]
        rows.append(f"| {name} | {v['runs']} of {v['of']} | {t1['value']:.0%} [{t1['ci95'][0]:.0%}–{t1['ci95'][1]:.0%}] "
                    f"| {t3['value']:.0%} | {v['hidden_named']} of {len(v['hidden'])} |")
    return "\n".join(rows)


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The markdown table of docs/benchmarks.md: one row per set, engine then the two baselines."""

    def pct(s: Mapping[str, Any] | None) -> str:
        if not s or s.get("value") is None:
            return "–"
        return f"{s['value']:.0%} [{s['ci95'][0]:.0%}–{s['ci95'][1]:.0%}]"

    header = ("| set | runs | top-1 | top-3 | healthy false alarms | wrong `strong` | left-out class weak "
              "| NaN rule top-1 | random top-1 | triage median |")
    rows = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in results.items():
        e, b = f["engine"], f["baselines"]
        fa = e["healthy_false_alarms"]
        rows.append(f"| {name} | {e['runs']} | {pct(e['top1'])} | {pct(e['top3'])} | {fa['k']}/{fa['n']} "
                    f"| {pct(e.get('wrong_strong'))} | {pct(f.get('left_out_class_weak'))} "
                    f"| {pct(b['nan_rule']['top1'])} | {pct(b['random']['top1'])} "
                    f"| {f['triage_latency_median_s'] * 1000:.0f} ms |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/diagnosis-v2")
    ap.add_argument("--stages", default="heldout,export,evaluate")
    ap.add_argument("--sets", default=",".join(REFERENCES), help="in-engine sets to run and export")
    ap.add_argument("--library", default=str(ROOT / "signatures" / "library"))
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="heldout: runs side by side, the threads shared")
    ap.add_argument("--log", default=str(ROOT / "benchmarks" / "results" / "field-scores.jsonl"))
    ap.add_argument("--note", default="diagnosis benchmark v2: twenty-one sets")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "diagnosis_v2.json"))
    ap.add_argument("--heldout-root", default=str(HELDOUT_ROOT), help="where export writes the sets")
    ap.add_argument("--visibility", default=str(ROOT / "benchmarks" / "results" / "view_visibility.json"),
                    help="benchmarks/visibility.py's result: held-out figures on the runs their view can show")
    args = ap.parse_args(argv)
    stages = set(args.stages.split(","))
    work = Path(args.work)
    names = [s for s in args.sets.split(",") if s]
    unknown = set(names) - set(REFERENCES)
    if unknown:
        raise SystemExit(f"unknown set(s) {', '.join(sorted(unknown))}; known: {', '.join(REFERENCES)}")
    for name in names:
        if "heldout" in stages:
            stage_heldout(work, name, args.threads, args.steps, args.workers)
        if "export" in stages:
            export_set(work / name, Path(args.heldout_root) / name, name)
    if "evaluate" in stages:
        stage_evaluate(Path(args.library), Path(args.log) if args.log else None, args.note, Path(args.out),
                       Path(args.heldout_root), Path(args.visibility) if args.visibility else None)


if __name__ == "__main__":
    main()
