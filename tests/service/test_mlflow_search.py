"""The runs/search filter grammar (service/mlflow/search.py) on plain rows."""

from __future__ import annotations

import pytest
from moeproxy.service.mlflow.errors import MlflowApiError
from moeproxy.service.mlflow.models import MlflowRun
from moeproxy.service.mlflow.search import parse_filter, search


def _run(name: str, start: int, **tags: str) -> MlflowRun:
    return MlflowRun(run_uuid=name * 4, run_name=name, status="FINISHED", start_time=start, user_id="u",
                     tags=tags, params={"lr": "1e-6"})


RUNS = [_run("a", 3, note="kl and lr", phase="rl"), _run("b", 1, phase="rl"), _run("c", 2, phase="sft")]


def test_and_inside_quotes_is_part_of_the_value():
    assert [c.value for c in parse_filter("tags.note = 'kl and lr' AND tags.phase = 'rl'")] == ["kl and lr", "rl"]
    assert [r.run_name for r in search(RUNS, "tags.note = 'kl and lr'", [])] == ["a"]


@pytest.mark.parametrize(("text", "names"), [
    ("", ["a", "c", "b"]),  # newest start first, MLflow's default
    ("tags.phase = 'rl'", ["a", "b"]),
    ("tags.`phase` != 'rl'", ["c"]),
    ("run_name ILIKE 'A'", ["a"]),
    ("attributes.run_name LIKE '_'", ["a", "c", "b"]),
    ("tags.missing = 'x'", []),
    ("params.lr = '1e-6' and attr.status = 'FINISHED'", ["a", "c", "b"]),
])
def test_filters_select_the_runs_mlflow_would(text, names):
    assert [r.run_name for r in search(RUNS, text, [])] == names


def test_order_by_several_keys():
    assert [r.run_name for r in search(RUNS, "", ["status ASC", "start_time ASC"])] \
        == ["b", "c", "a"]


@pytest.mark.parametrize(("text", "needle"), [
    ("metrics.loss > 0.5", "metrics are not searchable"),
    ("attributes.start_time > 5", "on a number is not supported"),
    ("tags.phase IN ('rl')", "not supported here"),
    ("attributes.artifact_uri = 'x'", "known: run_name, status, run_id, user_id"),
    ("tags.phase = 'rl' OR tags.phase = 'sft'", "not supported here"),
])
def test_what_is_not_supported_is_refused_by_name(text, needle):
    with pytest.raises(MlflowApiError, match=needle):
        parse_filter(text)
