"""benchmarks/evalsets.py: the intervals, the baselines, a frozen set refused when a file changed,
and one scoring of a small set against the shipped library (figures and the log line)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import evalsets  # noqa: E402


def test_wilson_interval_matches_the_textbook_values():
    lo, hi = evalsets.wilson(8, 10)  # Wilson 95% for 8/10: 0.490-0.943
    assert lo == pytest.approx(0.4902, abs=1e-3) and hi == pytest.approx(0.9433, abs=1e-3)
    assert evalsets.wilson(0, 0) == (0.0, 1.0)
    lo, hi = evalsets.wilson(0, 20)
    assert lo == 0.0 and 0.15 < hi < 0.17


def _make_set(root: Path) -> Path:
    (root / "traces").mkdir(parents=True)
    demo = ROOT / "moeproxy" / "demo_data"
    labels = {}
    for name, label in (("healthy-seed7", "healthy"), ("rollout_logp_precision-seed7", "rollout_logp_precision")):
        steps = [json.loads(line) for line in (demo / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        (root / "traces" / f"{name}.json").write_text(json.dumps({"name": name, "framework": "verl", "steps": steps}))
        labels[name] = {"label": label, "framework": "verl", "onset": 40 if label != "healthy" else None}
    # A non-finite run: the one-line rule calls it gradient_overflow.
    steps = [{"step": k, "values": {"actor/grad_norm": float("nan") if k >= 30 else 1.0, "critic/score/mean": 0.5}}
             for k in range(60)]
    (root / "traces" / "nan.json").write_text(json.dumps({"name": "nan", "framework": "verl", "steps": steps}))
    labels["nan"] = {"label": "gradient_overflow", "framework": "verl", "onset": 30}
    (root / "labels.json").write_text(json.dumps(labels))
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root)}"
             for p in sorted(root.rglob("*")) if p.is_file()]
    (root / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")
    return root


def test_a_set_is_scored_beside_the_baselines_and_the_scoring_is_logged(tmp_path):
    root = _make_set(tmp_path / "set")
    log = tmp_path / "scores.jsonl"
    f = evalsets.score_set(root, ROOT / "signatures" / "library", log=log, note="test")
    assert f["engine"]["runs"] == 3 and len(f["rows"]) == 3
    rule = f["baselines"]["nan_rule"]
    assert rule["per_class"]["gradient_overflow"]["top1"] == 1 and rule["per_class"]["healthy"]["top1"] == 1
    assert rule["per_class"]["rollout_logp_precision"]["top1"] == 0
    for fig in (f["engine"], rule, f["baselines"]["random"]):
        lo, hi = fig["top1"]["ci95"]
        assert lo <= fig["top1"]["value"] <= hi
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["set_manifest_sha256"] == hashlib.sha256((root / "MANIFEST.sha256").read_bytes()).hexdigest()
    assert entry["note"] == "test" and entry["runs"] == 3 and len(entry["library_sha256"]) == 64


def test_a_frozen_set_whose_file_changed_is_refused(tmp_path):
    root = _make_set(tmp_path / "set")
    shutil.copy(root / "traces" / "nan.json", root / "traces" / "healthy-seed7.json")
    with pytest.raises(evalsets.SetError, match="differ from MANIFEST.sha256"):
        evalsets.score_set(root, ROOT / "signatures" / "library")
