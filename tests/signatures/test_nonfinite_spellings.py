"""Non-finite values: one list of accepted spellings on every path (issue 15, item 5).

Before, three tables disagreed: ``"+inf"`` and ``"INF"`` passed ``load_run`` and MLflow but REST
ingest refused them with a 422.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from moeproxy.signatures.values import NONFINITE_PATTERN, NONFINITE_SPELLINGS, format_value, parse_nonfinite

SPELLINGS = [
    ("NaN", math.nan), ("nan", math.nan), ("NAN", math.nan),
    ("Infinity", math.inf), ("infinity", math.inf), ("+Infinity", math.inf), ("inf", math.inf),
    ("INF", math.inf), ("+inf", math.inf), ("Inf", math.inf),
    ("-Infinity", -math.inf), ("-infinity", -math.inf), ("-inf", -math.inf), ("-INF", -math.inf),
]
NOT_SPELLINGS = ["", "na", "nann", "-nan", "+nan", "infinit", "infinityy", "- inf", "1e999", "None", "null"]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize(("text", "value"), SPELLINGS)
def test_every_spelling_reads_the_same_in_the_codec_and_the_file_reader(text, value):
    from moeproxy.service.metrics.codec import parse_ingest_body
    from moeproxy.signatures.canonical import parse_value

    assert _same(parse_nonfinite(text), value)
    assert re.fullmatch(NONFINITE_PATTERN, text)
    body = {"steps": [{"step": 0, "values": {"x": text}}]}
    assert _same(parse_ingest_body(json.dumps(body).encode()).by_step[0]["x"], value)  # REST ingest
    assert _same(parse_value(text), value)  # files read by `moeproxy triage` / load_run
    assert _same(parse_value(f" {text} "), value)


def test_every_spelling_is_stored_through_rest_and_mlflow(client, auth):
    h = auth()
    names = {f"m{i}": text for i, (text, _value) in enumerate(SPELLINGS)}
    expected = {f"m{i}": [format_value(value)] for i, (_text, value) in enumerate(SPELLINGS)}
    run_id = client.post("/api/v1/runs", json={"name": "spellings"}, headers=h).json()["id"]
    body = {"steps": [{"step": 0, "values": names}]}
    assert client.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=h).status_code == 200
    got = client.get(f"/api/v1/runs/{run_id}/metrics", headers=h).json()["metrics"]
    assert {k: v["values"] for k, v in got.items()} == expected

    mlflow = "/mlflow/api/2.0/mlflow"
    created = client.post(f"{mlflow}/runs/create", json={"run_name": "spellings-mlflow"}, headers=h).json()
    metrics = [{"key": k, "value": text, "timestamp": 1, "step": 0} for k, text in names.items()]
    logged = client.post(f"{mlflow}/runs/log-batch", json={"run_id": created["run"]["info"]["run_id"], "metrics": metrics}, headers=h)
    assert logged.status_code == 200, logged.text
    (listed,) = [r for r in client.get("/api/v1/runs", headers=h).json()["runs"] if r["name"] == "spellings-mlflow"]
    got = client.get(f"/api/v1/runs/{listed['id']}/metrics", headers=h).json()["metrics"]
    assert {k: v["values"] for k, v in got.items()} == expected


@pytest.mark.parametrize("text", NOT_SPELLINGS)
def test_other_strings_are_no_spelling(text):
    from moeproxy.service.errors import InvalidInput
    from moeproxy.service.metrics.codec import parse_ingest_body

    assert parse_nonfinite(text) is None and not re.fullmatch(NONFINITE_PATTERN, text)
    with pytest.raises(InvalidInput):
        parse_ingest_body(json.dumps({"steps": [{"step": 0, "values": {"x": text}}]}).encode())


def test_the_pattern_is_the_table():
    """The JSON-schema pattern (what schemathesis generates from) admits exactly the table's words."""
    import itertools

    for word in NONFINITE_SPELLINGS:
        for cased in {word, word.upper(), word.title(), word.swapcase()}:
            assert re.fullmatch(NONFINITE_PATTERN, cased) and parse_nonfinite(cased) is not None
    for sign, stem in itertools.product(["", "+", "-"], ["nan", "inf", "infinity"]):
        assert bool(re.fullmatch(NONFINITE_PATTERN, sign + stem)) == (sign + stem in NONFINITE_SPELLINGS)


def test_the_client_copy_agrees_with_the_table():
    from moeproxy.client import NONFINITE_SPELLINGS as CLIENT

    assert set(CLIENT) == set(NONFINITE_SPELLINGS)
    for word, sent in CLIENT.items():
        assert _same(parse_nonfinite(sent), NONFINITE_SPELLINGS[word])
        assert sent == format_value(NONFINITE_SPELLINGS[word])  # the client sends SPEC's three
