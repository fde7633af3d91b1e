"""Metric aliases: the seeded vocabulary (SPEC section 4) and user additions, on both databases."""

from __future__ import annotations

import pytest
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, alias_index, canonical_name


def test_seed_migration_holds_the_whole_default_vocabulary(client, auth):
    aliases = client.get("/api/v1/aliases", headers=auth()).json()["aliases"]
    stored = {(a["framework"], a["name"]): a["canonical"] for a in aliases if a["scope"] == "global"}
    assert stored == {(a.framework, a.name): a.canonical for a in DEFAULT_ALIASES}


# Names each framework really logs (verl compute_data_metrics / rollout-correction metrics,
# TRL GRPOTrainer._metrics, OpenRLHF's trainers).  The expected canonical name is the
# vocabulary's own answer, so the test follows the vocabulary as it grows; what it checks is
# that the seeded table plus the service's resolution agree with it, and that each is mapped.
MAPPED = [
    ("verl", "actor/ppo_kl"),
    ("verl", "actor/kl_loss"),
    ("verl", "training/rollout_probs_diff_mean"),
    ("verl", "training/rollout_probs_diff_max"),
    ("verl", "critic/score/mean"),
    ("verl", "actor/grad_norm"),
    ("verl", "actor/pg_clipfrac"),
    ("verl", "response_length/mean"),
    ("trl", "kl"),
    ("trl", "sampling/sampling_logp_difference/mean"),
    ("trl", "loss"),
    ("trl", "completions/mean_length"),
    ("trl", "rewards/accuracy_reward/mean"),
    ("openrlhf", "train/vllm_kl"),
    ("openrlhf", "train/actor_grad_norm"),
    ("openrlhf", "train/policy_loss"),
    ("openrlhf", "train/reward"),
]


def _expected(framework: str, name: str) -> str:
    return canonical_name(name, alias_index(DEFAULT_ALIASES, framework))


@pytest.mark.parametrize("framework, name", MAPPED)
def test_framework_names_map_to_canonical(client, auth, framework, name):
    expected = _expected(framework, name)
    known = name in alias_index(DEFAULT_ALIASES, framework) or name.startswith("rewards/")
    assert known, f"{framework} {name} has no canonical name in the vocabulary"
    assert _canonical_via_api(client, auth, framework, name) == expected


@pytest.mark.parametrize(
    "framework, name, canonical",
    [
        ("verl", "actor/ppo_kl", "ppo_kl"),
        ("trl", "loss", "pg_loss"),
        ("openrlhf", "train/policy_loss", "pg_loss"),
        ("trl", "rewards/accuracy_reward/mean", "reward_component/accuracy_reward"),
        ("verl", "loss", "loss"),  # TRL's name, but not on a verl run
        ("verl", "my/custom_metric", "my/custom_metric"),  # unknown names are kept as they are
    ],
)
def test_fixed_examples(client, auth, framework, name, canonical):
    assert _canonical_via_api(client, auth, framework, name) == canonical


def _canonical_via_api(client, auth, framework: str, name: str) -> str:
    h = auth()
    run = client.post("/api/v1/runs", json={"name": f"{framework}-run", "framework": framework}, headers=h).json()
    client.post(f"/api/v1/runs/{run['id']}/metrics", json={"steps": [{"step": 0, "values": {name: 1.0}}]}, headers=h)
    names = client.get(f"/api/v1/runs/{run['id']}/metrics/names", headers=h).json()["names"]
    assert [n["name"] for n in names] == [name]
    return names[0]["canonical"]


def test_filter_by_framework_includes_wildcards(client, auth):
    h = auth()
    client.post("/api/v1/aliases", json={"framework": "*", "name": "my/kl", "canonical": "kl"}, headers=h)
    aliases = client.get("/api/v1/aliases?framework=openrlhf", headers=h).json()["aliases"]
    assert {a["framework"] for a in aliases} == {"openrlhf", "*"}
    assert {"framework": "*", "name": "my/kl", "canonical": "kl", "scope": "project"} in aliases


def test_user_alias_overrides_global_for_its_project_only(client, auth, database):
    from moeproxy.service.aliases import repository

    mine, other = auth("mine"), auth("other")
    created = client.post(
        "/api/v1/aliases", json={"framework": "verl", "name": "actor/ppo_kl", "canonical": "kl"}, headers=mine
    )
    assert created.status_code == 201 and created.json()["scope"] == "project"
    replaced = client.post(
        "/api/v1/aliases", json={"framework": "verl", "name": "actor/ppo_kl", "canonical": "kl"}, headers=mine
    )
    assert replaced.status_code == 200
    added = client.post(
        "/api/v1/aliases", json={"framework": "verl", "name": "moe/router_entropy", "canonical": "expert_entropy"}, headers=mine
    )
    assert added.status_code == 201
    with database.scope() as s:
        from moeproxy.service.tokens.repository import get_project

        mine_id, other_id = get_project(s, "mine").id, get_project(s, "other").id
        assert repository.alias_map(s, mine_id, "verl")["actor/ppo_kl"] == "kl"
        assert repository.alias_map(s, mine_id, "verl")["moe/router_entropy"] == "expert_entropy"
        assert repository.alias_map(s, other_id, "verl")["actor/ppo_kl"] == "ppo_kl"
        assert "moe/router_entropy" not in repository.alias_map(s, other_id, "verl")
    theirs = client.get("/api/v1/aliases", headers=other).json()["aliases"]
    assert all(a["scope"] == "global" for a in theirs)


@pytest.mark.parametrize(
    "body",
    [
        {"framework": "", "name": "x", "canonical": "kl"},
        {"framework": "verl", "name": "  ", "canonical": "kl"},
        {"framework": "verl", "name": "x"},
        {"framework": "verl", "name": "x", "canonical": "kl", "scope": "global"},
        {"framework": 3, "name": "x", "canonical": "kl"},
    ],
)
def test_bad_alias_bodies_are_422(client, auth, body):
    response = client.post("/api/v1/aliases", json=body, headers=auth())
    assert response.status_code == 422 and response.json()["detail"]
