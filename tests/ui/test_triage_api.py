"""GET /api/v1/runs/{id}/triage (SPEC section 5) and the run page on held-out fault traces."""

from __future__ import annotations

import re

import pytest
from moeproxy.signatures.synthetic import synthetic_run

HELD_OUT = [
    # class, steps, onset, magnitude, seed: none of these runs built the library
    ("rollout_logp_precision", 90, 35, 1.3, 101),
    ("gradient_overflow", 80, 30, 1.0, 102),
    ("lr_misconfiguration", 100, 40, 1.5, 103),
]


@pytest.mark.parametrize(
    ("fault_class", "steps", "onset", "magnitude", "seed"), HELD_OUT, ids=[h[0] for h in HELD_OUT]
)
def test_held_out_trace_ranks_its_class_first_in_api_and_page(
    ui_client, auth, post_run, fault_class, steps, onset, magnitude, seed
):
    run = synthetic_run(fault_class, steps=steps, onset=onset, magnitude=magnitude, seed=seed)
    run_id = post_run(run, f"heldout-{fault_class}")

    body = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert set(body) >= {"run_id", "evaluated_at", "candidates", "verdict"}
    ranked = [c["fault_class"] for c in body["candidates"]]
    assert ranked[0] == fault_class
    assert "healthy" in ranked  # healthy is ranked as a class
    scores = [c["score"] for c in body["candidates"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    top = body["candidates"][0]
    assert top["strength"] == "strong" and top["family"] and top["evidence"]
    assert fault_class in body["verdict"]

    page = ui_client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    first_row = re.search(r'data-fault-class="([a-z_]+)"', page.text)
    assert first_row and first_row.group(1) == fault_class
    assert f'href="/faults#{fault_class}"' in page.text


def test_healthy_trace_is_not_a_fault(ui_client, auth, post_run):
    run_id = post_run(synthetic_run("healthy", steps=80, seed=104), "healthy-run")
    top = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()["candidates"][0]
    assert top["fault_class"] == "healthy" or top["strength"] == "weak"


def test_evaluation_is_stored_and_reused(ui_client, auth, post_run):
    run_id = post_run(synthetic_run("gradient_overflow", steps=70, onset=25, seed=105), "stored")
    first = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    again = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert again["evaluated_at"] == first["evaluated_at"] and again["evaluations"] == 1  # stored, not redone
    forced = ui_client.post(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert forced["evaluated_at"] >= first["evaluated_at"]
    stored = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert stored["evaluations"] == 2  # same outcome: folded into one history entry
    history = ui_client.get(f"/api/v1/runs/{run_id}/triage/history", headers=auth()).json()["changes"]
    assert len(history) == 1 and history[0]["evaluations"] == 2
    likely = {h["fault_class"]: h for h in stored["history"]}["gradient_overflow"]
    assert likely["first_likely_step"] == 69 and likely["first_likely_at"] is not None


def test_details_carry_change_points_and_expected_shapes(ui_client, auth, post_run):
    run_id = post_run(synthetic_run("rollout_logp_precision", steps=80, onset=30, seed=106), "details")
    plain = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert plain["details"] == {}
    details = ui_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()["details"]
    assert details["change_points"]["training/rollout_probs_diff_mean"] == 30
    shape = details["overlays"]["rollout_logp_precision"]["training/rollout_probs_diff_mean"]
    assert len(shape["steps"]) == len(shape["values"]) > 10 and 30 in shape["steps"]


def test_no_metrics_and_other_projects(ui_client, auth):
    run_id = ui_client.post("/api/v1/runs", json={"name": "empty"}, headers=auth()).json()["id"]
    body = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth()).json()
    assert body["candidates"] == [] and body["verdict"] == "no metrics yet"
    other = ui_client.get(f"/api/v1/runs/{run_id}/triage", headers=auth("another-project"))
    assert other.status_code == 404
    assert ui_client.get(f"/api/v1/runs/{run_id}/triage").status_code == 401


def test_overlays_are_the_library_expected_trace_at_the_scored_onset(ui_client, auth, post_run, fingerprint_library):
    """The page draws what the matcher scored (issue 15): on this run the class onset the matcher
    votes for some drawn candidates differs from the earliest change among their metrics, and every
    overlay must be `signatures.api.expected_traces` at the voted onset."""
    from moeproxy.signatures.api import canonicalise, class_onset, expected_traces, load_library, run_signature

    run = synthetic_run("rollout_logp_precision", steps=80, onset=30, seed=102)
    run_id = post_run(run, "overlay-onset")
    details = ui_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()["details"]
    library = load_library(fingerprint_library)
    sig = run_signature(canonicalise(run), library.params)
    differing = []
    for fault_class, overlay in details["overlays"].items():
        fp = library.get(details["candidates"][fault_class]["fingerprint_id"])
        assert overlay == expected_traces(sig, fp), fault_class
        if class_onset(sig, fp) != sig.onset_of(fp.affected_metrics):
            differing.append(fault_class)
    assert differing  # the case this test is about: a voted onset that is not the earliest change


def test_concurrent_first_evaluations_of_one_run_all_succeed(fresh_database_url, fingerprint_library):
    """Issue 16, defect 4: 8 evaluations of a never-evaluated run finishing at once.

    Without the run-row lock in ``triage.repository.store`` PostgreSQL answered some with
    ``UniqueViolation pk_triage_class_history``; now they queue and fold into one outcome.
    """
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from moeproxy.config import Settings
    from moeproxy.service.db import Database
    from moeproxy.service.metrics.codec import parse_ingest_body
    from moeproxy.service.metrics.repository import ingest
    from moeproxy.service.runs.models import Run
    from moeproxy.service.runs.repository import get_or_create_run
    from moeproxy.service.runs.schemas import RunCreate
    from moeproxy.service.tokens import repository as tokens
    from moeproxy.service.triage.engine import SignatureEngine
    from moeproxy.service.triage.models import TriageClassHistory, TriageEvaluation
    from moeproxy.service.triage.service import evaluate_run
    from sqlalchemy import func, select

    from ui_helpers import ingest_body

    db = Database(fresh_database_url)
    settings = Settings(database_url=fresh_database_url, fingerprints=fingerprint_library)
    engine = SignatureEngine(fingerprint_library)
    engine.warm()
    try:
        with db.scope() as s:
            project_id = tokens.get_or_create_project(s, "race").id
            run, _ = get_or_create_run(s, project_id, RunCreate(name="race", framework="verl"))
            body = ingest_body(synthetic_run("gradient_overflow", steps=60, onset=25, seed=7))
            ingest(s, run, parse_ingest_body(json.dumps(body).encode()))
            run_id = run.id
        start = threading.Barrier(8)

        def evaluate(_: int) -> str:
            start.wait()
            with db.scope() as s:
                return evaluate_run(s, s.get(Run, run_id), engine, settings)[0].verdict

        with ThreadPoolExecutor(8) as pool:
            verdicts = list(pool.map(evaluate, range(8)))  # re-raises any thread's exception
        assert len(set(verdicts)) == 1
        with db.scope() as s:
            rows = s.scalars(select(TriageEvaluation).where(TriageEvaluation.run_id == run_id)).all()
            assert [r.evaluations for r in rows] == [8]  # one outcome, folded eight times
            per_class = s.execute(
                select(TriageClassHistory.fault_class, func.count())
                .where(TriageClassHistory.run_id == run_id)
                .group_by(TriageClassHistory.fault_class)
            ).all()
            assert per_class and all(n == 1 for _cls, n in per_class)
    finally:
        db.dispose()


def test_a_run_whose_config_says_lora_has_its_lr_read_against_loras_range(ui_client, auth):
    """The same run at learning rate 2e-4, created once plain and once with the PEFT section the
    TRL callback sends: only the plain one is told its LR is 100x the recipes'."""
    from ui_helpers import ingest_body

    run = synthetic_run("healthy", steps=80, seed=107)
    body = ingest_body(run)
    for step in body["steps"]:
        step["values"]["actor/lr"] = 2e-4
    found = {}
    for name, config in (("full", {}), ("lora", {"peft": {"default": {"peft_type": "LORA", "r": 16}}})):
        created = ui_client.post("/api/v1/runs", json={"name": f"lr-{name}", "framework": "verl", "config": config},
                                 headers=auth())
        assert created.status_code in (200, 201), created.text
        run_id = created.json()["id"]
        assert ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth()).status_code == 200
        details = ui_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()["details"]
        found[name] = (details["settings"], {f["rule"] for f in details["findings"]})
    assert found["full"][0] == {"lora": False, "kl_coef": None, "kl_coef_max": None, "learning_rate": None} and "lr_level" in found["full"][1]
    assert found["lora"][0] == {"lora": True, "kl_coef": None, "kl_coef_max": None, "learning_rate": None}
    assert "lr_level" not in found["lora"][1]


def test_the_run_page_lists_the_whole_run_findings_and_a_lora_setting(ui_client, auth):
    """A run created with the PEFT section and an LR of 5e-2 (over even LoRA's range): the page says
    it was read as LoRA and lists the LR finding with its source; a plain run says no LoRA."""
    import html

    from ui_helpers import ingest_body

    body = ingest_body(synthetic_run("healthy", steps=80, seed=108))
    for step in body["steps"]:
        step["values"]["actor/lr"] = 5e-2
    pages = {}
    for name, config in (("plain", {}), ("lora", {"peft": {"default": {"peft_type": "LORA", "r": 16}}})):
        run_id = ui_client.post("/api/v1/runs", json={"name": f"page-{name}", "framework": "verl", "config": config},
                                headers=auth()).json()["id"]
        assert ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth()).status_code == 200
        assert ui_client.post(f"/api/v1/runs/{run_id}/triage", headers=auth()).status_code == 200
        pages[name] = html.unescape(ui_client.get(f"/runs/{run_id}").text)
    for page in pages.values():
        assert 'id="findings"' in page and 'data-rule="lr_level"' in page
        assert 'href="/faults#lr_misconfiguration"' in page
    assert "(source: lora-lr)" in pages["lora"] and 'id="settings-lora"' in pages["lora"]
    assert "(source: rl-lr)" in pages["plain"] and 'id="settings-lora"' not in pages["plain"]


def test_the_run_page_shows_the_configured_learning_rate_and_what_the_lr_never_reached(ui_client, auth):
    """A run whose config states a learning rate of 1e-6 while it logs an LR that climbs to 1% of it
    (a warm-up 100x the run): the triage details carry the configured LR, the page shows it and the
    finding; the same run created without a config shows neither."""
    import html

    from ui_helpers import ingest_body

    body = ingest_body(synthetic_run("healthy", steps=80, seed=109))
    for k, step in enumerate(body["steps"]):
        step["values"]["actor/lr"] = 1e-6 * (k + 1) / 8000
    got = {}
    for name, config in (("stated", {"actor_rollout_ref": {"actor": {"optim": {"lr": 1e-6}}}}), ("bare", {})):
        run_id = ui_client.post("/api/v1/runs", json={"name": f"lr-{name}", "framework": "verl", "config": config},
                                headers=auth()).json()["id"]
        assert ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth()).status_code == 200
        details = ui_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()["details"]
        got[name] = (details, html.unescape(ui_client.get(f"/runs/{run_id}").text))
    details, page = got["stated"]
    assert details["settings"]["learning_rate"] == 1e-6
    assert "lr_never_reached" in {f["rule"] for f in details["findings"]}
    assert 'id="settings-lr"' in page and 'data-rule="lr_never_reached"' in page and "(source: config-lr)" in page
    details, page = got["bare"]
    assert details["settings"]["learning_rate"] is None and 'id="settings-lr"' not in page
    assert "lr_never_reached" not in {f["rule"] for f in details["findings"]}


def test_a_trl_run_whose_config_has_a_negative_beta_is_named_a_kl_misconfiguration(shipped_client, auth):
    """The real TRL run with beta negated logs what its healthy twin logs; created with the
    training_args the TRL callback sends, triage names kl_misconfiguration from the config alone and
    the page shows the coefficient. The same trace with beta 0.04 keeps nothing against healthy."""
    import html
    import json
    from pathlib import Path

    body = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "trl_runs"
                       / "negative_beta.json").read_text())
    got = {}
    for name, beta in (("negated", -0.04), ("plain", 0.04)):
        created = shipped_client.post("/api/v1/runs", json={"name": f"beta-{name}", "framework": "trl",
                                                       "config": {"training_args": {"beta": beta}}}, headers=auth())
        assert created.status_code in (200, 201), created.text
        run_id = created.json()["id"]
        assert shipped_client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": body["steps"]},
                              headers=auth()).status_code == 200
        triaged = shipped_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()
        page = html.unescape(shipped_client.get(f"/runs/{run_id}").text)
        got[name] = (triaged, page)
    negated, page = got["negated"]
    assert negated["details"]["settings"]["kl_coef"] == -0.04
    assert negated["candidates"][0]["fault_class"] == "kl_misconfiguration"
    assert "kl_coef_negative" in {f["rule"] for f in negated["details"]["findings"]}
    assert 'id="settings-kl-coef"' in page and 'data-rule="kl_coef_negative"' in page and "(source: kl-penalty)" in page
    plain, page = got["plain"]
    assert plain["details"]["settings"]["kl_coef"] == 0.04
    assert "kl_coef_negative" not in {f["rule"] for f in plain["details"]["findings"]}
    assert plain["candidates"][0]["fault_class"] != "kl_misconfiguration" and "below 0" not in page


def test_a_real_trl_run_with_an_inf_gradient_is_strong_by_definition_on_the_page(shipped_client, auth):
    """A real TRL run whose gradient norm turns +inf (trl_runs_4): the finding defines
    gradient_overflow, so the verdict is strong though the score is under the TRL view's threshold,
    and the page says why next to the threshold."""
    import html
    import json
    from pathlib import Path

    body = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "trl_runs_4"
                       / "inf_grad_mid.json").read_text())
    created = shipped_client.post("/api/v1/runs", json={"name": "inf-grad", "framework": "trl",
                                                        "config": body["config"]}, headers=auth())
    run_id = created.json()["id"]
    assert shipped_client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": body["steps"]},
                               headers=auth()).status_code == 200
    triaged = shipped_client.get(f"/api/v1/runs/{run_id}/triage?details=true", headers=auth()).json()
    top = triaged["candidates"][0]
    assert (top["fault_class"], top["strength"]) == ("gradient_overflow", "strong")
    assert top["score"] < triaged["details"]["strong_threshold"]
    assert triaged["verdict"].startswith("likely gradient_overflow")
    page = html.unescape(shipped_client.get(f"/runs/{run_id}").text)
    assert "strong by definition: nonfinite is what gradient_overflow means" in page
    assert "or a finding that defines the class with nothing against it" in page


def test_a_finding_against_a_class_names_it_on_the_run_page(ui_client, auth):
    """mismatch_grows supports no class and counts against rollout_logp_precision: the page says
    so after the finding instead of an arrow to nothing."""
    import html

    from ui_helpers import ingest_body

    body = ingest_body(synthetic_run("healthy", steps=120, seed=109))
    for step in body["steps"]:
        t = step["step"]
        step["values"]["training/rollout_probs_diff_mean"] = 0.003 if t < 60 else 0.012 + 0.001 * (t - 60)
    run_id = ui_client.post("/api/v1/runs", json={"name": "grows", "framework": "verl"}, headers=auth()).json()["id"]
    assert ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=auth()).status_code == 200
    assert ui_client.post(f"/api/v1/runs/{run_id}/triage", headers=auth()).status_code == 200
    page = html.unescape(ui_client.get(f"/runs/{run_id}").text)
    item = page[page.index('data-rule="mismatch_grows"'):]
    item = item[:item.index("</li>")]
    assert 'against <a href="/faults#rollout_logp_precision">rollout_logp_precision</a>' in item
    assert "→" not in item
