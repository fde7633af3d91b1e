"""benchmarks/public_runs and public_runs_2: real logs other people published (issue 17, measured
on runs the project did not make) are intact and well-formed: the files match MANIFEST.sha256,
every trace loads as the REST ingest body, every run names its source at a commit, labels are
healthy or a class of the catalogue, and the runs are long enough to judge.

No diagnosis here: the set is frozen before anyone scores it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.canonical import load_run

ROOT = Path(__file__).resolve().parents[1]
SETS = [ROOT / "benchmarks" / "public_runs", ROOT / "benchmarks" / "public_runs_2"]
sys.path.insert(0, str(ROOT / "benchmarks"))
import evalsets

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _json(path: Path):
    return json.loads(path.read_text())


RUNS = [(root, rid) for root in SETS for rid in sorted(_json(root / "labels.json"))]


@pytest.mark.parametrize("root", SETS, ids=[r.name for r in SETS])
def test_the_set_is_as_frozen(root):
    assert evalsets.check_manifest(root) is not None
    listed = {line.split("  ", 1)[1] for line in (root / "MANIFEST.sha256").read_text().splitlines() if line}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"}
    assert listed == on_disk  # nothing added or left out of the manifest


def test_no_run_is_in_both_batches():
    first, second = (set(_json(root / "labels.json")) for root in SETS)
    urls = [{v["url"] for v in _json(root / "sources.json")["runs"].values()} for root in SETS]
    assert not first & second and not urls[0] & urls[1]


@pytest.mark.parametrize(("root", "rid"), RUNS, ids=[f"{r.name}/{i}" for r, i in RUNS])
def test_each_run_loads_names_its_source_and_is_long_enough(root, rid):
    SET, LABELS, SOURCES = root, _json(root / "labels.json"), _json(root / "sources.json")
    meta = LABELS[rid]
    assert meta["label"] == "healthy" or meta["label"] in FAULT_CLASSES
    assert (meta["onset"] is None) == (meta["label"] == "healthy")
    body = json.loads((SET / "traces" / f"{rid}.json").read_text())
    assert body["name"] == rid and body["framework"] == meta["framework"] in ("verl", "trl", "openrlhf")
    steps = [s["step"] for s in body["steps"]]
    assert steps == sorted(set(steps)) and len(steps) == meta["steps"] >= 40
    run = load_run(SET / "traces" / f"{rid}.json", framework=meta["framework"])
    assert len(run.series) >= 5
    src = SOURCES["runs"][rid]
    assert COMMIT.match(src["commit"]) and src["repo"].count("/") == 1 and src["url"].startswith("https://github.com/")
    assert src["label"] == meta["label"] and src["why"]


@pytest.mark.parametrize("root", SETS, ids=[r.name for r in SETS])
def test_runs_seen_and_not_labelled_say_why_and_are_not_scored(root):
    seen = _json(root / "sources.json")["seen_not_labelled"]
    assert seen and not set(seen) & set(_json(root / "labels.json"))
    assert all(v["why_unlabelled"] and v["repo"] for v in seen.values())
