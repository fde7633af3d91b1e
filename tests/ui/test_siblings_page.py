"""The sibling note (issue 17, item 4) on the triage page and in the triage API, stored in a real DB."""

from __future__ import annotations

import html
import re

from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.service.db import utcnow
from moeproxy.service.triage import repository
from moeproxy.service.triage.models import TriageEvaluation
from moeproxy.service.triage.schemas import TriageCandidate, TriageResponse, TriageSiblingNote
from moeproxy.signatures.matching import Candidate, MetricMatch
from moeproxy.signatures.siblings import sibling_notes
from sqlalchemy import select

MISMATCH = {
    "rollout_train_logp_diff": "training/rollout_probs_diff_mean",
    "rollout_train_logp_diff_max": "training/rollout_probs_diff_max",
    "rollout_corr/log_ppl_abs_diff": "rollout_corr/log_ppl_abs_diff",
}
RANKING = (("rollout_logp_precision", 0.64), ("operator_numeric_noise", 0.61), ("stale_weight_sync", 0.60),
           ("healthy", 0.31))


def engine_candidates() -> list[Candidate]:
    """The demo run's tie: three mismatch classes that agree on the same three metrics."""
    agree = tuple(MetricMatch(m, src, True, 1, 1, 1.0) for m, src in MISMATCH.items())
    return [
        Candidate(c, FAULT_CLASSES[c].family, s, "weak", ("a line",), f"{c}/x", 14,
                  () if c == "healthy" else agree)
        for c, s in RANKING
    ]


def tied_triage(run_id: int) -> TriageResponse:
    candidates = engine_candidates()
    (note,) = sibling_notes(candidates, logged=set(MISMATCH))
    return TriageResponse(
        run_id=run_id,
        evaluated_at=utcnow(),
        candidates=[TriageCandidate(**c.to_dict()) for c in candidates],
        verdict="no confident match: closest is rollout_logp_precision (weak, 0.64)",
        siblings=[TriageSiblingNote(**note.to_dict())],
        last_step=39,
        details={"strong_threshold": 0.76},
    )


def make_run(ui_client, auth) -> int:
    created = ui_client.post("/api/v1/runs", json={"name": "tied", "framework": "verl"}, headers=auth())
    run_id = created.json()["id"]
    steps = [{"step": s, "values": {"training/rollout_probs_diff_mean": 0.001 * (1 + (s >= 14))}}
             for s in range(40)]
    posted = ui_client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": steps}, headers=auth())
    assert posted.status_code == 200
    return run_id


def test_the_page_shows_the_tie_and_what_separates_it(ui_client, auth, database):
    run_id = make_run(ui_client, auth)
    triage = tied_triage(run_id)
    with database.scope() as s:
        repository.store(s, triage)

    page = ui_client.get(f"/runs/{run_id}").text
    card = re.search(r'<section class="card siblings-card" id="siblings">(.*?)</section>', page, re.DOTALL)
    assert card, "no sibling card"
    body = card.group(1)
    assert page.index('id="verdict"') < page.index('id="siblings"') < page.index('id="candidates"')
    note = triage.siblings[0]
    assert html.escape(note.text, quote=False) in body
    for cls, score in zip(note.classes, note.scores, strict=True):
        assert f'<a href="/faults#{cls}">{cls}</a> <span class="score">{score:.2f}</span>' in body
    assert "<code>training/rollout_probs_diff_mean</code>" in body
    lines = re.findall(r"<li>(.*?)</li>", body.split("What would separate them")[1], re.DOTALL)
    assert [html.unescape(x) for x in lines] == note.separate_by
    assert any(x.startswith("log rollout_corr/k3_kl:") for x in note.separate_by)
    assert any(x.startswith("look at training/rollout_probs_diff_mean:") for x in note.separate_by)
    assert "p &lt; 0.05" in body  # autoescaped like every other line of the page

    api = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert api["siblings"] == [note.model_dump(mode="json")]
    detailed = ui_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()
    assert "siblings" not in detailed["details"] and detailed["details"]["strong_threshold"] == 0.76


def test_a_stored_evaluation_without_a_note_still_loads(ui_client, auth, database):
    run_id = make_run(ui_client, auth)
    with database.scope() as s:
        repository.store(s, tied_triage(run_id))
        row = s.scalar(select(TriageEvaluation).where(TriageEvaluation.run_id == run_id))
        row.details = {"strong_threshold": 0.76}  # as rows were stored before sibling notes
    assert ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()["siblings"] == []
    page = ui_client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and 'id="siblings"' not in page.text and 'id="verdict"' in page.text
