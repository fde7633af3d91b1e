"""benchmarks/field: the field set of runs rebuilt from public reports (issue 17, item 5) is intact
and well-formed: its files match MANIFEST.sha256 and re-render from the specs, every trace loads,
every fault class of the catalogue appears, at least six healthy runs, step counts in range, only
names each framework really logs, and every value is either read from a cited source or marked chosen.

No diagnosis here: the set is frozen before anyone scores it."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from moeproxy.reproduction.catalogue import FAULT_CLASSES
from moeproxy.reproduction.views import ENGINE_ONLY, ENGINE_PREFIX, VIEW_NAMES
from moeproxy.signatures.canonical import load_run
from moeproxy.signatures.vocabulary import CONTROL_METRICS, DEFAULT_ALIASES

FIELD = Path(__file__).resolve().parents[1] / "benchmarks" / "field"

# TRL names a reward component after its function: rewards/<function>/{mean,std} (GRPOTrainer._metrics).
TRL_REWARD_COMPONENT = re.compile(r"^rewards/[A-Za-z0-9_]+/(mean|std)$")


def _build_module():
    spec = importlib.util.spec_from_file_location("field_build", FIELD / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build():
    return _build_module()


@pytest.fixture(scope="module")
def labels():
    return json.loads((FIELD / "labels.json").read_text())


@pytest.fixture(scope="module")
def specs(build):
    return {s["id"]: s for s in build.load_specs()}


def _allowed_names(framework: str) -> set[str]:
    names = {a.name for a in DEFAULT_ALIASES if a.framework == framework} | set(VIEW_NAMES.get(framework, ()))
    # Settings a trainer logs that have no canonical name (verl's actor/kl_coef).
    names |= {n for n in CONTROL_METRICS if "/" in n and framework == "verl"}
    return names


def test_manifest_matches_and_specs_render_the_committed_traces(build):
    assert build.check() == []


def test_every_file_of_the_set_is_in_the_manifest(build):
    listed = {line.partition("  ")[2] for line in (FIELD / "MANIFEST.sha256").read_text().splitlines()}
    assert {"build.py", "labels.json"} <= listed
    assert {f"traces/{p.name}" for p in (FIELD / "traces").glob("*.json")} <= listed
    assert {f"specs/{p.name}" for p in (FIELD / "specs").glob("*.json")} <= listed


def test_size_classes_and_healthy_runs(labels):
    assert len(labels) >= 30
    counts = Counter(meta["label"] for meta in labels.values())
    assert set(counts) == set(FAULT_CLASSES)
    assert counts["healthy"] >= 6
    assert all(n >= 2 for cls, n in counts.items() if cls != "healthy")


def test_onsets_from_step_0_and_late(labels):
    kinds = Counter(meta["onset_kind"] for meta in labels.values() if meta["label"] != "healthy")
    assert kinds["start"] >= 5 and kinds["late"] >= 5
    assert all(meta["onset"] is None for meta in labels.values() if meta["label"] == "healthy")


def test_frameworks_are_spread(labels):
    frameworks = Counter(meta["framework"] for meta in labels.values())
    assert set(frameworks) == {"verl", "trl", "openrlhf"}
    healthy = Counter(meta["framework"] for meta in labels.values() if meta["label"] == "healthy")
    assert all(healthy[f] >= 2 for f in frameworks)


@pytest.mark.parametrize("run_id", sorted(json.loads((FIELD / "labels.json").read_text())))
def test_trace_loads_with_the_framework_names_it_really_logs(run_id, labels):
    meta = labels[run_id]
    path = FIELD / "traces" / f"{run_id}.json"
    run = load_run(path)
    assert run.framework == meta["framework"] and run.name == run_id
    body = json.loads(path.read_text())
    steps = [s["step"] for s in body["steps"]]
    assert 60 <= len(steps) <= 1000 and len(steps) == meta["steps"]
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert steps[0] == (1 if meta["framework"] == "trl" else 0)  # TRL counts optimizer steps from 1
    allowed = _allowed_names(meta["framework"])
    for name in run.series:
        assert not name.startswith(ENGINE_PREFIX) and not name.startswith(ENGINE_ONLY), name
        assert name in allowed or (meta["framework"] == "trl" and TRL_REWARD_COMPONENT.match(name)), (
            f"{run_id}: {name!r} is not a {meta['framework']} name")
    if meta["onset"] is not None and meta["onset"] > 0:
        assert steps[0] < meta["onset"] <= steps[-1]


def test_trl_kl_only_where_a_reference_model_is_used(specs):
    # TRL skips the reference model and logs no kl when beta is 0 (its default).
    for s in specs.values():
        if s["framework"] == "trl" and "kl" in s["metrics"]:
            assert "beta" in s["setup"], s["id"]


def test_non_finite_values_are_written_as_json_literals():
    text = (FIELD / "traces" / "verl-late-nan-exclamation-outputs.json").read_text()
    assert '"actor/grad_norm": NaN' in text
    body = json.loads(text)
    assert any(math.isnan(s["values"]["actor/grad_norm"]) for s in body["steps"])


def _leaves(node, prefix):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}")
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for v in node:
            yield from _leaves(v, prefix)
    else:
        yield prefix


def test_every_value_is_read_from_a_cited_source_or_marked_chosen(specs, labels):
    for rid, s in specs.items():
        assert s["sources"] and all(src["url"].startswith("https://") and src["title"] and src["reports"]
                                    for src in s["sources"]), rid
        urls = {src["url"] for src in s["sources"]}
        assert all(r["source"] in urls for r in s["read"]), rid
        covered = [r["field"] for r in s["read"]] + [c["field"] for c in s["chosen"]]
        assert all(c["reason"] for c in s["chosen"]), rid
        fields = ["steps", "seed"] + (["onset"] if s["onset"] else [])
        fields += list(_leaves(s["metrics"], "metrics"))
        for field in fields:
            assert any(field == c or field.startswith(c + ".") for c in covered), f"{rid}: {field} neither read nor chosen"
        assert labels[rid]["label"] == s["label"] and labels[rid]["steps"] == s["steps"]


def test_readme_lists_every_trace_and_says_these_are_reconstructions(labels):
    readme = (FIELD / "README.md").read_text()
    assert "reconstruction" in readme.lower() and "not real logs" in readme.lower()
    assert all(f"`{rid}`" in readme for rid in labels)
