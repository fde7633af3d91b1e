"""Channels against a real local HTTP receiver: Block Kit shape, 429 + Retry-After, 5xx, 4xx, refused."""

from __future__ import annotations

import socket

from moeproxy.service.alerts.channels import JsonWebhookChannel, SlackChannel, parse_retry_after
from moeproxy.service.alerts.messages import AlertMessage, RankedClass, slack_blocks, webhook_json


def make_message(**overrides) -> AlertMessage:
    base = dict(  # noqa: C408 - keyword form reads like the dataclass
        run_id=7,
        run_name="qwen3-grpo-<7>",
        project="rl-team",
        fault_class="rollout_logp_precision",
        family="numerical",
        score=0.91,
        strength="strong",
        level=2,
        verdict="rollout_logp_precision",
        evaluated_at="2026-12-02T10:00:00+00:00",
        url="http://moeproxy.example/runs/7",
        last_step=120,
        evidence=(
            "training/rollout_probs_diff_mean jumped x12 at step 41",
            "KL rising from step 43",
            "clip fraction non-zero from step 0",
            "a fourth line that stays out of the alert",
        ),
        top=(
            RankedClass("rollout_logp_precision", "numerical", 0.91, "strong"),
            RankedClass("routing_mismatch", "routing", 0.55, "weak"),
            RankedClass("healthy", "reference", 0.1, "weak"),
        ),
    )
    base.update(overrides)
    return AlertMessage(**base)


def test_block_kit_message_has_run_link_top_classes_and_first_evidence_lines():
    payload = slack_blocks(make_message())
    assert "rollout_logp_precision" in payload["text"]
    types = [b["type"] for b in payload["blocks"]]
    assert types == ["header", "section", "section", "section", "actions", "context"]
    fields = " ".join(f["text"] for f in payload["blocks"][1]["fields"])
    assert "<http://moeproxy.example/runs/7|qwen3-grpo-&lt;7&gt;>" in fields  # mrkdwn escaped
    assert "0.91" in fields
    ranking = payload["blocks"][2]["text"]["text"]
    assert (
        ranking.index("rollout_logp_precision") < ranking.index("routing_mismatch") < ranking.index("healthy")
    )
    evidence = payload["blocks"][3]["text"]["text"]
    assert "jumped x12 at step 41" in evidence and "clip fraction" in evidence
    assert "fourth line" not in evidence
    assert payload["blocks"][4]["elements"][0]["url"] == "http://moeproxy.example/runs/7"


def test_no_slack_text_carries_a_raw_mention_or_link():
    """A run named ``<!channel>`` went through in the fallback ``text`` (issue 16, defect 7)."""
    payload = slack_blocks(
        make_message(run_name="<!channel> <@U123|x>", project="<!here>", verdict="<https://evil.example|ok>")
    )

    def texts(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "text" and isinstance(value, str):
                    yield value
                else:
                    yield from texts(value)
        elif isinstance(node, list):
            for item in node:
                yield from texts(item)

    every = list(texts(payload))
    assert payload["text"] in every and len(every) > 5
    for text in every:
        for raw in ("<!channel>", "<!here>", "<@U123", "<https://evil"):
            assert raw not in text, (raw, text)
    assert "&lt;!channel&gt;" in payload["text"]


def test_message_json_round_trip():
    msg = make_message()
    assert AlertMessage.from_json(msg.to_json()) == msg
    assert webhook_json(msg)["fault_class"] == "rollout_logp_precision"


def test_parse_retry_after_seconds_and_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 - 10) == 10.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_slack_200(receiver):
    result = SlackChannel(receiver.url).send(make_message())
    assert result.ok and result.status_code == 200
    assert receiver.seen[0].body["blocks"][0]["type"] == "header"


def test_slack_short_retry_after_is_waited_in_place(receiver):
    receiver.script = [(429, {"Retry-After": "1"})]
    result = SlackChannel(receiver.url, inline_retry_after_max_s=5).send(make_message())
    assert result.ok
    assert [s.status for s in receiver.seen] == [429, 200]
    assert receiver.seen[1].at - receiver.seen[0].at >= 1.0  # the receiver's Retry-After was honoured


def test_slack_long_retry_after_comes_back_to_the_outbox(receiver):
    receiver.script = [(429, {"Retry-After": "120"})]
    result = SlackChannel(receiver.url, inline_retry_after_max_s=5).send(make_message())
    assert not result.ok and not result.permanent
    assert result.status_code == 429 and result.retry_after_s == 120.0
    assert len(receiver.seen) == 1


def test_slack_500_is_transient_and_404_is_permanent(receiver):
    receiver.script = [(500, {}), (404, {})]
    first = SlackChannel(receiver.url).send(make_message())
    second = SlackChannel(receiver.url).send(make_message())
    assert (first.ok, first.permanent, first.status_code) == (False, False, 500)
    assert (second.ok, second.permanent, second.status_code) == (False, True, 404)


def test_refused_connection_is_transient():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for channel in (
        SlackChannel(f"http://127.0.0.1:{port}/hook"),
        JsonWebhookChannel(f"http://127.0.0.1:{port}/x"),
    ):
        result = channel.send(make_message())
        assert not result.ok and not result.permanent and result.status_code is None


def test_json_webhook_posts_the_alert_as_data(receiver):
    receiver.script = [(503, {"Retry-After": "7"})]
    first = JsonWebhookChannel(receiver.url).send(make_message())
    second = JsonWebhookChannel(receiver.url).send(make_message())
    assert (first.ok, first.retry_after_s) == (False, 7.0)
    assert second.ok
    body = receiver.accepted[0].body
    assert body["event"] == "moeproxy.triage.alert"
    assert body["run_id"] == 7 and body["score"] == 0.91 and body["url"].endswith("/runs/7")
