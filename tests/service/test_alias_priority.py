"""The service canonicalises a run as the signature library does: where a run logs two names of one
canonical metric (verl's ``training/rollout_probs_diff_mean`` and ``rollout_corr/log_ppl_diff``;
``critic/score/mean`` and ``critic/rewards/mean``), the database's aliases keep the vocabulary's
order, so the same logged name stands for the metric. With the table's alphabetical order the
service read the log-perplexity difference where the fingerprints hold the probability difference,
and the demo's bf16 run lost its class to a tie."""

from __future__ import annotations

from pathlib import Path

from moeproxy.service.aliases import repository as aliases
from moeproxy.service.tokens.models import Project
from moeproxy.signatures.canonical import canonicalise, load_run
from moeproxy.signatures.fingerprint import load_library
from moeproxy.signatures.matching import triage

DEMO = Path(__file__).resolve().parents[2] / "moeproxy" / "demo_data" / "rollout_logp_precision-seed7.jsonl"


def test_the_services_aliases_choose_the_librarys_sources(database):
    run = load_run(DEMO, framework="verl")
    assert {"training/rollout_probs_diff_mean", "rollout_corr/log_ppl_diff", "critic/score/mean",
            "critic/rewards/mean"} <= set(run.series)
    with database.scope() as s:
        project = Project(name="aliases")
        s.add(project)
        s.flush()
        effective = aliases.effective_aliases(s, project.id, "verl")
    service = canonicalise(run, aliases=effective, framework="verl")
    library = canonicalise(run, framework="verl")
    assert service.renamed == library.renamed
    assert service.renamed["training/rollout_probs_diff_mean"] == "rollout_train_logp_diff"
    assert service.renamed["critic/score/mean"] == "reward_mean"


def test_the_demo_bf16_run_is_named_through_the_services_aliases(database):
    run = load_run(DEMO, framework="verl")
    with database.scope() as s:
        project = Project(name="demo-aliases")
        s.add(project)
        s.flush()
        effective = aliases.effective_aliases(s, project.id, "verl")
    result = triage(run, load_library(), framework="verl", aliases=effective)
    assert result.candidates[0].fault_class == "rollout_logp_precision"
    assert result.candidates[0].score - result.candidates[1].score > 0.03
