"""benchmarks/visibility.py: which variants each framework view can show, measured on the library's
own runs, and the held-out figures diagnosis.py reports on the runs their view can show."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from moeproxy.signatures.build import fingerprint_from_trace_set, load_trace_dir
from moeproxy.signatures.fingerprint import FingerprintLibrary, save_library
from moeproxy.signatures.synthetic import synthetic_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import diagnosis
import evalsets
import visibility

SEEDS = (0, 1, 2)


def _write_entry(directory: Path, fault_class: str, runs) -> None:
    """A campaign entry as the engine writes it: raw records and a manifest naming the fault."""
    directory.mkdir(parents=True)
    for seed, run in zip(SEEDS, runs, strict=True):
        (directory / f"{fault_class}-seed{seed}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in run.to_steps()))
    variant = "none" if fault_class == "healthy" else "skip_from_onset"
    (directory / "manifest.json").write_text(json.dumps(
        {"fault": {"class": fault_class, "variant": variant, "params": {"onset": 25}}, "view": "raw"}))


def _campaign(root: Path, metrics: tuple[str, ...] | None = None):
    """A one-entry campaign (a stale sync at step 25 and its healthy twins, logging ``metrics``)
    and the library built from it, as campaign_v2's library stage leaves them."""
    _write_entry(root / "library" / "healthy", "healthy",
                 [synthetic_run("healthy", steps=60, seed=s, metrics=metrics) for s in SEEDS])
    _write_entry(root / "library" / "stale", "stale_weight_sync",
                 [synthetic_run("stale_weight_sync", steps=60, onset=25, seed=s, metrics=metrics) for s in SEEDS])
    ts = load_trace_dir(root / "library" / "stale", twins_from=root / "library" / "healthy")
    fp = fingerprint_from_trace_set(ts)
    lib_path = save_library(FingerprintLibrary((fp,)), root / "lib")
    return root, lib_path, fp


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return _campaign(tmp_path_factory.mktemp("campaign"))


def test_the_verl_view_measures_what_the_build_measured(campaign):
    root, lib_path, fp = campaign
    report = visibility.measure(lib_path, root)
    rec = report["fingerprints"][fp.id]
    assert rec["fault_class"] == "stale_weight_sync" and not rec["from_start"]
    verl = rec["views"]["verl"]
    # The build scored the same runs and twins in the same view: the same two numbers.
    assert verl["separation"] == pytest.approx(fp.separation, abs=1e-6)
    assert verl["twin_score"] == pytest.approx(fp.twin_score, abs=1e-6)
    assert verl["visible"] is (fp.separation >= report["min_separation"])
    assert set(rec["views"]) == set(visibility.VIEWS)
    for v in rec["views"].values():
        assert v["runs"] == len(SEEDS) and 0 <= v["finding_on_twins"] <= len(SEEDS)
    assert report["library_sha256"] == evalsets._file_hash(lib_path)


def test_a_view_that_logs_nothing_the_fault_moves_hides_it(tmp_path):
    # Runs that log only verl's probability difference (which the stale sync lifts) and the
    # entropy (which it leaves alone): TRL's and OpenRLHF's views keep only the entropy.
    root, lib_path, fp = _campaign(tmp_path, ("training/rollout_probs_diff_mean", "actor/entropy"))
    views = visibility.measure(lib_path, root)["fingerprints"][fp.id]["views"]
    assert views["verl"]["visible"] is True
    assert views["trl"]["visible"] is False and views["openrlhf"]["visible"] is False
    assert views["openrlhf"]["separation"] < 0.1


def _visibility(**views):
    return {"fingerprints": {
        "stale_weight_sync/partial/onset=0": {"fault_class": "stale_weight_sync", "variant": "partial",
                                              "from_start": True, "views": views},
        "stale_weight_sync/partial/onset=[0.2, 0.6]": {"fault_class": "stale_weight_sync", "variant": "partial",
                                                       "from_start": False,
                                                       "views": {"verl": {"visible": True}, "trl": {"visible": True}}},
    }}


def test_a_run_is_visible_by_its_variant_onset_kind_and_view():
    vis = _visibility(verl={"visible": True}, trl={"visible": False})
    assert visibility.run_visible("stale_weight_sync", "partial", 0, "verl", vis) is True
    assert visibility.run_visible("stale_weight_sync", "partial", 0, "trl", vis) is False
    assert visibility.run_visible("stale_weight_sync", "partial", 40, "trl", vis) is True  # the late one
    assert visibility.run_visible("stale_weight_sync", "partial", 0, "openrlhf", vis) is None  # not measured
    assert visibility.run_visible("stale_weight_sync", "every_n", 0, "verl", vis) is None
    assert visibility.run_visible("healthy", None, None, "trl", vis) is True


def test_visible_figures_count_only_the_runs_the_view_can_show(tmp_path):
    labels = {"a": {"label": "stale_weight_sync", "variant": "partial"},
              "b": {"label": "stale_weight_sync", "variant": "partial"},
              "c": {"label": "healthy", "variant": "none"},
              "d": {"label": "stale_weight_sync", "variant": "every_n"}}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    rows = [{"id": "a", "label": "stale_weight_sync", "onset": 0, "framework": "verl", "ranked": ["stale_weight_sync"]},
            {"id": "b", "label": "stale_weight_sync", "onset": 0, "framework": "trl", "ranked": ["stale_weight_sync"]},
            {"id": "c", "label": "healthy", "onset": None, "framework": "trl", "ranked": ["reward_fault", "healthy"]},
            {"id": "d", "label": "stale_weight_sync", "onset": 0, "framework": "verl", "ranked": ["healthy"]}]
    f = diagnosis.visible_figures(tmp_path, rows, _visibility(verl={"visible": True}, trl={"visible": False}))
    assert (f["runs"], f["of"]) == (2, 4)  # a (visible) and c (healthy)
    assert f["top1"]["k"] == 1 and f["top3"]["k"] == 2
    assert f["hidden"] == ["b"] and f["hidden_named"] == 1 and f["not_measured"] == ["d"]
    assert "2 of 4" in diagnosis.visible_table({"heldout-qwen3": {"visible": f}})


def test_a_measurement_of_another_library_is_not_used(tmp_path, campaign):
    _, lib_path, _ = campaign
    vis = tmp_path / "vis.json"
    vis.write_text(json.dumps({"library_sha256": "0" * 64, "fingerprints": {}}))
    assert diagnosis._visibility(vis, lib_path) is None
    vis.write_text(json.dumps({"library_sha256": evalsets._file_hash(lib_path), "fingerprints": {}}))
    assert diagnosis._visibility(vis, lib_path) == {"library_sha256": evalsets._file_hash(lib_path), "fingerprints": {}}
    assert diagnosis._visibility(tmp_path / "absent.json", lib_path) is None
