"""The pages through the app: runs list, run page, fault catalogue, static files (logins: test_page_logins)."""

from __future__ import annotations

import json
import re

import numpy as np

from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.signatures.synthetic import synthetic_run


def plot_data(html: str) -> dict:
    raw = re.search(r'<script type="application/json" id="plot-data">(.*?)</script>', html, re.DOTALL).group(1)
    return json.loads(raw)


def test_runs_list_newest_first_with_verdict_filters_and_pages(ui_client, auth, post_run):
    faulty = post_run(
        synthetic_run("gradient_overflow", steps=70, onset=25, seed=121), "a-faulty", project="alpha"
    )
    ui_client.get(f"/api/v1/runs/{faulty}/triage", headers=auth("alpha"))  # evaluate it
    for i in range(3):
        ui_client.post("/api/v1/runs", json={"name": f"b-{i}"}, headers=auth("beta"))

    page = ui_client.get("/")
    assert page.status_code == 200
    names = re.findall(r'<a href="/runs/\d+">([^<]+)</a>', page.text)
    assert names == ["b-2", "b-1", "b-0", "a-faulty"]
    assert 'href="/faults#gradient_overflow"' in page.text and "strong" in page.text

    alpha = ui_client.get("/?project=alpha").text
    assert re.findall(r'<a href="/runs/\d+">([^<]+)</a>', alpha) == ["a-faulty"]
    assert re.findall(
        r'<a href="/runs/\d+">([^<]+)</a>', ui_client.get("/?verdict=gradient_overflow").text
    ) == ["a-faulty"]
    assert len(re.findall(r'<a href="/runs/\d+">', ui_client.get("/?verdict=none").text)) == 3
    assert re.findall(r'<a href="/runs/\d+">', ui_client.get("/?status=finished").text) == []

    first = ui_client.get("/?per_page=2").text
    assert "page 1 of 2" in first and re.findall(r'<a href="/runs/\d+">([^<]+)</a>', first) == ["b-2", "b-1"]
    second = ui_client.get("/?per_page=2&page=2").text
    assert re.findall(r'<a href="/runs/\d+">([^<]+)</a>', second) == ["b-0", "a-faulty"]


def test_run_page_plots_overlays_change_points_and_nonfinite(ui_client, auth, post_run):
    run = synthetic_run("gradient_overflow", steps=80, onset=30, seed=122)
    run_id = post_run(run, "overflow")
    assert ui_client.post(f"/api/v1/runs/{run_id}/triage", headers=auth()).status_code == 200
    html = ui_client.get(f"/runs/{run_id}").text
    assert '<script src="/static/plotly.min.js"' in html and "cdn" not in html.lower()
    data = plot_data(html)
    figures = {f["name"]: f for f in data["key"] + data["other"]}
    grad = figures["actor/grad_norm"]
    assert grad["nonfinite"] and sum(grad["nonfinite"].values()) == int(
        (~np.isfinite(run.series["actor/grad_norm"].values)).sum()
    )
    assert grad["change_points"]
    assert any(t["name"].startswith("expected: gradient_overflow") for f in data["key"] for t in f["traces"])
    assert 'data-live="1"' in html  # a running run polls for new evaluations
    state = ui_client.get(f"/runs/{run_id}/state").json()
    assert state["live"] is True and state["version"] in html


def test_run_page_without_metrics_and_unknown_run(ui_client, auth):
    run_id = ui_client.post("/api/v1/runs", json={"name": "empty"}, headers=auth()).json()["id"]
    assert "No metrics yet" in ui_client.get(f"/runs/{run_id}").text
    assert ui_client.get("/runs/999999").status_code == 404


def test_fault_catalogue_has_an_anchor_per_class(ui_client):
    html = ui_client.get("/faults").text
    for name, fault in FAULT_CLASSES.items():
        assert f'id="{name}"' in html
        assert fault.what.split("(")[0].strip() in html


def test_plotly_is_served_from_the_installed_package(ui_client):
    response = ui_client.get("/static/plotly.min.js")
    assert response.status_code == 200 and len(response.content) > 1_000_000
    assert b"plotly" in response.content[:2000].lower()
    assert ui_client.get("/static/ui.js").status_code == 200
    assert ui_client.get("/static/../router.py").status_code == 404


def test_the_array_reader_matches_the_orm_rows(database, auth, ui_client):
    """The driver-level reader that serves the page and live triage (binary COPY on PostgreSQL, one
    cursor fetch on SQLite) against the ORM row read of the REST route, the naive reference."""
    from moeproxy.service.metrics import repository as metrics

    headers = auth()
    run_id = ui_client.post("/api/v1/runs", json={"name": "values"}, headers=headers).json()["id"]
    steps = [
        {"step": s, "values": {"a": s * 0.5, "b": ["NaN", "Infinity", "-Infinity", 1e-300, -2.5][s % 5]}}
        for s in range(0, 40, 3)
    ]
    steps.append({"step": 41, "values": {"c": 7}})
    assert (
        ui_client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": steps}, headers=headers).status_code
        == 200
    )
    with database.scope() as s:
        fast = metrics.read_metric_arrays(s, run_id)
        reference = metrics.read_metrics(s, run_id)
    assert set(fast) == set(reference) == {"a", "b", "c"}
    for name, (ref_steps, ref_values) in reference.items():
        assert np.array_equal(fast[name][0], np.asarray(ref_steps)) and fast[name][0].dtype == np.int64
        assert np.array_equal(fast[name][1], np.asarray(ref_values, dtype=float), equal_nan=True)
        assert fast[name][1].dtype == np.float64
