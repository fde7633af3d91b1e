"""Response formats (reward components), framework views, and the RL reference entries (issue 14)."""

from __future__ import annotations

import json
import math
import random

import pytest
from moeproxy.reproduction.errors import UnknownFormat, UnknownView
from moeproxy.reproduction.formats import FORMATS, SCRATCHPADS, format_of_config, get_format
from moeproxy.reproduction.tasks import TASKS, Example, format_prompt
from moeproxy.reproduction.views import ENGINE_ONLY, VIEW_NAMES, project

REASONING = FORMATS["reasoning"]


def test_every_task_has_a_scratchpad_and_its_target_scores_full_marks():
    assert set(SCRATCHPADS) == set(TASKS)
    longest = 0
    for name, family in TASKS.items():
        rng = random.Random(name)
        for _ in range(300):
            ex = family.sample(rng)
            target = REASONING.target(ex)
            longest = max(longest, len(target))
            assert REASONING.score(ex, target + "<eos><pad><pad>") == {"accuracy": 1.0, "format": 1.0}
    # the target and its end marker fit the rollout budget, which leaves room to move (>= 48)
    assert longest + 1 <= REASONING.max_new_tokens and REASONING.max_new_tokens >= 48


@pytest.mark.parametrize("completion,expected", [
    ("<t>1+1=2</t><a>2</a><eos>", {"accuracy": 1.0, "format": 1.0}),
    ("<t>1+1=3</t><a>3</a><eos>", {"accuracy": 0.0, "format": 1.0}),   # wrong answer, right form
    ("<a>2</a><eos>", {"accuracy": 1.0, "format": 0.0}),                # no reasoning part
    ("<t>1+1=2</t>2<eos>", {"accuracy": 0.0, "format": 0.0}),           # answer not where the parser looks
    ("<t>!!!!!!!!!!!!!!!!!!!!", {"accuracy": 0.0, "format": 0.0}),      # ran to the limit
])
def test_reasoning_components_follow_what_the_response_contains(completion, expected):
    assert REASONING.score(Example("addition", "1+1=", "2"), completion) == expected


def test_a_checkpoint_without_a_format_is_the_answer_format():
    assert format_of_config({}).name == "answer"
    assert format_of_config({"task_format": "reasoning"}) is REASONING
    with pytest.raises(UnknownFormat, match="known"):
        get_format("xml")


def test_scratchpads_are_worked_solutions():
    assert SCRATCHPADS["addition"](Example("addition", "47+38=", "85")) == "47+30=77,77+8=85"
    assert SCRATCHPADS["multiplication"](Example("multiplication", "305*7=", "2135")) == "300*7=2100,5*7=35,2100+35=2135"
    assert SCRATCHPADS["counting"](Example("counting", "count a:abca=", "2")) == "1..2"
    assert SCRATCHPADS["brackets"](Example("brackets", "bal:(]=", "no")) == "1x"


# --- the engine on a tiny reasoning-format model --------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def reasoning_model(tmp_path_factory):
    from moeproxy.reproduction.tokenizer import VOCAB_SIZE, build_tokenizer
    from tiny_models import build_model

    out = tmp_path_factory.mktemp("reasoning")
    model = build_model("qwen3_moe", vocab_size=VOCAB_SIZE, hidden_size=32, num_experts=8, num_experts_per_tok=2,
                        head_dim=8, max_position_embeddings=128, task_format="reasoning")
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def raw_traces(reasoning_model):
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.engine import GRPOEngine
    from moeproxy.reproduction.faults import FaultSpec, make_injector

    torch.set_num_threads(1)
    cfg = EngineConfig(prompts_per_step=4, group_size=2, ppo_mini_batch_size=2, max_new_tokens=20)
    healthy = GRPOEngine(reasoning_model, config=cfg, seed=0).run(2)
    no_kl = GRPOEngine(reasoning_model, config=cfg, seed=0,
                       injector=make_injector(FaultSpec("kl_misconfiguration", "zero_coef"))).run(2)
    return healthy, no_kl


def test_the_reward_components_and_the_total_agree(raw_traces):
    for rec in raw_traces[0]:
        v = rec["values"]
        parts = v["engine/reward/accuracy/mean"] + v["engine/reward/format/mean"]
        assert v["critic/score/mean"] == pytest.approx(parts, abs=1e-6)
        assert 0.0 <= v["engine/frac_reward_zero_std"] <= 1.0


def test_the_trl_and_openrlhf_views_hold_only_names_those_frameworks_log(raw_traces):
    healthy, no_kl = raw_traces
    trl = project(healthy, "trl")
    assert [r["step"] for r in trl] == [1, 2]  # TRL counts from 1
    names = set().union(*(r["values"] for r in trl))
    assert names <= VIEW_NAMES["trl"]
    assert {"loss", "reward", "kl", "rewards/accuracy_reward/mean", "rewards/format_reward/mean",
            "completions/clipped_ratio", "sampling/sampling_logp_difference/mean"} <= names
    assert "kl" not in set().union(*(r["values"] for r in project(no_kl, "trl")))  # beta 0: no kl
    orl = set().union(*(r["values"] for r in project(healthy, "openrlhf")))
    assert orl <= VIEW_NAMES["openrlhf"] and "train/reward" in orl and "train/vllm_kl" in orl
    verl = set().union(*(r["values"] for r in project(healthy, "verl")))
    assert not any(n.startswith("engine/") for n in verl)
    assert {n for n in verl if n.startswith(ENGINE_ONLY)}  # engine-only diagnostics kept, marked
    assert not (names | orl) & {n for n in verl if n.startswith(ENGINE_ONLY)}


def test_the_trl_loss_is_the_whole_loss(raw_traces):
    for raw, trl in zip(raw_traces[0], project(raw_traces[0], "trl")):
        v = raw["values"]
        assert math.isfinite(trl["values"]["loss"])
        # one mini-batch per step here: whole loss = policy loss + coefficient x KL
        assert trl["values"]["loss"] == pytest.approx(v["engine/pg_loss_mean"] + v["actor/kl_coef"] * v["engine/kl_mean"],
                                                      rel=1e-5, abs=1e-7)


def test_an_unknown_view_is_refused(raw_traces):
    with pytest.raises(UnknownView, match="known"):
        project(raw_traces[0], "wandb")


def test_reference_list_names_each_checkpoint_use():
    from moeproxy.reproduction.reference import REFERENCE_MODELS, list_reference_models

    rows = {r["name"]: r for r in list_reference_models()}
    assert rows["qwen3-moe-64e"]["use"] == ["fidelity"] and rows["qwen3-moe-64e-rl"]["use"] == ["rl"]
    for name, model in REFERENCE_MODELS.items():
        assert rows[name]["task_format"] == model.recipe.task_format
        if "rl" in model.use:
            assert model.recipe.task_format == "reasoning"
            assert model.config()["max_position_embeddings"] >= 19 + REASONING.max_new_tokens
    json.dumps(rows)  # what `moeproxy reference list --json` prints


def test_an_rl_starting_point_names_a_valid_engine_setting_with_prompts_that_carry_signal():
    """``rl_engine`` is an EngineConfig the checkpoint's healthy run learns under: its tasks are the
    ones whose stored held-out accuracy leaves a GRPO group something to tell apart (0.2-0.8)."""
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.reference import REFERENCE_MODELS, ReferenceModel, TrainingRecipe, rl_engine_defaults

    for name, model in REFERENCE_MODELS.items():
        assert rl_engine_defaults(name) == model.rl_engine
        if not model.rl_engine:
            continue
        config = EngineConfig(**model.rl_engine)
        info = json.loads((model.path / "training.json").read_text())["heldout_accuracy"]
        assert config.tasks and all(0.2 <= info[t] <= 0.8 for t in config.tasks), (name, config.tasks)
    assert rl_engine_defaults("not-a-model") == {}
    with pytest.raises(ValueError, match="RL starting points"):
        ReferenceModel("x", "qwen3_moe", TrainingRecipe(), rl_engine={"lr": 1e-5})


def test_prompts_are_the_same_in_both_formats():
    ex = Example("reversal", "rev:abc=", "cba")
    assert format_prompt(ex) == "rev:abc=" and REASONING.text(ex).startswith("rev:abc=<t>")
