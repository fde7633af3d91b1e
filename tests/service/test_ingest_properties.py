"""Property tests of the ingest body (issue 16): any valid batch parses to what was sent (the later of
two duplicate steps winning); any other JSON is a 4xx, never a server error; over HTTP the same."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moeproxy.service.errors import InvalidInput, PayloadTooLarge
from moeproxy.service.limits import INT64_MAX
from moeproxy.service.metrics.codec import MAX_NAME_LENGTH, parse_ingest_body

NONFINITE_JSON = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40
).filter(lambda s: s.strip())
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.sampled_from(sorted(NONFINITE_JSON)),  # the strings the SPEC names
)
steps = st.integers(min_value=0, max_value=INT64_MAX)
batches = st.lists(st.tuples(steps, st.dictionaries(names, values, max_size=6)), max_size=12)


def _expected(value) -> float:
    return NONFINITE_JSON[value] if isinstance(value, str) else float(value)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=300, deadline=None)
@given(batches)
def test_a_valid_batch_parses_to_what_was_sent(entries):
    body = json.dumps({"steps": [{"step": s, "values": v} for s, v in entries]}).encode()
    parsed = parse_ingest_body(body)
    expected: dict[int, dict[str, float]] = {}
    for step, vals in entries:  # a step sent twice merges, the later value winning
        expected.setdefault(step, {}).update({k: _expected(v) for k, v in vals.items()})
    assert set(parsed.by_step) == set(expected)
    for step, vals in expected.items():
        got = parsed.by_step[step]
        assert set(got) == set(vals) and all(_same(got[k], vals[k]) for k in vals)
    assert parsed.points == sum(map(len, expected.values()))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(NONFINITE_JSON)))
def test_nonfinite_literals_are_values_too(literal):
    body = f'{{"steps": [{{"step": 3, "values": {{"loss": {literal}}}}}]}}'.encode()
    assert _same(parse_ingest_body(body).by_step[3]["loss"], NONFINITE_JSON[literal])


BAD_STEPS = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=INT64_MAX + 1, max_value=2**80),
    st.floats(),  # 3.0, NaN and infinity included: a step is an integer
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
BAD_NAMES = st.one_of(
    st.just(""),
    st.text(alphabet=" \t\n", min_size=1, max_size=4),
    st.text(min_size=0, max_size=5).map(lambda s: s + "\x00"),
    st.just("\ud800"),
    st.text(alphabet="a", min_size=MAX_NAME_LENGTH + 1, max_size=MAX_NAME_LENGTH + 50),
)
BAD_VALUES = st.one_of(
    st.booleans(), st.none(), st.lists(st.floats(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.text(max_size=8).filter(lambda s: s not in ("NaN", "nan", "Infinity", "inf", "+Infinity", "-Infinity", "-inf")),
    st.integers(min_value=10**400, max_value=10**401),
)


@settings(max_examples=300, deadline=None)
@given(
    batches.filter(bool),
    st.sampled_from(["step", "name", "value"]),
    st.data(),
)
def test_one_bad_field_anywhere_is_a_422_naming_it(entries, where, data):
    doc = {"steps": [{"step": s, "values": dict(v)} for s, v in entries]}
    i = data.draw(st.integers(0, len(doc["steps"]) - 1))
    if where == "step":
        doc["steps"][i]["step"] = data.draw(BAD_STEPS)
    elif where == "name":
        doc["steps"][i]["values"][data.draw(BAD_NAMES)] = 1.0
    else:
        doc["steps"][i]["values"]["x"] = data.draw(BAD_VALUES)
    body = json.dumps(doc, ensure_ascii=True, allow_nan=True).encode()
    with pytest.raises(InvalidInput) as caught:
        parse_ingest_body(body)
    assert f"steps[{i}]" in caught.value.detail or "steps[" in caught.value.detail


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(json_values, st.fixed_dictionaries({"steps": json_values})))
def test_any_json_is_a_batch_or_a_client_error(doc):
    body = json.dumps(doc, allow_nan=True).encode()
    try:
        parse_ingest_body(body)
    except (InvalidInput, PayloadTooLarge) as exc:
        assert exc.detail and exc.status_code in (413, 422)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_batch_or_a_client_error(raw):
    try:
        parse_ingest_body(raw)
    except (InvalidInput, PayloadTooLarge) as exc:
        assert exc.detail


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_deeply_nested_body_is_a_422(depth):
    for body in ("[" * depth + "]" * depth, '{"steps": ' + "[" * depth + "]" * depth + "}"):
        with pytest.raises(InvalidInput):
            parse_ingest_body(body.encode())


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(batches.map(lambda e: {"steps": [{"step": s, "values": v} for s, v in e]}), json_values))
def test_over_http_a_body_is_stored_or_refused_never_a_server_error(client, auth, doc):
    headers = auth("props")
    run_id = client.post("/api/v1/runs", json={"name": "props"}, headers=headers).json()["id"]
    reply = client.post(
        f"/api/v1/runs/{run_id}/metrics",
        content=json.dumps(doc, allow_nan=True),
        headers={**headers, "Content-Type": "application/json"},
    )
    assert reply.status_code in (200, 413, 422), reply.text
    assert isinstance(reply.json()["detail" if reply.status_code != 200 else "accepted"], (str, int, list))
