"""The sibling note (issue 17, item 4) in the Slack message and the webhook JSON, through the outbox."""

from __future__ import annotations

from moeproxy.service.alerts.messages import (
    SEPARATOR_LINES,
    AlertMessage,
    RankedClass,
    slack_blocks,
    webhook_json,
)
from moeproxy.service.alerts.models import AlertOutbox
from moeproxy.service.alerts.outbox import deliver_due, enqueue_due, resolver_from_urls
from moeproxy.service.db import utcnow
from moeproxy.service.triage.schemas import TriageCandidate, TriageResponse, TriageSiblingNote
from moeproxy.signatures.siblings import SiblingNote
from sqlalchemy import select

NOTE = SiblingNote(
    classes=("rollout_logp_precision", "operator_numeric_noise", "stale_weight_sync"),
    scores=(0.8, 0.78, 0.77),
    shared_evidence=("training/rollout_probs_diff_mean", "rollout_corr/log_ppl_abs_diff"),
    separate_by=(
        "log rollout_corr/k3_kl: a tail on tokens with p < 0.05 shows in log space",
        "log moe/routing_agreement: <!channel> stays for precision",
        ("look at training/rollout_probs_diff_mean: a stale sync leaves it growing with steps since the "
         "last sync"),
        "recompute one batch's rollout log-probs in fp32",
        "force a full weight sync on every step",
    ),
    text="rollout_logp_precision (0.80), operator_numeric_noise (0.78) and stale_weight_sync (0.77) score "
         "within 0.05 of each other on the same evidence (training/rollout_probs_diff_mean, …): "
         "this run does not tell them apart yet.",
)


def message(**overrides) -> AlertMessage:
    base = dict(  # noqa: C408 - keyword form reads like the dataclass
        run_id=7, run_name="qwen3-grpo", project="rl-team", fault_class="rollout_logp_precision",
        family="numerical", score=0.8, strength="strong", level=2, verdict="likely rollout_logp_precision",
        evaluated_at="2026-12-02T10:00:00+00:00", url="http://moeproxy.example/runs/7", last_step=39,
        evidence=("training/rollout_probs_diff_mean jumped x12 at step 14",),
        top=(RankedClass("rollout_logp_precision", "numerical", 0.8, "strong"),),
        siblings=(NOTE,),
    )
    base.update(overrides)
    return AlertMessage(**base)


def test_slack_message_has_a_sibling_section_escaped_and_clipped():
    blocks = slack_blocks(message())["blocks"]
    assert [b["type"] for b in blocks] == [
        "header", "section", "section", "section", "section", "actions", "context"]
    text = blocks[4]["text"]["text"]
    assert text.startswith("*Close siblings: what would separate them*\n")
    assert "this run does not tell them apart yet" in text
    assert "• log rollout_corr/k3_kl: a tail on tokens with p &lt; 0.05" in text
    assert "&lt;!channel&gt;" in text and "<!channel>" not in text
    assert "growing with steps since the last sync" in text
    assert "force a full weight sync" not in text  # beyond SEPARATOR_LINES
    assert f"_{len(NOTE.separate_by) - SEPARATOR_LINES} more on the triage page_" in text
    long = SiblingNote(NOTE.classes, NOTE.scores, (), ("log x: " + "y" * 5000,), NOTE.text)
    clipped = slack_blocks(message(siblings=(long,)))["blocks"][4]["text"]["text"]
    assert len(clipped) == 3000 and clipped.endswith("…")


def test_without_a_tie_the_message_is_as_before():
    assert [b["type"] for b in slack_blocks(message(siblings=()))["blocks"]] == [
        "header", "section", "section", "section", "actions", "context"]


def test_webhook_json_carries_the_note_and_old_payloads_still_load():
    msg = message()
    body = webhook_json(msg)
    assert body["siblings"] == [NOTE.to_dict()]
    assert AlertMessage.from_json(msg.to_json()) == msg
    old = msg.to_json()
    del old["siblings"]  # an outbox row stored before sibling notes
    assert AlertMessage.from_json(old) == message(siblings=())


def test_the_note_travels_from_the_triage_through_the_outbox(alerts_db, receiver, run_id):
    triage = TriageResponse(
        run_id=run_id, evaluated_at=utcnow(), last_step=39, verdict="likely rollout_logp_precision",
        candidates=[
            TriageCandidate(fault_class=c, family="numerical", score=sc, strength="strong", evidence=["e"])
            for c, sc in zip(NOTE.classes, NOTE.scores, strict=True)
        ],
        siblings=[TriageSiblingNote(**NOTE.to_dict())],
    )
    with alerts_db.scope() as s:
        enqueue_due(s, triage, run_name="qwen3-grpo", project="rl-team", channels=["slack"],
                    public_url="http://ui")
    with alerts_db.scope() as s:
        payloads = [r.payload for r in s.scalars(select(AlertOutbox))]
    assert payloads and all(p["siblings"] == [NOTE.to_dict()] for p in payloads)

    deliver_due(alerts_db, resolver_from_urls({"slack": receiver.url}))
    sent = [b["text"]["text"] for r in receiver.accepted for b in r.body["blocks"]
            if b["type"] == "section" and "text" in b]
    assert sum("Close siblings" in t for t in sent) == len(payloads)
