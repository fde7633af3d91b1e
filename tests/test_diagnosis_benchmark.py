"""benchmarks/diagnosis.py (issue 17, item 7): the held-out jobs it runs, the frozen sets it exports
from a campaign directory (read back by the set scorer), and its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import diagnosis
import evalsets


def test_heldout_jobs_run_every_variant_once_on_new_seeds():
    pytest.importorskip("torch")  # the injectors' defaults live with the torch engine
    from moeproxy.reproduction.campaign import default_campaign
    from moeproxy.reproduction.catalogue import FAULT_CLASSES, variant_kind

    jobs = diagnosis.heldout_jobs(steps=120)
    healthy = [j for j in jobs if j.entry.fault_class == "healthy"]
    faults = [j for j in jobs if j.entry.fault_class != "healthy"]
    assert sorted(j.seed for j in healthy) == list(diagnosis.HEALTHY_SEEDS)
    assert sorted((j.entry.fault_class, j.entry.variant) for j in faults) == sorted(
        (c, v) for c, fc in FAULT_CLASSES.items() if c != "healthy" for v in fc.variants)
    library = default_campaign()
    assert not {j.seed for j in jobs} & {s for e in library.entries for s in (e.seeds or library.seeds)}
    assert {j.onset for j in faults if variant_kind(j.entry.fault_class, j.entry.variant) == "configuration"} == {0}
    code = [j.onset for j in faults if j.entry.kind == "code"]
    assert 0 in code and any(24 <= o <= 72 for o in code)  # onset 0 and mid-run (20-60% of 120 steps)
    library_magnitudes = {(e.fault_class, e.variant, e.params.get("magnitude")) for e in library.entries}
    for j in faults:
        if "magnitude" in j.entry.params:
            assert (j.entry.fault_class, j.entry.variant, j.entry.params["magnitude"]) not in library_magnitudes


def _campaign_dir(root: Path) -> Path:
    jobs = []
    for i, (cls, onset) in enumerate((("healthy", None), ("gradient_overflow", 0), ("reward_fault", 40),
                                      ("healthy", None))):
        rel = f"heldout/{cls}/{cls}-seed{100 + i}.jsonl"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        steps = [{"step": k + 1, "values": {"critic/score/mean": 0.1 + 0.01 * k, "actor/entropy": 1.0 - 0.01 * k,
                                            "actor/grad_norm": float("nan") if cls == "gradient_overflow" and k > 3
                                            else 0.5, "engine/total_loss": 0.2, "actor/kl_loss": 0.001 * k,
                                            "response_length/mean": 12.0}} for k in range(12)]
        path.write_text("".join(json.dumps(s) + "\n" for s in steps))
        jobs.append({"id": f"heldout/{cls}/seed{100 + i}", "fault_class": cls, "variant": "v", "onset": onset,
                     "seed": 100 + i, "steps": 12, "fault": {"class": cls}, "state": "finished", "trace": rel,
                     "trace_sha256": "x"})
    (root / "manifest.json").write_text(json.dumps({"model": {"path": "m"}, "jobs": jobs}))
    return root


def test_export_writes_a_frozen_set_in_three_framework_views(tmp_path):
    campaign = _campaign_dir(tmp_path / "campaign")
    target = diagnosis.export_set(campaign, tmp_path / "set", "heldout-test")
    labels = json.loads((target / "labels.json").read_text())
    assert len(labels) == 4
    assert sorted({m["framework"] for m in labels.values()}) == ["openrlhf", "trl", "verl"]
    assert {m["label"] for m in labels.values()} == {"healthy", "gradient_overflow", "reward_fault"}
    evalsets.check_manifest(target)  # every file as listed
    runs = evalsets.load_set(target)
    assert len(runs) == 4
    for item in runs:
        names = {k for line in item.path.read_text().splitlines() for k in json.loads(line)["values"]}
        if item.framework == "verl":
            assert "critic/score/mean" in names and not any(n.startswith("engine/") for n in names)
        if item.framework == "trl":
            assert "reward" in names and "critic/score/mean" not in names
    nan_run = next(r for r in runs if r.label == "gradient_overflow")
    assert '"NaN"' in nan_run.path.read_text()  # non-finite values written as SPEC section 5 strings
    # Exporting again changes nothing; a changed source trace is refused rather than rewritten.
    diagnosis.export_set(campaign, target, "heldout-test")
    trace = next((campaign / "heldout" / "reward_fault").glob("*.jsonl"))
    trace.write_text(trace.read_text().replace("0.5", "0.7"))
    with pytest.raises(SystemExit, match="frozen"):
        diagnosis.export_set(campaign, target, "heldout-test")


def test_export_refuses_an_unfinished_campaign(tmp_path):
    campaign = _campaign_dir(tmp_path / "campaign")
    manifest = json.loads((campaign / "manifest.json").read_text())
    manifest["jobs"][1]["state"] = "pending"
    (campaign / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="not finished"):
        diagnosis.export_set(campaign, tmp_path / "set", "heldout-test")


def test_the_table_has_a_row_per_set_with_intervals():
    share = evalsets.share
    figures = {"engine": {"runs": 10, "top1": share(7, 10), "top3": share(9, 10), "healthy_false_alarms": share(1, 3),
                          "wrong_strong": share(0, 10)},
               "baselines": {"nan_rule": {"top1": share(3, 10)}, "random": {"top1": share(1, 10)}},
               "left_out_class_weak": share(5, 7), "triage_latency_median_s": 0.0123}
    text = diagnosis.table({"field": figures})
    row = text.splitlines()[2]
    assert row.startswith("| field | 10 | 70% [40%–89%] | 90% [60%–98%] | 1/3 | 0% [0%–28%] | 71% [36%–92%]")
    assert row.endswith("| 30% [11%–60%] | 10% [2%–40%] | 12 ms |")
