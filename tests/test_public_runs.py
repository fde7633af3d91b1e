"""benchmarks/public_runs: real logs other people published (issue 17, measured on runs the
project did not make) are intact and well-formed: the files match MANIFEST.sha256, every trace
loads as the REST ingest body, every run names its source at a commit, labels are healthy or a
class of the catalogue, and the runs are long enough to judge.

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
SET = ROOT / "benchmarks" / "public_runs"
sys.path.insert(0, str(ROOT / "benchmarks"))
import evalsets

LABELS = json.loads((SET / "labels.json").read_text())
SOURCES = json.loads((SET / "sources.json").read_text())
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def test_the_set_is_as_frozen():
    assert evalsets.check_manifest(SET) is not None
    listed = {line.split("  ", 1)[1] for line in (SET / "MANIFEST.sha256").read_text().splitlines() if line}
    on_disk = {str(p.relative_to(SET)) for p in SET.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"}
    assert listed == on_disk  # nothing added or left out of the manifest


@pytest.mark.parametrize("rid", sorted(LABELS))
def test_each_run_loads_names_its_source_and_is_long_enough(rid):
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


def test_runs_seen_and_not_labelled_say_why_and_are_not_scored():
    seen = SOURCES["seen_not_labelled"]
    assert seen and not set(seen) & set(LABELS)
    assert all(v["why_unlabelled"] and v["repo"] for v in seen.values())
