"""Scoring labelled evaluation sets against a fingerprint library, beside two baselines, with
95% intervals, and a log of every scoring (issue 17, items 5–7).

A set is a directory with ``labels.json`` (``{run id: {"label": class, "onset": step|None,
"framework": name, ...}}``) and one trace per run: ``traces/<id>.json`` or ``<id>.json`` (the REST
ingest body, ``{"name", "framework", "steps": [{"step", "values"}]}``, with the run's ``config``
where it was exported with one: triage reads its settings from it) or ``<id>.jsonl``. An
optional ``MANIFEST.sha256`` (``sha256sum`` format) freezes the set: scoring a set whose files do
not match it is refused, so a set cannot drift after it was scored.

Figures per set: top-1 and top-3 (share of runs whose class is ranked first / in the first
three), the share ranked first *and* ``strong``, wrong ``strong`` answers, healthy false alarms
(a healthy run whose first candidate is a fault; ``strong`` ones counted apart), per-class
counts and the confusion of first answers, the median triage latency. Every share carries its
Wilson 95% interval. Baselines on the same runs: ``nan_rule`` ("any non-finite value →
gradient_overflow, else healthy", the rest of the ranking at random) and ``random`` (a uniformly
random ranking; seeded).

Each call of :func:`score_set` with ``log=`` appends one JSON line (date, set, the set's manifest
hash, library path and hash, code commit, figures) to the log, so any tuning on a set shows.

    python benchmarks/evalsets.py benchmarks/field --library signatures/library \\
        --log benchmarks/results/field-scores.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Z95 = 1.959964


class SetError(ValueError):
    """An evaluation set that cannot be scored (missing labels, a trace, a changed file)."""


@dataclass(frozen=True)
class LabelledRun:
    id: str
    label: str
    framework: str | None
    onset: int | None
    path: Path


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson score interval (95%) of a proportion k/n; (0, 1) when n is 0 (the fidelity harness's)."""
    from moeproxy.reproduction.fidelity.scores import wilson_interval

    return wilson_interval(k, n, Z95)


def share(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "value": round(k / n, 4) if n else None, "ci95": [round(lo, 4), round(hi, 4)]}


# --- sets -----------------------------------------------------------------------------------------


def check_manifest(root: Path) -> str | None:
    """The SHA-256 of ``MANIFEST.sha256`` after checking every file it lists; None when absent."""
    manifest = root / "MANIFEST.sha256"
    if not manifest.exists():
        return None
    bad = []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        path = root / name.strip().lstrip("*")
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest.strip():
            bad.append(name.strip())
    if bad:
        raise SetError(f"{root}: {len(bad)} file(s) differ from MANIFEST.sha256 (first: {bad[0]}); "
                       "a frozen set is scored as committed")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()


def load_set(root: str | Path) -> list[LabelledRun]:
    root = Path(root)
    try:
        labels = json.loads((root / "labels.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SetError(f"{root}/labels.json: {exc}") from None
    runs = []
    for rid, meta in sorted(labels.items()):
        if not isinstance(meta, Mapping) or "label" not in meta:
            raise SetError(f"{root}/labels.json: {rid!r} has no 'label'")
        path = next((p for p in (root / "traces" / f"{rid}.json", root / f"{rid}.json", root / "traces" / f"{rid}.jsonl",
                                 root / f"{rid}.jsonl") if p.is_file()), None)
        if path is None:
            raise SetError(f"{root}: no trace for {rid!r} (traces/{rid}.json)")
        runs.append(LabelledRun(rid, str(meta["label"]), meta.get("framework"), meta.get("onset"), path))
    return runs


# --- rankers --------------------------------------------------------------------------------------

Ranker = Callable[[Any, LabelledRun], list[str]]


def nan_rule(classes: Sequence[str], seed: int = 0) -> Callable[[Any, LabelledRun], list[str]]:
    """"Any non-finite value -> gradient_overflow, else healthy"; the other classes at random."""
    rng = random.Random(seed)

    def rank(run_metrics, item: LabelledRun) -> list[str]:
        nonfinite = any(not np.isfinite(s.values).all() for s in run_metrics.series.values())
        first = "gradient_overflow" if nonfinite else "healthy"
        rest = [c for c in classes if c != first]
        rng.shuffle(rest)
        return [first, *rest]

    return rank


def random_ranking(classes: Sequence[str], seed: int = 0) -> Callable[[Any, LabelledRun], list[str]]:
    rng = random.Random(seed)

    def rank(run_metrics, item: LabelledRun) -> list[str]:
        out = list(classes)
        rng.shuffle(out)
        return out

    return rank


# --- scoring ------------------------------------------------------------------------------------


def _figures(rows: list[dict], classes: Sequence[str]) -> dict[str, Any]:
    n = len(rows)
    healthy = [r for r in rows if r["label"] == "healthy"]
    faults = [r for r in rows if r["label"] != "healthy"]
    per_class: dict[str, dict[str, int]] = {}
    confusion: dict[str, dict[str, int]] = {}
    for r in rows:
        pc = per_class.setdefault(r["label"], {"runs": 0, "top1": 0, "top3": 0})
        pc["runs"] += 1
        pc["top1"] += r["ranked"][0] == r["label"]
        pc["top3"] += r["label"] in r["ranked"][:3]
        conf = confusion.setdefault(r["label"], {})
        conf[r["ranked"][0]] = conf.get(r["ranked"][0], 0) + 1
    out = {
        "runs": n,
        "top1": share(sum(r["ranked"][0] == r["label"] for r in rows), n),
        "top3": share(sum(r["label"] in r["ranked"][:3] for r in rows), n),
        "per_class": per_class,
        "confusion": confusion,
    }
    if rows and "strength" in rows[0]:
        out["correct_strong"] = share(sum(r["ranked"][0] == r["label"] and r["strength"] == "strong" for r in rows), n)
        out["wrong_strong"] = share(sum(r["ranked"][0] != r["label"] and r["strength"] == "strong" for r in rows), n)
        out["healthy_false_alarms_strong"] = share(
            sum(r["ranked"][0] != "healthy" and r["strength"] == "strong" for r in healthy), len(healthy))
        out["faults_named_with_evidence"] = share(
            sum(r["ranked"][0] == r["label"] and bool(r.get("evidence")) for r in faults), len(faults))
    out["healthy_false_alarms"] = share(sum(r["ranked"][0] != "healthy" for r in healthy), len(healthy))
    return out


def score_set(root: str | Path, library_path: str | Path, *, name: str | None = None,
              log: str | Path | None = None, note: str = "", seed: int = 0) -> dict[str, Any]:
    """Score every run of the set at ``root``: the library's triage and the two baselines."""
    from moeproxy.signatures import dtw
    from moeproxy.signatures.canonical import load_config, load_run
    from moeproxy.signatures.fingerprint import load_library
    from moeproxy.signatures.matching import triage
    from moeproxy.signatures.settings import settings_from_config

    root = Path(root)
    set_hash = check_manifest(root)
    items = load_set(root)
    lib = load_library(library_path)
    classes = sorted(lib.fault_classes)
    dtw.warm()
    baselines = {"nan_rule": nan_rule(classes, seed), "random": random_ranking(classes, seed)}
    rows: list[dict] = []
    base_rows: dict[str, list[dict]] = {k: [] for k in baselines}
    latencies = []
    for item in items:
        run = load_run(item.path, framework=item.framework)
        settings = settings_from_config(load_config(item.path))  # a trace exported with its run's config
        t0 = time.perf_counter()
        res = triage(run, lib, framework=item.framework, settings=settings)
        latencies.append(time.perf_counter() - t0)
        top = res.candidates[0]
        rows.append({"id": item.id, "label": item.label, "framework": item.framework, "onset": item.onset,
                     "ranked": [c.fault_class for c in res.candidates], "score": round(top.score, 4),
                     "strength": top.strength, "evidence": list(top.evidence), "verdict": res.verdict})
        for bname, rank in baselines.items():
            base_rows[bname].append({"id": item.id, "label": item.label, "ranked": rank(run, item)})
    figures = {
        "set": name or root.name,
        "path": str(root),
        "set_manifest_sha256": set_hash,
        "library": str(library_path),
        "library_sha256": _file_hash(library_path),
        "engine": _figures(rows, classes),
        "baselines": {k: _figures(v, classes) for k, v in base_rows.items()},
        "by_onset": {kind: _figures([r for r in rows if (r["onset"] in (0, None)) == (kind == "from step 0")], classes)
                     for kind in ("from step 0", "late")},
        "triage_latency_median_s": round(statistics.median(latencies), 4) if latencies else None,
        "rows": rows,
    }
    if log is not None:
        entry = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "set": figures["set"],
                 "set_manifest_sha256": set_hash, "library": str(library_path),
                 "library_sha256": figures["library_sha256"], "commit": _commit(), "note": note,
                 "runs": len(rows),
                 "engine": {k: figures["engine"][k] for k in ("top1", "top3", "correct_strong", "wrong_strong",
                                                              "healthy_false_alarms", "healthy_false_alarms_strong")},
                 "baselines": {b: {k: f[k] for k in ("top1", "top3", "healthy_false_alarms")}
                               for b, f in figures["baselines"].items()}}
        log = Path(log)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
    return figures


def _file_hash(path: str | Path) -> str:
    p = Path(path)
    p = p / "fingerprints.json" if p.is_dir() else p
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _commit() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+uncommitted" if dirty else "")


def _line(label: str, f: Mapping[str, Any]) -> str:
    def pct(s):
        return f"{s['value']:.0%} [{s['ci95'][0]:.0%}, {s['ci95'][1]:.0%}]" if s["value"] is not None else "-"

    return (f"  {label:<10} top-1 {pct(f['top1']):<18} top-3 {pct(f['top3']):<18} "
            f"healthy false alarms {f['healthy_false_alarms']['k']}/{f['healthy_false_alarms']['n']}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+", help="set directories (labels.json + traces)")
    ap.add_argument("--library", default=str(ROOT / "signatures" / "library"))
    ap.add_argument("--log", default=None, help="append one line per scoring to this JSONL file")
    ap.add_argument("--note", default="", help="why this scoring was made (kept in the log)")
    ap.add_argument("--out", default=None, help="write the full figures (all sets) to this JSON file")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    results = []
    for s in args.sets:
        try:
            f = score_set(s, args.library, log=args.log, note=args.note)
        except SetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        results.append(f)
        e = f["engine"]
        print(f"{f['set']}: {e['runs']} runs, library {f['library']}")
        print(_line("engine", e))
        for b, bf in f["baselines"].items():
            print(_line(b, bf))
        if "wrong_strong" in e:
            print(f"  strong and right {e['correct_strong']['value']:.0%}, strong and wrong {e['wrong_strong']['value']:.0%}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
