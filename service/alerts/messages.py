"""What an alert says, and how each channel renders it (Slack Block Kit, plain JSON)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from moeproxy.signatures.siblings import SiblingNote

# Slack limits (Block Kit reference): section text 3000 chars, header 150, 10 fields, 50 blocks.
_SECTION_MAX = 3000
_HEADER_MAX = 150
EVIDENCE_LINES = 3
TOP_CLASSES = 3
SEPARATOR_LINES = 3  # of a sibling note's "log X" / "look at X" / test sentences


@dataclass(frozen=True, slots=True)
class RankedClass:
    fault_class: str
    family: str
    score: float
    strength: str


@dataclass(frozen=True, slots=True)
class AlertMessage:
    """One alert: ``fault_class`` became strong (``level`` 1) or escalated (``level`` 2 = ranked first)."""

    run_id: int
    run_name: str
    project: str
    fault_class: str
    family: str
    score: float
    strength: str
    level: int
    verdict: str
    evaluated_at: str  # ISO 8601
    url: str
    last_step: int | None = None
    evidence: tuple[str, ...] = ()
    top: tuple[RankedClass, ...] = field(default=())
    siblings: tuple[SiblingNote, ...] = ()  # the triage's tie between close classes, if any

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["evidence"] = list(self.evidence)
        data["top"] = [asdict(t) for t in self.top]
        data["siblings"] = [n.to_dict() for n in self.siblings]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AlertMessage:
        data = dict(data)
        data["evidence"] = tuple(data.get("evidence", ()))
        data["top"] = tuple(RankedClass(**t) for t in data.get("top", ()))
        # outbox rows stored before sibling notes have no "siblings"
        data["siblings"] = tuple(SiblingNote.from_dict(n) for n in data.get("siblings", ()))
        return cls(**data)


LEVEL_WORDS = {1: "became strong", 2: "is now the most likely fault"}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: str) -> str:
    # mrkdwn control characters (Slack "Formatting text for app surfaces").
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def summary_line(msg: AlertMessage) -> str:
    step = f" at step {msg.last_step}" if msg.last_step is not None else ""
    return (
        f"{msg.fault_class} ({msg.score:.2f}, {msg.strength}) {LEVEL_WORDS.get(msg.level, 'escalated')} "
        f"in run {msg.run_name} [{msg.project}]{step}"
    )


def siblings_text(msg: AlertMessage) -> str | None:
    """The sibling section's mrkdwn (None without a tie): each note's sentence, then the first
    separating metrics and tests."""
    if not msg.siblings:
        return None
    parts = []
    for note in msg.siblings:
        lines = [_escape(note.text), *(f"• {_escape(s)}" for s in note.separate_by[:SEPARATOR_LINES])]
        if len(note.separate_by) > SEPARATOR_LINES:
            lines.append(f"_{len(note.separate_by) - SEPARATOR_LINES} more on the triage page_")
        parts.append("\n".join(lines))
    return "*Close siblings: what would separate them*\n" + "\n\n".join(parts)


def slack_blocks(msg: AlertMessage) -> dict[str, Any]:
    """The Slack payload: ``text`` (notification fallback) plus Block Kit ``blocks``."""
    ranking = "\n".join(
        f"{i}. *{_escape(t.fault_class)}* — {t.score:.2f} ({t.strength}, {_escape(t.family)})"
        for i, t in enumerate(msg.top[:TOP_CLASSES], start=1)
    )
    evidence = (
        "\n".join(f"• {_escape(line)}" for line in msg.evidence[:EVIDENCE_LINES]) or "_no evidence lines_"
    )
    siblings = siblings_text(msg)
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": _clip(f"Likely fault: {msg.fault_class}", _HEADER_MAX)},
        },
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Run*\n<{msg.url}|{_escape(msg.run_name)}>"},
                {"type": "mrkdwn", "text": f"*Project*\n{_escape(msg.project)}"},
                {"type": "mrkdwn", "text": f"*Score*\n{msg.score:.2f} ({msg.strength})"},
                {"type": "mrkdwn", "text": f"*Family*\n{_escape(msg.family)}"},
            ],
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _clip(f"*Top classes*\n{ranking}", _SECTION_MAX)},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _clip(f"*Evidence*\n{evidence}", _SECTION_MAX)},
        },
        *(
            [{"type": "section", "text": {"type": "mrkdwn", "text": _clip(siblings, _SECTION_MAX)}}]
            if siblings
            else []
        ),
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "text": {"type": "plain_text", "text": "Open triage page"},
                    "url": msg.url,
                    "action_id": "open_triage",
                }
            ],
        },
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": _clip(
                        f"verdict: {_escape(msg.verdict)} · evaluated {msg.evaluated_at}"
                        + (f" · step {msg.last_step}" if msg.last_step is not None else ""),
                        _SECTION_MAX,
                    ),
                }
            ],
        },
    ]
    # The fallback text is mrkdwn too: a run named "<!channel>" must not notify a whole channel.
    return {"text": _clip(_escape(summary_line(msg)), _SECTION_MAX), "blocks": blocks}


def webhook_json(msg: AlertMessage) -> dict[str, Any]:
    """The generic webhook payload: the alert as data, plus a one-line summary."""
    return {"event": "moeproxy.triage.alert", "summary": summary_line(msg), **msg.to_json()}


# --- reproduction jobs (issue 18): "a reproduction was started", then its outcome -------------------

JOB_KINDS = ("job_started", "job_finished")


@dataclass(frozen=True, slots=True)
class JobMessage:
    """A reproduction job started for a weak run, or finished (``state`` succeeded | failed |
    cancelled; with the run's verdict after it when it succeeded)."""

    kind: str  # one of JOB_KINDS
    run_id: int
    run_name: str
    project: str
    job_id: int
    state: str
    trigger: str
    classes: tuple[str, ...]
    url: str
    top_class: str | None = None
    score: float | None = None
    strength: str | None = None
    verdict: str | None = None
    library_version: int | None = None
    device_hours: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["classes"] = list(self.classes)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobMessage:
        return cls(**{**data, "classes": tuple(data.get("classes", ()))})


def message_from_json(payload: dict[str, Any]) -> AlertMessage | JobMessage:
    """An outbox row's message: a job's (its ``kind`` says so) or a triage alert (rows before jobs)."""
    return JobMessage.from_json(payload) if payload.get("kind") in JOB_KINDS else AlertMessage.from_json(payload)


def job_summary_line(msg: JobMessage) -> str:
    where = f"run {msg.run_name} [{msg.project}]"
    if msg.kind == "job_started":
        classes = ", ".join(msg.classes[:5]) + (f" and {len(msg.classes) - 5} more" if len(msg.classes) > 5 else "")
        return f"No confident match in {where}: reproduction job {msg.job_id} started on a proxy ({classes})"
    if msg.state == "succeeded":
        named = (f"now {msg.top_class} ({msg.score:.2f}, {msg.strength})" if msg.top_class is not None
                 else "re-triaged")
        return f"Reproduction job {msg.job_id} for {where} finished: library v{msg.library_version}, {named}"
    return f"Reproduction job {msg.job_id} for {where} {msg.state}" + (f": {msg.error}" if msg.error else "")


def job_slack_blocks(msg: JobMessage) -> dict[str, Any]:
    line = _escape(job_summary_line(msg))
    fields = [{"type": "mrkdwn", "text": f"*Run*\n<{msg.url}|{_escape(msg.run_name)}>"},
              {"type": "mrkdwn", "text": f"*Job*\n{msg.job_id} ({msg.state}, {_escape(msg.trigger)})"}]
    if msg.kind == "job_finished" and msg.verdict:
        fields.append({"type": "mrkdwn", "text": _clip(f"*Verdict now*\n{_escape(msg.verdict)}", _SECTION_MAX)})
    if msg.device_hours is not None:
        fields.append({"type": "mrkdwn", "text": f"*Device-hours*\n{msg.device_hours:.3g}"})
    header = "Reproduction started" if msg.kind == "job_started" else f"Reproduction {msg.state}"
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": header}},
              {"type": "section", "text": {"type": "mrkdwn", "text": _clip(line, _SECTION_MAX)}},
              {"type": "section", "fields": fields}]
    return {"text": _clip(line, _SECTION_MAX), "blocks": blocks}


def job_webhook_json(msg: JobMessage) -> dict[str, Any]:
    return {"event": f"moeproxy.{msg.kind.replace('_', '.')}", "summary": job_summary_line(msg), **msg.to_json()}


def slack_payload(message: AlertMessage | JobMessage) -> dict[str, Any]:
    return job_slack_blocks(message) if isinstance(message, JobMessage) else slack_blocks(message)


def webhook_payload(message: AlertMessage | JobMessage) -> dict[str, Any]:
    return job_webhook_json(message) if isinstance(message, JobMessage) else webhook_json(message)
