"""Campaigns (issue 20): the data model (every variant, onsets, seeds), resuming a stopped campaign,
the manifest, and a job run by the API equal to the same job run by the CLIs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from moeproxy.reproduction.campaign import (
    CONFUSED_CLASSES,
    MID_RUN,
    Campaign,
    CampaignError,
    CampaignJob,
    FaultEntry,
    OnsetRule,
    campaign_from_dict,
)
from moeproxy.reproduction.catalogue import FAULT_CLASSES, variant_kind



# --- the data model (no torch) ---------------------------------------------------------------------

def test_a_drawn_onset_depends_only_on_the_job_and_lies_in_the_mid_run_range():
    rule = OnsetRule(step=None, within=MID_RUN)
    onsets = [rule.resolve("stale_weight_sync__skip_from_onset", seed, 120) for seed in range(40)]
    assert all(24 <= o <= 72 for o in onsets)  # 20-60% of 120 steps
    assert len(set(onsets)) > 5  # drawn, not one step for every seed
    assert onsets == [rule.resolve("stale_weight_sync__skip_from_onset", seed, 120) for seed in range(40)]
    assert rule.resolve("another_entry", 0, 120) != rule.resolve("stale_weight_sync__skip_from_onset", 0, 120) or \
        rule.resolve("another_entry", 1, 120) != rule.resolve("stale_weight_sync__skip_from_onset", 1, 120)
    assert OnsetRule(7).resolve("x", 3, 120) == 7


def test_the_default_campaign_runs_every_variant_at_the_onsets_its_kind_can_have():
    from moeproxy.reproduction.campaign import default_campaign

    pytest.importorskip("torch")  # the injectors' defaults say which variants take a magnitude
    campaign = default_campaign()
    assert campaign.steps >= 120 and len(campaign.seeds) >= 2
    seen = {(e.fault_class, e.variant) for e in campaign.entries}
    every = {(c, v) for c, fc in FAULT_CLASSES.items() if c != "healthy" for v in fc.variants}
    assert seen == every and len(every) == 26
    for e in campaign.entries:
        if variant_kind(e.fault_class, e.variant) == "configuration":
            assert e.onset == OnsetRule(0)
    code = {(e.fault_class, e.variant) for e in campaign.entries if e.kind == "code"}
    for key in code:
        onsets = {e.onset for e in campaign.entries if (e.fault_class, e.variant) == key}
        assert onsets == {OnsetRule(0), OnsetRule(step=None, within=MID_RUN)}, key
    magnitudes = sorted(e.params.get("magnitude", 0.3) for e in campaign.entries
                        if (e.fault_class, e.variant) == ("routing_mismatch", "router_logit_noise"))
    assert magnitudes == pytest.approx([0.3, 0.3, 0.9, 0.9])  # the default and 3x, each at both onsets
    jobs = campaign.jobs()
    for name in CONFUSED_CLASSES:
        assert {j.seed for j in jobs if j.entry.fault_class == name} == {0, 1, 2}
    assert {j.seed for j in jobs if j.entry.fault_class == "healthy"} == {0, 1, 2}  # every seed has its twin
    assert jobs[0].entry.fault_class == "healthy"
    assert len({j.id for j in jobs}) == len(jobs)


def test_the_first_campaign_format_still_loads():
    # The first format: a "jobs" list with the variant and the onset among the parameters.
    doc = {"steps": 40, "seeds": [0, 1, 2], "heldout_seeds": [],
           "jobs": [{"fault_class": "healthy", "params": {}},
                    {"fault_class": "stale_weight_sync", "params": {"variant": "skip_from_onset", "onset": 10}},
                    {"fault_class": "router_corruption", "params": {"variant": "noise", "onset": 10, "magnitude": 3.0}}]}
    campaign = campaign_from_dict(doc)
    first = next(e for e in campaign.entries if e.fault_class == "stale_weight_sync")
    assert first.variant == "skip_from_onset" and first.onset == OnsetRule(10)
    job = CampaignJob(first, seed=1, steps=campaign.steps)
    assert job.fault() == {"class": "stale_weight_sync", "variant": "skip_from_onset", "params": {"onset": 10}}
    noise = next(e for e in campaign.entries if e.fault_class == "router_corruption")
    assert dict(noise.params) == {"magnitude": 3.0}
    assert [j.entry.fault_class for j in campaign.jobs()].count("healthy") == 3  # one twin per seed


@pytest.mark.parametrize("doc, needle", [
    ([], "JSON object"),
    ({"faults": [{"fault_class": "cosmic_rays"}]}, "faults[0]: unknown fault class"),
    ({"faults": [{"fault_class": "reward_fault", "variant": "sometimes"}]}, "no variant"),
    ({"faults": [{"fault_class": "lr_misconfiguration", "variant": "lr_multiplier", "onset": 5}]},
     "configuration fault"),
    ({"faults": [{"fault_class": "reward_fault", "onset": [0.7, 0.2]}]}, "onset range"),
    ({"faults": [{"fault_class": "reward_fault", "onset": "late"}]}, "onset 'late'"),
    ({"faults": [{"fault_class": "reward_fault"}, {"fault_class": "reward_fault", "onset": 0}]}, "given twice"),
    ({"faults": [], "seeds": [0], "heldout_seeds": [0]}, "held-out seeds"),
    ({"faults": [], "steps": 3}, "at least 8 steps"),
])
def test_bad_campaign_files_are_refused_with_the_reason(doc, needle):
    with pytest.raises(CampaignError, match=None) as info:
        campaign_from_dict(doc)
    assert needle in str(info.value)


# --- running (tiny real models) ---------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.reproduction.backend import read_trace, traces_equal  # noqa: E402
from moeproxy.reproduction.campaign import run_campaign  # noqa: E402
from repro_models import cached_warm_tiny, small_config  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

#: The engine options of ``small_config`` as a campaign file writes them.
ENGINE = {"tasks": ["counting", "brackets"], "max_new_tokens": 4, "lr": 1e-4, "lr_warmup_steps": 1,
          "prompts_per_step": 8, "group_size": 4, "ppo_mini_batch_size": 2}


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    torch.set_num_threads(1)
    return cached_warm_tiny(tmp_path_factory.getbasetemp() / "repro-models")


def _campaign() -> Campaign:
    entries = (FaultEntry("stale_weight_sync", "skip_from_onset", onset=OnsetRule(step=None, within=MID_RUN)),
               FaultEntry("lr_misconfiguration", "lr_multiplier", {"magnitude": 30.0}))
    return Campaign(entries, steps=8, seeds=(0, 1), engine=ENGINE)


def test_resume_skips_finished_jobs_and_draws_the_same_onsets(warm, tmp_path):
    out = tmp_path / "campaign"
    jobs = _campaign().jobs()
    first = run_campaign(warm, jobs, small_config(), out, progress=False)
    assert sorted(first.ran) == sorted(j.id for j in jobs) and not first.failed and not first.skipped
    manifest = json.loads((out / "manifest.json").read_text())
    records = {r["id"]: r for r in manifest["jobs"]}
    assert set(records) == {j.id for j in jobs}
    for job in jobs:
        rec = records[job.id]
        assert rec["state"] == "finished" and rec["seed"] == job.seed and rec["wall_time_s"] > 0
        assert rec["onset"] == job.onset and len(rec["trace_sha256"]) == 64
    stale = [j for j in jobs if j.entry.fault_class == "stale_weight_sync"]
    assert all(2 <= records[j.id]["onset"] <= 5 for j in stale)  # 20-60% of 8 steps
    assert records[stale[0].id]["fault"]["params"]["onset"] == stale[0].onset
    config_fault = next(j for j in jobs if j.entry.fault_class == "lr_misconfiguration")
    assert "onset" not in records[config_fault.id]["fault"]["params"]  # there from step 0

    again = run_campaign(warm, jobs, small_config(), out, progress=False)
    assert again.ran == [] and sorted(again.skipped) == sorted(j.id for j in jobs)

    # A stopped campaign: one trace lost (as if the job had not finished). Only it runs again, with
    # the same drawn onset, and gives the same trace.
    lost = stale[1]
    kept = read_trace(out / records[lost.id]["trace"])
    (out / records[lost.id]["trace"]).unlink()
    resumed = run_campaign(warm, jobs, small_config(), out, progress=False)
    assert resumed.ran == [lost.id]
    rec = {r["id"]: r for r in resumed.manifest["jobs"]}[lost.id]
    assert rec["onset"] == records[lost.id]["onset"]
    assert traces_equal(read_trace(out / rec["trace"]), kept)

    entry_manifest = json.loads((out / "library" / lost.entry.slug / "manifest.json").read_text())
    assert entry_manifest["onsets"] == {str(j.seed): j.onset for j in stale}
    assert entry_manifest["view"] == "raw"
    assert entry_manifest["proxy_report"] is None  # the tiny model is not a proxy: it has no report

    # Traces restored from a copy come without their entry's manifest: a resume writes it again.
    (out / "library" / lost.entry.slug / "manifest.json").unlink()
    assert run_campaign(warm, jobs, small_config(), out, progress=False).ran == []
    assert json.loads((out / "library" / lost.entry.slug / "manifest.json").read_text()) == entry_manifest


def test_a_directory_of_another_campaign_is_refused(warm, tmp_path):
    out = tmp_path / "campaign"
    jobs = Campaign((), steps=8, seeds=(0,)).jobs()
    run_campaign(warm, jobs, small_config(), out, progress=False)
    with pytest.raises(CampaignError, match="other engine settings"):
        run_campaign(warm, jobs, small_config(lr=3e-4), out, progress=False)
    # The same weights under another path are the same model: nothing runs again.
    import shutil

    moved = shutil.copytree(warm, tmp_path / "moved-model")
    again = run_campaign(moved, jobs, small_config(), out, progress=False)
    assert again.ran == [] and again.manifest["model"]["path"] == str(moved.resolve())
    other = shutil.copytree(warm, tmp_path / "other-model")
    next(other.glob("*.safetensors")).write_bytes(b"retrained")
    with pytest.raises(CampaignError, match="other weights"):
        run_campaign(other, jobs, small_config(), out, progress=False)


def test_a_job_run_by_the_api_equals_the_same_job_run_by_the_clis(warm, tmp_path):
    from moeproxy.cli import app

    campaign = _campaign()
    api = run_campaign(warm, campaign.jobs(), small_config(), tmp_path / "api", progress=False)
    assert not api.failed
    (tmp_path / "campaign.json").write_text(json.dumps(campaign.to_dict()))
    runner = CliRunner()
    res = runner.invoke(app, ["fingerprints", "generate", "--model", str(warm), "--out", str(tmp_path / "lib"),
                              "--work", str(tmp_path / "cli"), "--campaign", str(tmp_path / "campaign.json"),
                              "--quiet", "--json"])
    assert res.exit_code == 0, res.output
    for job in campaign.jobs():
        rel = Path(job.split) / job.entry.slug / f"{job.entry.fault_class}-seed{job.seed}.jsonl"
        assert traces_equal(read_trace(tmp_path / "api" / rel), read_trace(tmp_path / "cli" / rel)), job.id

    # ... and by `moeproxy reproduce` with the onset the campaign drew.
    job = next(j for j in campaign.jobs() if j.entry.fault_class == "stale_weight_sync")
    engine_args = [a for k, v in ENGINE.items()
                   for a in ("--engine", f"{k}={','.join(v) if isinstance(v, list) else v}")]
    res = runner.invoke(app, ["reproduce", "--model", str(warm), "--fault", "stale_weight_sync",
                              "--variant", "skip_from_onset", "--param", f"onset={job.onset}", "--steps", "8",
                              "--seeds", str(job.seed), "--no-healthy", "--view", "raw", "--quiet",
                              "--out", str(tmp_path / "one"), *engine_args])
    assert res.exit_code == 0, res.output
    rel = Path(job.split) / job.entry.slug / f"stale_weight_sync-seed{job.seed}.jsonl"
    assert traces_equal(read_trace(tmp_path / "one" / f"stale_weight_sync-seed{job.seed}.jsonl"),
                        read_trace(tmp_path / "api" / rel))

    library = json.loads((tmp_path / "lib" / "fingerprints.json").read_text())
    ids = {f["id"] for f in library["fingerprints"]}
    assert any(i.startswith("stale_weight_sync/skip_from_onset/") for i in ids)
    stale = next(f for f in library["fingerprints"] if f["fault_class"] == "stale_weight_sync")
    assert stale["params"]["onset"] == list(MID_RUN)  # the rule, not one run's step
    assert stale["provenance"]["onsets"] == {str(j.seed): j.onset for j in campaign.jobs()
                                             if j.entry.fault_class == "stale_weight_sync"}
    lib_manifest = json.loads((tmp_path / "lib" / "manifest.json").read_text())
    assert lib_manifest["campaign"]["manifest"].endswith("manifest.json")
    assert len(lib_manifest["campaign"]["manifest_sha256"]) == 64


def test_bad_engine_settings_in_a_campaign_are_refused_before_anything_runs(warm, tmp_path):
    from moeproxy.cli import app

    doc = {"steps": 8, "seeds": [0], "engine": {**ENGINE, "ppo_mini_batch_size": 3}, "faults": []}
    (tmp_path / "campaign.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(app, ["fingerprints", "generate", "--model", str(warm), "--out", str(tmp_path / "lib"),
                                   "--work", str(tmp_path / "w"), "--campaign", str(tmp_path / "campaign.json"),
                                   "--quiet"])
    assert res.exit_code == 2 and "ppo_mini_batch_size" in res.output
    assert not (tmp_path / "w").exists()


class _FailsOnce:
    """A backend whose first job fails (a worker lost), as a pool's would report it."""

    name = "fails-once"

    def __init__(self):
        self.calls = 0

    def map(self, fn, inputs):
        for i, inp in enumerate(inputs):
            self.calls += 1
            yield i, (RuntimeError("worker lost") if self.calls == 1 else fn(inp))


def test_a_failed_job_is_recorded_and_retried_on_the_next_run(warm, tmp_path):
    out = tmp_path / "campaign"
    jobs = Campaign((), steps=8, seeds=(0, 1)).jobs()
    first = run_campaign(warm, jobs, small_config(), out, backend=_FailsOnce(), progress=False)
    assert list(first.failed) == [jobs[0].id] and first.ran == [jobs[1].id]
    rec = {r["id"]: r for r in json.loads((out / "manifest.json").read_text())["jobs"]}[jobs[0].id]
    assert rec["state"] == "failed" and "worker lost" in rec["error"]
    second = run_campaign(warm, jobs, small_config(), out, progress=False)
    assert second.ran == [jobs[0].id] and second.skipped == [jobs[1].id] and not second.failed


def test_jobs_run_side_by_side_in_processes_equal_the_same_jobs_run_in_process(warm, tmp_path):
    from moeproxy.reproduction.campaign import ProcessPoolBackend

    jobs = _campaign().jobs()
    side = run_campaign(warm, jobs, small_config(), tmp_path / "side", backend=ProcessPoolBackend(2, threads=1),
                        progress=False)
    one = run_campaign(warm, jobs, small_config(threads=1), tmp_path / "one", progress=False)
    assert sorted(side.ran) == sorted(j.id for j in jobs) and not side.failed and not one.failed
    assert side.manifest["backend"] == "processes"
    records = {r["id"]: r for r in side.manifest["jobs"]}
    for job in jobs:
        assert records[job.id]["threads"] == 1
        rel = records[job.id]["trace"]
        assert traces_equal(read_trace(tmp_path / "side" / rel), read_trace(tmp_path / "one" / rel)), job.id


def _marking_job(job):
    """A stand-in job for the pool's own behaviour: it marks that it ran, then takes a moment."""
    import time

    Path(job.model_path).write_text("ran")
    time.sleep(0.3)
    return job.seed


def test_a_process_pool_left_early_drops_the_jobs_it_has_not_started(tmp_path):
    from moeproxy.reproduction.campaign import JobInput, ProcessPoolBackend

    inputs = [JobInput(str(tmp_path / f"job-{i}"), {}, {}, i, 1) for i in range(16)]
    results = ProcessPoolBackend(2).map(_marking_job, inputs)
    first = next(results)
    results.close()  # the caller stops (a driver failure, Ctrl-C): the rest must not run on
    assert first[1] == first[0]
    ran = sorted(p.name for p in tmp_path.glob("job-*"))
    assert 1 <= len(ran) < len(inputs), ran


def test_an_entry_manifest_names_the_proxy_that_made_its_runs(tmp_path):
    """A campaign on a proxy records in each entry's manifest (and so in every fingerprint built from
    it) which proxy of which model ran: the report's identifying fields and the file's hash, not its
    per-layer clusters (40 KB that a 74-fingerprint library would carry 74 times)."""
    import hashlib

    from moeproxy.reproduction.campaign import PROXY_REPORT_KEYS, proxy_report_summary

    assert proxy_report_summary(tmp_path) is None
    report = {"source_model": "qwen3-moe-64e-rl", "method": "fused-kmedoids", "keep": [48] * 8,
              "num_experts": 64, "layers": [{"clusters": list(range(64))}] * 8, "memory": {"devices": {}}}
    (tmp_path / "proxy_report.json").write_text(json.dumps(report))
    summary = proxy_report_summary(tmp_path)
    assert summary == {"source_model": "qwen3-moe-64e-rl", "method": "fused-kmedoids", "keep": [48] * 8,
                       "num_experts": 64,
                       "sha256": hashlib.sha256((tmp_path / "proxy_report.json").read_bytes()).hexdigest()}
    assert "layers" not in PROXY_REPORT_KEYS and "memory" not in PROXY_REPORT_KEYS
