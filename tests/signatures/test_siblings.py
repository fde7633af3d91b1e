"""Sibling notes (issue 17, item 4): a tie on shared evidence is named with what would separate it."""

from __future__ import annotations

import pytest
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.matching import Candidate, MetricMatch
from moeproxy.signatures.siblings import SEPARATORS, SiblingNote, agreeing_metrics, sibling_notes
from moeproxy.signatures.vocabulary import CANONICAL_METRICS, CONTROL_METRICS

# canonical -> the verl name a run logs it under
SOURCES = {
    "rollout_train_logp_diff": "training/rollout_probs_diff_mean",
    "rollout_train_logp_diff_max": "training/rollout_probs_diff_max",
    "rollout_train_logp_diff_std": "training/rollout_probs_diff_std",
    "rollout_corr/log_ppl_abs_diff": "rollout_corr/log_ppl_abs_diff",
    "routing_agreement": "moe/routing_agreement",
    "reward_mean": "critic/score/mean",
    "kl": "actor/kl_loss",
    "lr": "actor/lr",
    "ppo_kl": "actor/ppo_kl",
}
MISMATCH = ("rollout_train_logp_diff", "rollout_train_logp_diff_max", "rollout_train_logp_diff_std",
            "rollout_corr/log_ppl_abs_diff")


def agree(metric: str) -> MetricMatch:
    """An affected metric that rose in the run as the fingerprint expects."""
    return MetricMatch(metric, SOURCES.get(metric, metric), True, 1, 1, 1.0)


def flat_agree(metric: str) -> MetricMatch:
    """An affected metric expected flat (the twins moved it, the fault did not) and flat in the run."""
    return MetricMatch(metric, SOURCES.get(metric, metric), True, 0, 0, 1.0)


def missed(metric: str) -> MetricMatch:
    return MetricMatch(metric, SOURCES.get(metric, metric), True, 1, 0, 0.25)


def unlogged(metric: str) -> MetricMatch:
    return MetricMatch(metric, SOURCES.get(metric, metric), True, 1, None, None)


def candidate(fault_class: str, score: float, *matches: MetricMatch) -> Candidate:
    return Candidate(fault_class, FAULT_CLASSES[fault_class].family, score, "weak",
                     ("a line",), f"{fault_class}/x", 10, matches)


def demo_like(*, gap: float = 0.0) -> list[Candidate]:
    """The shape of the demo run's ranking: three mismatch classes on the same four metrics."""
    return [
        candidate("rollout_logp_precision", 0.64, *(agree(m) for m in MISMATCH),
                  unlogged("routing_agreement")),
        candidate("operator_numeric_noise", 0.61 - gap, *(agree(m) for m in MISMATCH), flat_agree("kl")),
        candidate("stale_weight_sync", 0.60 - gap, *(agree(m) for m in MISMATCH[:3]), missed("kl")),
        candidate("lr_misconfiguration", 0.40, agree("lr"), missed("kl")),
        candidate("healthy", 0.30),
    ]


def test_a_tie_on_shared_evidence_names_what_separates_it():
    (note,) = sibling_notes(demo_like(), logged={"rollout_train_logp_diff"})
    assert note.classes == ("rollout_logp_precision", "operator_numeric_noise", "stale_weight_sync")
    assert note.scores == (0.64, 0.61, 0.60)
    # the logged names the three agree on (stale_weight_sync lacks log_ppl_abs_diff: Jaccard 3/4)
    assert note.shared_evidence == (
        "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
        "training/rollout_probs_diff_std")
    assert ("rollout_logp_precision (0.64), operator_numeric_noise (0.61) and stale_weight_sync (0.60)"
            in note.text)
    assert "within 0.05" in note.text and "training/rollout_probs_diff_mean" in note.text
    by_start = [s.split(":")[0] for s in note.separate_by]
    assert "log rollout_corr/k3_kl" in by_start and "log moe/routing_agreement" in by_start
    stale = next(s for s in note.separate_by if s.startswith("look at training/rollout_probs_diff_mean"))
    assert "growing with the steps since the last sync" in stale and "holds it flat" in stale
    assert any("recompute one batch's rollout log-probs in fp32" in s for s in note.separate_by)
    assert any("force a full weight sync" in s for s in note.separate_by)
    # metrics to log first, then metrics to look at, then tests
    kinds = [0 if s.startswith("log ") else 1 if s.startswith("look at ") else 2 for s in note.separate_by]
    assert kinds == sorted(kinds) and kinds[0] == 0 and kinds[-1] == 2
    assert SiblingNote.from_dict(note.to_dict()) == note


def test_a_gap_beyond_the_margin_is_no_tie():
    assert sibling_notes(demo_like(gap=0.03)) == ()  # 0.64 vs 0.58: 0.06 apart
    assert sibling_notes(demo_like(gap=0.03), margin=0.07)  # the margin is a parameter
    (note,) = sibling_notes(demo_like(gap=0.01))  # 0.64 vs 0.60 and 0.59
    assert len(note.classes) == 3


def test_a_class_strong_by_definition_is_in_no_tie_with_one_that_scores_above_it():
    """matching.ranked puts a class strong by definition before a weak one that scores more: that
    order is the definition's, not noise; one under it within the margin is still its sibling."""
    from dataclasses import replace

    precision, noise, stale = demo_like()[:3]
    defined = replace(stale, strength="strong")  # 0.60, ranked first for its strength
    assert sibling_notes([defined, precision, noise]) == ()  # both score above it
    (note,) = sibling_notes([defined, replace(noise, score=0.57)])
    assert note.classes == ("stale_weight_sync", "operator_numeric_noise")


def test_close_scores_on_other_evidence_are_no_tie():
    candidates = [
        candidate("rollout_logp_precision", 0.64, *(agree(m) for m in MISMATCH)),
        candidate("lr_misconfiguration", 0.63, agree("lr"), agree("kl"), agree("ppo_kl")),
        candidate("reward_fault", 0.62, agree("reward_mean"), *(agree(m) for m in MISMATCH[:1])),
        candidate("healthy", 0.62),
    ]
    assert sibling_notes(candidates) == ()


def test_agreeing_on_no_change_of_an_unaffected_metric_is_not_shared_evidence():
    # Both leave four metrics alone, and the run shows them flat: every class that leaves them
    # alone would agree, so no evidence and no note.
    flat = [MetricMatch(m, SOURCES.get(m, m), False, 0, 0, 1.0) for m in MISMATCH]
    candidates = [candidate("reward_fault", 0.5, *flat), candidate("actor_update_omission", 0.49, *flat)]
    assert agreeing_metrics(candidates[0]) == frozenset()
    assert sibling_notes(candidates) == ()


def test_staying_flat_where_the_twins_moved_is_shared_evidence():
    # Affected and expected flat: the fingerprints' healthy twins raised the reward and these faults
    # (present from step 0) did not. Two classes resting on that absence are siblings.
    candidates = [candidate("reward_fault", 1.0, flat_agree("reward_mean")),
                  candidate("actor_update_omission", 1.0, flat_agree("reward_mean")), candidate("healthy", 0.77)]
    assert agreeing_metrics(candidates[0]) == {"reward_mean"}
    (note,) = sibling_notes(candidates)
    assert note.classes == ("reward_fault", "actor_update_omission")


def test_a_metric_the_run_logs_is_looked_at_not_logged():
    candidates = demo_like()
    (not_logged,) = sibling_notes(candidates, logged=set())
    assert any(s.startswith("log moe/routing_agreement:") for s in not_logged.separate_by)
    (logged,) = sibling_notes(candidates, logged={"routing_agreement"})
    assert any(s.startswith("look at moe/routing_agreement:") for s in logged.separate_by)
    assert not any(s.startswith("log moe/routing_agreement") for s in logged.separate_by)
    # a metric seen in the run's matches is logged even when the caller did not say so
    assert any(s.startswith("look at training/rollout_probs_diff_mean:") for s in not_logged.separate_by)


def test_healthy_joins_only_from_the_top():
    fault_top = [candidate("lr_misconfiguration", 0.50, agree("lr"), agree("kl")), candidate("healthy", 0.49)]
    assert sibling_notes(fault_top) == ()
    healthy_top = [candidate("healthy", 0.50),
                   candidate("lr_misconfiguration", 0.48, agree("lr"), agree("kl")),
                   candidate("kl_misconfiguration", 0.47, agree("reward_mean"))]
    (note,) = sibling_notes(healthy_top, logged={"lr", "kl"})
    # the best fault is the anchor; kl_misconfiguration is as close but on other evidence
    assert note.classes == ("healthy", "lr_misconfiguration")
    assert "does not tell a healthy run from it" in note.text
    assert any("a healthy run keeps it flat and below 0.005" in s for s in note.separate_by)
    assert any(s.startswith("look at actor/lr:") for s in note.separate_by)


@pytest.mark.parametrize("fault_class", sorted(FAULT_CLASSES))
def test_every_catalogue_class_has_separators_on_known_metrics(fault_class):
    sep = SEPARATORS[fault_class]
    assert sep.metrics or sep.tests
    for metric in sep.metrics:
        assert metric.canonical in CANONICAL_METRICS or metric.canonical in CONTROL_METRICS, metric
        assert metric.against <= set(FAULT_CLASSES), metric.against - set(FAULT_CLASSES)
    for test in sep.tests:
        assert test.against <= set(FAULT_CLASSES)


def test_classes_one_finding_scores_alike_are_ranked_in_the_order_its_source_names_them():
    from moeproxy.signatures.levels import MISMATCH_CLASSES, Finding
    from moeproxy.signatures.matching import ranked, tie_rank

    level = Finding("rollout_mismatch_level", "rollout_train_logp_diff", "training/rollout_probs_diff_mean",
                    0.02, 0.01, MISMATCH_CLASSES, "a line", "verl-faq")
    tied = [candidate(c, 1 / 3) for c in sorted(MISMATCH_CLASSES)] + [candidate("healthy", 1 / 3)]
    assert [c.fault_class for c in ranked(tied, [level])] == [*MISMATCH_CLASSES, "healthy"]
    # Without the finding the order is alphabetical, and a better score always wins over the order.
    assert [c.fault_class for c in ranked(tied, [])] == sorted(c.fault_class for c in tied)
    ahead = [*tied, candidate("stale_weight_sync", 0.34)]
    assert ranked(ahead, [level])[0].score == 0.34
    assert tie_rank("rollout_logp_precision", [level]) == 0 and tie_rank("healthy", [level]) == float("inf")


def test_a_router_fault_tied_with_a_quiet_run_is_told_apart_by_the_balance_loss():
    from moeproxy.signatures.siblings import separating_sentences

    for tied in (("healthy", "router_corruption"), ("router_corruption", "actor_update_omission")):
        (log,) = [s for s in separating_sentences(tied) if s.startswith("log aux_loss")]
        assert "raises the MoE load-balancing loss" in log and "router_aux_loss_coef" in log
    # A run that logs it is pointed at it under its own name.
    look = separating_sentences(("healthy", "router_corruption"), logged={"balance_loss"},
                                source_of={"balance_loss": "aux_loss"})
    assert any(s.startswith("look at aux_loss") for s in look)
    # An LR fault raises it too: it separates nothing there.
    assert not [s for s in separating_sentences(("router_corruption", "lr_misconfiguration")) if "aux_loss" in s]
