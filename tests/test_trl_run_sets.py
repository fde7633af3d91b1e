"""The real TRL runs (benchmarks/results/trl_runs and trl_runs_2 to trl_runs_16, issue 17 item 6) are
intact and well-formed: each set's files match its MANIFEST.sha256, every label is a class of the
catalogue with an onset only for a fault, every trace loads under TRL's names, and the traces of
batches 2 to 7 carry the config the callback sent, which is what triage reads the run's settings from.

No diagnosis here: each set was frozen before it was scored."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.canonical import load_config, load_run
from moeproxy.signatures.settings import settings_from_config

ROOT = Path(__file__).resolve().parents[1]
SETS = [ROOT / "benchmarks" / "results" / name for name in ("trl_runs", *(f"trl_runs_{k}" for k in range(2, 17)))]
sys.path.insert(0, str(ROOT / "benchmarks"))
import evalsets
import trl_runs

RUNS = [(root, rid) for root in SETS for rid in sorted(json.loads((root / "labels.json").read_text()))]


@pytest.mark.parametrize("root", SETS, ids=[r.name for r in SETS])
def test_the_set_is_as_frozen(root):
    assert evalsets.check_manifest(root) is not None
    listed = {line.split("  ", 1)[1] for line in (root / "MANIFEST.sha256").read_text().splitlines() if line}
    assert listed == {p.name for p in root.glob("*.json")}


def test_the_batches_hold_the_runs_their_registry_names():
    for batch, root in zip((str(k) for k in range(1, 17)), SETS, strict=True):
        labels = json.loads((root / "labels.json").read_text())
        keys = trl_runs.BATCHES[batch][0]
        assert set(labels) == set(keys)
        assert all(labels[k]["label"] == trl_runs.RUNS[k].label for k in keys)


@pytest.mark.parametrize(("root", "rid"), RUNS, ids=[f"{r.name}/{i}" for r, i in RUNS])
def test_each_trace_loads_under_trl_names(root, rid):
    meta = json.loads((root / "labels.json").read_text())[rid]
    assert meta["label"] == "healthy" or meta["label"] in FAULT_CLASSES
    assert (meta["onset"] is None) == (meta["label"] == "healthy")
    run = load_run(root / f"{rid}.json", framework="trl")
    assert {"reward", "loss", "grad_norm", "learning_rate"} <= set(run.series)
    assert len(run.series["grad_norm"].steps) == meta["steps"]
    config = load_config(root / f"{rid}.json")
    # TRL logs the rewards on the steps that generate: one in num_iterations (GRPO's mu; the
    # GRPOConfig the harness built is in the set's manifest).
    manifest = json.loads((root / "manifest.json").read_text())["runs"][rid]
    mu = manifest["config"].get("num_iterations", 1)
    assert len(run.series["reward"].steps) == math.ceil(meta["steps"] / mu)
    if root.name != "trl_runs":  # batches 2 to 7 were exported with the config the callback sent
        assert config is not None and "training_args" in config
        beta = config["training_args"]["beta"]
        assert settings_from_config(config).kl_coef == beta
        # The config says a negative beta where it was set before training; batch 10 negates the
        # trainer's beta halfway, after the callback sent the config, and batch 13's KL fault keeps
        # beta and syncs the reference instead.
        assert (beta < 0) == (rid.startswith("negative_beta") and meta["onset"] == 0)
    else:
        assert config is None
