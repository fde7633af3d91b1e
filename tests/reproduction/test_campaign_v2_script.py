"""benchmarks/campaign_v2.py keeps finished traces outside its scratch work directory: a lost work
directory gets them back (hash-checked), a trace that does not match is run again, and a proxy
rebuilt with other weights stops the campaign rather than mixing two proxies."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("campaign_v2_script", ROOT / "benchmarks" / "campaign_v2.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(mod, "TRACES", tmp_path / "results" / "traces")
    return mod


def _campaign(tmp_path: Path, script) -> tuple[Path, Path, dict]:
    from moeproxy.reproduction.campaign import weights_hash

    proxy = tmp_path / "work" / "proxy"
    proxy.mkdir(parents=True)
    (proxy / "model.safetensors").write_bytes(b"weights")
    campaign = tmp_path / "work" / "campaign"
    jobs = []
    for i in range(2):
        rel = f"library/healthy/healthy-seed{i}.jsonl"
        path = campaign / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": 1, "values": {"critic/score/mean": 0.1 * i}}) + "\n")
        jobs.append({"id": f"library/healthy/seed{i}", "state": "finished", "trace": rel,
                     "trace_sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    jobs.append({"id": "library/healthy/seed2", "state": "pending", "trace": None, "trace_sha256": None})
    manifest = {"model": {"path": str(proxy), "weights_sha256": weights_hash(proxy)}, "jobs": jobs}
    (campaign / "manifest.json").write_text(json.dumps(manifest))
    script.RESULTS.mkdir(parents=True)
    (script.RESULTS / "manifest.json").write_text(json.dumps(manifest))
    for rec in jobs[:2]:
        script.keep_trace(campaign, rec)
    return proxy, campaign, manifest


def test_a_lost_work_directory_gets_the_committed_traces_back(tmp_path, script):
    proxy, campaign, manifest = _campaign(tmp_path, script)
    kept = sorted(p.read_bytes() for p in script.TRACES.rglob("*.gz"))
    script.keep_trace(campaign, manifest["jobs"][0])  # the copy is byte-identical when made again
    assert sorted(p.read_bytes() for p in script.TRACES.rglob("*.gz")) == kept
    original = {r["trace"]: (campaign / r["trace"]).read_bytes() for r in manifest["jobs"][:2]}
    for path in campaign.rglob("*"):
        if path.is_file():
            path.unlink()

    assert script.restore(proxy, campaign) == 2
    for rel, data in original.items():
        assert (campaign / rel).read_bytes() == data
    states = {r["id"]: r["state"] for r in json.loads((campaign / "manifest.json").read_text())["jobs"]}
    assert states == {"library/healthy/seed0": "finished", "library/healthy/seed1": "finished",
                      "library/healthy/seed2": "pending"}
    assert script.restore(proxy, campaign) == 0  # nothing to do the second time


def test_a_committed_trace_that_does_not_match_its_hash_is_run_again(tmp_path, script):
    proxy, campaign, manifest = _campaign(tmp_path, script)
    bad = script.TRACES / (manifest["jobs"][1]["trace"] + ".gz")
    bad.write_bytes(gzip.compress(b'{"step": 1, "values": {}}\n'))
    (campaign / "manifest.json").unlink()
    for rec in manifest["jobs"][:2]:
        (campaign / rec["trace"]).unlink()

    assert script.restore(proxy, campaign) == 1
    jobs = {r["id"]: r for r in json.loads((campaign / "manifest.json").read_text())["jobs"]}
    assert jobs["library/healthy/seed0"]["state"] == "finished"
    assert jobs["library/healthy/seed1"]["state"] == "pending" and jobs["library/healthy/seed1"]["trace"] is None
    assert not (campaign / manifest["jobs"][1]["trace"]).exists()


def test_a_proxy_rebuilt_with_other_weights_stops_the_campaign(tmp_path, script):
    proxy, campaign, _ = _campaign(tmp_path, script)
    (proxy / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="weights hash"):
        script.restore(proxy, campaign)
