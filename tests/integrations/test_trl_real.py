"""TRL's own GRPOTrainer with MoeproxyCallback, posting to a real uvicorn (issue 17, item 6).

The harness of ``benchmarks/trl_runs.py`` (its config, prompts, reward functions and read-back),
run for 3 steps on a tiny Qwen3-MoE with the task suite's character tokenizer so it stays fast;
the benchmark runs the same code on the reference model. Skipped without the [bench] extra.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("trl")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trl_runs

pytestmark = [pytest.mark.ml, pytest.mark.slow]

#: What TRL's GRPOTrainer logs every step on CPU with beta != 0 and these two reward functions.
TRL_NAMES = (
    "loss",
    "grad_norm",
    "learning_rate",
    "num_tokens",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "completions/mean_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "rewards/accuracy_reward/mean",
    "rewards/accuracy_reward/std",
    "rewards/format_reward/mean",
    "clip_ratio/region_mean",
)
#: Small enough for a few seconds a run: 2 prompts x 4 completions of at most 8 tokens.
TINY_RUN = {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 8}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from moeproxy.reproduction.tokenizer import VOCAB_SIZE, build_tokenizer
    from tiny_models import build_model

    out = tmp_path_factory.mktemp("tiny-qwen3-moe")
    build_model("qwen3_moe", seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=64).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return out


def _run(key: str, server, checkpoint: Path, tmp_path: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    api = trl_runs.Api(server.url, server.token)
    return trl_runs.run_one(key, steps=3, seed=0, api=api, url=server.url, token=server.token,
                            workdir=tmp_path, model_path=checkpoint, overrides=TINY_RUN)


def _server_run(server, name: str) -> dict:
    headers = {"Authorization": f"Bearer {server.token}"}
    (run,) = [r for r in httpx.get(f"{server.url}/api/v1/runs", headers=headers).json()["runs"] if r["name"] == name]
    return run


def test_every_step_stored_under_trl_names(sqlite_live_server, tiny_checkpoint, tmp_path):
    entry = _run("healthy", sqlite_live_server, tiny_checkpoint, tmp_path)

    assert entry["ended"] == "finished" and entry["label"] == "healthy" and entry["onset"] is None
    trace = entry["trace"]
    assert trace["framework"] == "trl" and trace["name"] == "trl-healthy-seed0"
    assert [s["step"] for s in trace["steps"]] == [1, 2, 3]  # TRL counts steps from 1
    for step in trace["steps"]:
        missing = [n for n in TRL_NAMES if n not in step["values"]]
        assert not missing, f"step {step['step']} lacks {missing}"
        assert "train_runtime" not in step["values"]
    lr = trl_runs.base_config(3, 0, str(tmp_path))["learning_rate"]
    assert trace["steps"][0]["values"]["learning_rate"] == pytest.approx(lr)
    assert trace["steps"][0]["values"]["kl"] == 0.0  # the policy is its reference before the first update

    run = _server_run(sqlite_live_server, "trl-healthy-seed0")
    assert run["status"] == "finished"
    headers = {"Authorization": f"Bearer {sqlite_live_server.token}"}
    names = httpx.get(f"{sqlite_live_server.url}/api/v1/runs/{run['id']}/metrics/names", headers=headers).json()
    canonical = {n["name"]: n["canonical"] for n in names["names"]}
    assert canonical["reward"] == "reward_mean" and canonical["completions/mean_length"] == "response_length"


def test_a_nan_gradient_ends_the_run_with_nan_stored(sqlite_live_server, tiny_checkpoint, tmp_path):
    entry = _run("nan_grad", sqlite_live_server, tiny_checkpoint, tmp_path)

    assert entry["label"] == "gradient_overflow" and entry["onset"] == 2
    # TRL does not skip the step: the weights turn NaN and sampling the next batch fails.
    assert entry["ended"].startswith("RuntimeError")
    steps = entry["trace"]["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    assert math.isfinite(steps[0]["values"]["grad_norm"])
    assert steps[1]["values"]["grad_norm"] == "NaN"  # stored and read back, not dropped
    assert _server_run(sqlite_live_server, "trl-nan_grad-seed0")["status"] == "failed"


def test_batch_2s_faults_reach_the_trace_with_the_runs_config(sqlite_live_server, tiny_checkpoint, tmp_path):
    """Three of batch 2's faults on the tiny checkpoint: the trace carries the config the callback
    sent (triage reads beta from it), every group ties under constant rewards, an LR of 0 is logged."""
    from moeproxy.signatures.settings import settings_from_config

    beta = _run("negative_beta_large", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert beta["ended"] == "finished" and beta["label"] == "kl_misconfiguration"
    assert beta["trace"]["config"]["training_args"]["beta"] == -0.1
    assert settings_from_config(beta["trace"]["config"]).kl_coef == -0.1

    constant = _run("reward_constant", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert [s["values"]["reward"] for s in constant["trace"]["steps"]] == [2.0, 2.0, 2.0]
    assert all(s["values"]["frac_reward_zero_std"] == 1.0 for s in constant["trace"]["steps"])

    frozen = _run("lr_zero", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert frozen["label"] == "actor_update_omission" and frozen["config"]["learning_rate"] == 0.0
    assert all(s["values"]["learning_rate"] == 0.0 for s in frozen["trace"]["steps"])


def test_a_moe_policy_logs_its_balance_loss_and_the_run_says_its_coefficient(sqlite_live_server, tiny_checkpoint,
                                                                           tmp_path):
    """TRL logs the MoE load-balancing loss (aux_loss) at every step of a policy whose routers have a
    balance coefficient, and the callback sends that coefficient with the run's settings."""
    run = _run("healthy_aux_coef_high", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert run["ended"] == "finished"
    assert run["trace"]["config"]["training_args"]["router_aux_loss_coef"] == 0.1
    assert all(s["values"]["aux_loss"] > 0 for s in run["trace"]["steps"])


def test_batch_4s_halfway_faults_start_at_their_step(sqlite_live_server, tiny_checkpoint, tmp_path):
    """Batch 4's faults that start halfway, on the tiny checkpoint for 3 steps (halfway: step 2):
    the parameters freeze (a gradient before, none after), a +inf gradient is stored as such."""
    frozen = _run("frozen_late", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert frozen["ended"] == "finished" and frozen["onset"] == 2
    norms = [s["values"]["grad_norm"] for s in frozen["trace"]["steps"]]
    assert norms[0] > 0 and norms[1:] == [0.0, 0.0]

    inf = _run("inf_grad_mid", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert inf["label"] == "gradient_overflow" and inf["onset"] == 2
    steps = inf["trace"]["steps"]
    assert math.isfinite(steps[0]["values"]["grad_norm"])
    assert steps[1]["values"]["grad_norm"] in ("Infinity", "NaN")  # stored, not dropped


def test_a_reward_that_breaks_halfway_scores_until_its_step_then_zero():
    """The accuracy checker of ``reward_zero_late`` keeps its name (TRL logs the reward under it)
    and scores as the healthy one until the step its callback marks, then 0.0 for everything."""
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_zero_late"].apply(setup) == 100
    checker, (flag,) = setup.reward_funcs[0], setup.callbacks
    assert checker.__name__ == "accuracy_reward"
    ex = make_split("train", 1, seed=0)[0]
    kw = {"task": [ex.task], "answer": [ex.answer]}
    prompts, completions = [format_prompt(ex)], [get_format("reasoning").target(ex)]  # the right answer
    assert checker(prompts, completions, **kw) == trl_runs.accuracy_reward(prompts, completions, **kw) == [1.0]

    class State:
        global_step = 98

    flag.on_step_begin(None, State, None)  # step 99 begins: not yet
    assert checker(prompts, completions, **kw) == [1.0]
    State.global_step = 99  # step 100 begins
    flag.on_step_begin(None, State, None)
    assert checker(prompts, completions, **kw) == [0.0]


def _state(step: int):
    """What a TrainerCallback reads of the trainer's state as 1-based step ``step`` begins."""

    class State:
        global_step = step - 1

    return State


def _assert_lr_raised(key: str, at: int, factor: float) -> None:
    """``key``'s injection through a real AdamW and LambdaLR: the LR as scheduled before step ``at``,
    ``factor`` times it from that step, and the schedule going on from the raised base."""
    import torch

    opt = torch.optim.AdamW(torch.nn.Linear(4, 1).parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 - step / 200)
    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS[key].apply(setup) == at
    (raise_lr,) = setup.callbacks
    raise_lr.on_step_begin(None, _state(at - 1), None, optimizer=opt, lr_scheduler=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)  # not yet
    raise_lr.on_step_begin(None, _state(at), None, optimizer=opt, lr_scheduler=sched)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * factor)
    opt.step()
    sched.step()  # the schedule goes on from the raised base
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * factor * (1.0 - 1 / 200))


def test_batch_5s_mid_run_faults_act_on_a_real_optimizer():
    """Batch 5's faults through a real AdamW and LambdaLR: the LR schedule x100 from its step on,
    every update dropped from its step on after the gradient exists, the accuracy sign flipped."""
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split

    _assert_lr_raised("lr_x100_late", 100, 100.0)
    _assert_updates_dropped("update_dropped_late", 100, (99, 100, 101), lambda step: step >= 100)

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_sign_flip"].apply(setup) == 0
    flipped = setup.reward_funcs[0]
    ex = make_split("train", 1, seed=0)[0]
    kw = {"task": [ex.task], "answer": [ex.answer]}
    assert flipped.__name__ == "accuracy_reward"
    assert flipped([format_prompt(ex)], [get_format("reasoning").target(ex)], **kw) == [-1.0]


def _assert_updates_dropped(key: str, onset: int, steps, dropped) -> None:
    """``key``'s injection through a real AdamW: it returns ``onset``, and of each step in ``steps``
    (1-based) the update is dropped, after the gradient exists, exactly where ``dropped(step)``."""
    import torch

    lin = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS[key].apply(setup) == onset
    (drop,) = setup.callbacks
    for step in steps:
        before = lin.weight.detach().clone()
        lin(torch.ones(2, 4)).sum().backward()
        drop.on_pre_optimizer_step(None, _state(step), None, optimizer=opt)
        opt.step()
        opt.zero_grad()
        assert torch.equal(before, lin.weight) == dropped(step), (key, step)


def _assert_routers_rounded_from(checkpoint, key: str, at: int) -> None:
    """``key``'s injection on a real tiny Qwen3-MoE: it returns ``at``, leaves every weight as it was
    before step ``at``, and from it leaves every MoE gate a bf16 value and nothing else touched."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS[key].apply(setup) == at
    (cast,) = setup.callbacks
    cast.on_step_begin(None, _state(at - 1), None, model=model)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), key  # not yet
    cast.on_step_begin(None, _state(at), None, model=model)
    gates = [n for n in before if n.endswith("mlp.gate.weight")]
    assert gates, key
    for n, p in model.named_parameters():
        if n in gates:
            assert not torch.equal(before[n], p) and torch.equal(p, p.to(torch.bfloat16).float()), (key, n)
        else:
            assert torch.equal(before[n], p), (key, n)


def _assert_routers_changed(checkpoint, key: str, onset: int, acts_at: int, changed_rows: float) -> None:
    """Run ``key``'s injection on a real tiny Qwen3-MoE: it returns ``onset``, leaves every weight
    as it was before step ``acts_at``, and at that step changes ``changed_rows`` of the rows of every
    MoE layer's gate and nothing else (re-initialised rows to the initialiser's scale)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    setup = trl_runs.Setup(model=None, steps=200, config={"seed": 7})
    assert trl_runs.RUNS[key].apply(setup) == onset
    (act,) = setup.callbacks
    if acts_at > 1:
        act.on_step_begin(None, _state(acts_at - 1), None, model=model)
        assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), key  # not yet
    act.on_step_begin(None, _state(acts_at), None, model=model)
    gates = [n for n in before if n.endswith("mlp.gate.weight")]
    assert gates and len(gates) == model.config.num_hidden_layers
    for n, p in model.named_parameters():
        if n not in gates:
            assert torch.equal(before[n], p), (key, n)
            continue
        rows = (before[n] != p).any(dim=1).float().mean().item()
        assert rows == pytest.approx(changed_rows, abs=1 / p.shape[0]), (key, n)
    if "reinit" in key:
        new = torch.cat([p[(before[n] != p).any(dim=1)] for n, p in model.named_parameters() if n in gates])
        assert new.std().item() == pytest.approx(model.config.initializer_range, rel=0.2)


def test_batch_6s_faults_damage_the_routers_and_the_reward_they_name(tiny_checkpoint):
    """Batch 6 on a real tiny Qwen3-MoE: the router noise and the row re-initialisation change every
    MoE layer's gate (the noise every row, the re-initialisation a quarter of the rows, to the
    initialiser's scale) and nothing else, at their step only; the shuffled checker scores a right
    answer 0 when the other prompt's answer differs; the endless warm-up is a config edit."""
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split

    for key, at, changed_rows in (("router_noise_mid", 100, 1.0), ("router_reinit_quarter", 50, 0.25)):
        _assert_routers_changed(tiny_checkpoint, key, at, at, changed_rows)

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_shuffled"].apply(setup) == 0
    checker = setup.reward_funcs[0]
    assert checker.__name__ == "accuracy_reward"
    a, b = next((a, b) for a, b in zip(make_split("train", 40, seed=0), make_split("train", 40, seed=0)[1:],
                                          strict=False) if a.answer != b.answer)
    prompts = [format_prompt(a)] * 4 + [format_prompt(b)] * 4
    completions = [get_format("reasoning").target(a)] * 4 + [get_format("reasoning").target(b)] * 4
    kw = {"task": [a.task] * 4 + [b.task] * 4, "answer": [a.answer] * 4 + [b.answer] * 4}
    assert trl_runs.accuracy_reward(prompts, completions, **kw) == [1.0] * 8
    assert checker(prompts, completions, **kw) == [0.0] * 8

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["warmup_never_ends"].apply(setup) == 0 and setup.config["warmup_steps"] == 20_000


def test_batch_7s_faults_act_where_they_say(tiny_checkpoint):
    """Batch 7 on a real tiny Qwen3-MoE and a real AdamW: the late noise is 3x the mid-run one's
    scale; the down-cast leaves every router weight a bf16 value from its step on and no other
    weight touched; the windowed checker scores a right answer past its window 0; every second
    update is dropped from the first."""
    import torch
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split
    from transformers import AutoModelForCausalLM

    deltas = {}
    for key, at in (("router_noise_mid", 100), ("router_noise_late", 150)):
        model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
        before = [w.detach().clone() for w in trl_runs.router_gates(model)]
        setup = trl_runs.Setup(model=None, steps=200, config={"seed": 7})
        assert trl_runs.RUNS[key].apply(setup) == at
        setup.callbacks[0].on_step_begin(None, _state(at), None, model=model)
        deltas[key] = torch.stack([(w - b).std() / b.std() for w, b in zip(trl_runs.router_gates(model), before,
                                                                          strict=True)]).mean().item()
    assert deltas["router_noise_late"] == pytest.approx(3 * deltas["router_noise_mid"], rel=0.05)

    _assert_routers_rounded_from(tiny_checkpoint, "router_downcast_mid", 100)

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_window"].apply(setup) == 0
    windowed = setup.reward_funcs[0]
    ex = make_split("train", 1, seed=0)[0]
    right = get_format("reasoning").target(ex)
    kw = {"task": [ex.task], "answer": [ex.answer]}
    assert windowed.__name__ == "accuracy_reward"
    assert windowed([format_prompt(ex)], [right], **kw) == ([1.0] if len(right) <= trl_runs.REWARD_WINDOW else [0.0])
    padded = "<t>" + "x" * trl_runs.REWARD_WINDOW + right.removeprefix("<t>")  # the same answer, later
    assert trl_runs.accuracy_reward([format_prompt(ex)], [padded], **kw) == [1.0]
    assert windowed([format_prompt(ex)], [padded], **kw) == [0.0]

    _assert_updates_dropped("skip_every_other", 0, (1, 2, 3, 4), lambda step: step % 2 == 0)


def test_batch_8s_router_faults_change_the_gates_at_their_step(tiny_checkpoint):
    """Batch 8 on a real tiny Qwen3-MoE: the early noise at step 50, the noise before the first
    update (onset 0, applied as step 1 begins), half the rows re-initialised at step 120, an eighth
    of them x4 at step 100; each changes every MoE layer's gate only. Its healthy runs are config
    edits that GRPOConfig takes."""
    for key, onset, acts_at, changed_rows in (("router_noise_early", 50, 50, 1.0), ("router_noise_start", 0, 1, 1.0),
                                              ("router_reinit_half_late", 120, 120, 0.5),
                                              ("router_rows_scaled_mid", 100, 100, 0.125)):
        _assert_routers_changed(tiny_checkpoint, key, onset, acts_at, changed_rows)
    from trl import GRPOConfig

    for key, field, value in (("healthy_aux_coef_high", "router_aux_loss_coef", 0.1), ("healthy_beta_low", "beta", 0.01)):
        setup = trl_runs.Setup(model=None, steps=200, config=trl_runs.base_config(200, 140, "/tmp/unused"))
        assert trl_runs.RUNS[key].apply(setup) is None
        assert getattr(GRPOConfig(**setup.config), field) == value


def test_batch_9s_milder_faults_act_where_they_say(tiny_checkpoint):
    """Batch 9: half-scale router noise at steps 50 and 150 and an eighth of the rows re-initialised
    at step 100 change the gates only; the LR schedule x10 from step 100 through a real AdamW and
    LambdaLR; the healthy runs' sampling settings are ones GRPOConfig takes."""
    from trl import GRPOConfig

    for key, at, changed_rows in (("router_noise_mild_early", 50, 1.0), ("router_noise_mild_late", 150, 1.0),
                                  ("router_reinit_eighth_mid", 100, 0.125)):
        _assert_routers_changed(tiny_checkpoint, key, at, at, changed_rows)
    _assert_lr_raised("lr_x10_late", 100, 10.0)
    for key, field, value in (("healthy_temperature_high", "temperature", 1.2), ("healthy_top_p", "top_p", 0.9)):
        setup = trl_runs.Setup(model=None, steps=200, config=trl_runs.base_config(200, 160, "/tmp/unused"))
        assert trl_runs.RUNS[key].apply(setup) is None
        assert getattr(GRPOConfig(**setup.config), field) == value


def test_batch_2_runs_on_seeds_of_their_own_into_its_directory(tmp_path, capsys):
    keys, out, _first, own = trl_runs.BATCHES["2"]
    assert own and out.name == "trl_runs_2" and len(set(keys)) == len(keys)
    # Every later batch: runs of its own (but the kinds it repeats on purpose, each from an earlier
    # batch), in a directory of its own, on seeds after the last batch's.
    seen, last_seed = set(trl_runs.BATCHES["1"][0]), -1
    for batch in sorted(trl_runs.BATCHES, key=int):
        runs, where, first_seed, _ = trl_runs.BATCHES[batch]
        again = set(trl_runs.REPEATED.get(int(batch), ()))
        if batch != "1":
            assert where.name == f"trl_runs_{batch}" and first_seed > last_seed, batch
            assert not (set(runs) - again) & seen and again <= seen & set(runs), batch
        seen |= set(runs)
        last_seed = first_seed + len(runs) - 1
    for key in keys:  # all done: nothing is started
        (tmp_path / f"{key}.json").write_text('{"name": "x", "framework": "trl", "steps": []}')
    assert trl_runs.main(["--batch", "2", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("done before, skipped") == len(keys)


def test_a_finished_run_is_skipped_on_restart(tmp_path, capsys):
    (tmp_path / "healthy.json").write_text('{"name": "trl-healthy-seed0", "framework": "trl", "steps": []}')
    # No server is started and nothing is trained: the only run asked for is already there.
    assert trl_runs.main(["--runs", "healthy", "--out", str(tmp_path)]) == 0
    assert "healthy: done before, skipped" in capsys.readouterr().out


def test_every_run_has_a_fault_class_of_the_catalogue():
    from moeproxy.reproduction.catalogue import FAULT_CLASSES

    assert {k.label for k in trl_runs.RUNS.values()} <= set(FAULT_CLASSES)


def test_report_to_mlflow_stores_the_points_the_callback_stores(sqlite_live_server, tiny_checkpoint, tmp_path,
                                                                monkeypatch):
    """One GRPOTrainer run logging both ways at once: transformers' MLflowCallback
    (``report_to=["mlflow"]``, pointed at ``/mlflow``) and MoeproxyCallback. Both runs hold the same
    training points, and the MLflow one, which carries no framework tag, is recognised as TRL's."""
    mlflow = pytest.importorskip("mlflow")
    server = sqlite_live_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{server.url}/mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    # MLflow's fluent API keeps the tracking URI and the last experiment process-wide: earlier tests
    # pointed them at servers that are gone.
    previous_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"{server.url}/mlflow")
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    try:
        _both_ways(server, tiny_checkpoint, tmp_path)
    finally:
        mlflow.set_tracking_uri(previous_uri)


def _both_ways(server, tiny_checkpoint, tmp_path) -> None:
    import torch

    torch.set_num_threads(1)
    api = trl_runs.Api(server.url, server.token)
    entry = trl_runs.run_one("healthy", steps=3, seed=0, api=api, url=server.url, token=server.token,
                             workdir=tmp_path, model_path=tiny_checkpoint,
                             overrides={**TINY_RUN, "report_to": ["mlflow"], "run_name": "trl-via-mlflow"})
    assert entry["ended"] == "finished"
    ours = entry["trace"]
    via_mlflow = api.trace(api.run_id("trl-via-mlflow"))
    assert via_mlflow["framework"] == "trl"
    theirs = {s["step"]: s["values"] for s in via_mlflow["steps"]}
    assert [s["step"] for s in ours["steps"]] == [1, 2, 3] and set(theirs) >= {1, 2, 3}
    from moeproxy.integrations.weight_probe import NAMES

    for step in ours["steps"]:
        # The weight probe's metrics are MoeproxyCallback's own: transformers' callbacks have none.
        assert set(NAMES.values()) <= set(step["values"]) and not set(NAMES.values()) & set(theirs[step["step"]])
        for name, value in step["values"].items():
            if name in NAMES.values():
                continue
            assert name in theirs[step["step"]], (step["step"], name)
            other = theirs[step["step"]][name]
            assert other == pytest.approx(value, rel=1e-12) if isinstance(value, float) else other == value
    # MLflowCallback also logs transformers' end-of-training summary, which the callback leaves out.
    assert "train_runtime" in {n for values in theirs.values() for n in values}
    assert _server_run(server, "trl-via-mlflow")["status"] == "finished"


def test_batch_10s_faults_act_where_they_say(tiny_checkpoint):
    """Batch 10: the trainer's beta negated as step 100 begins and not before; a NaN in every
    router's gradient at step 80 only, no other gradient touched; the label noise inverts the
    checker on the prompts whose key is wrong (about 30%) and only there; the length checker pays
    length over the limit under the accuracy reward's name; the healthy settings are ones
    GRPOConfig takes."""
    import torch
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    class Trainer:
        beta = 0.04

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["negative_beta_late"].apply(setup) == 100
    trainer = Trainer()
    for hook in setup.on_trainer:
        hook(trainer)
    (flip,) = setup.callbacks
    flip.on_step_begin(None, _state(99), None)
    assert trainer.beta == 0.04  # not yet
    flip.on_step_begin(None, _state(100), None)
    assert trainer.beta == -0.04

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["nan_router_grad"].apply(setup) == 80
    (nan,) = setup.callbacks
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for step, poisoned in ((79, False), (80, True), (81, False)):
        model.zero_grad(set_to_none=True)
        nan.on_step_begin(None, _state(step), None, model=model)
        model(input_ids=ids, labels=ids).loss.backward()
        nan.on_step_end(None, _state(step), None)
        for n, p in model.named_parameters():
            if p.grad is None:
                continue
            router = n.endswith("mlp.gate.weight")
            assert bool(torch.isnan(p.grad).all()) == (poisoned and router), (step, n)
            if not (poisoned and router):
                assert torch.isfinite(p.grad).all(), (step, n)

    examples = make_split("train", 200, seed=0)
    prompts = [format_prompt(e) for e in examples]
    fmt = get_format("reasoning")
    right = [fmt.target(e) for e in examples]
    kw = {"task": [e.task for e in examples], "answer": [e.answer for e in examples]}
    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_label_noise"].apply(setup) == 0
    noisy = setup.reward_funcs[0]
    assert noisy.__name__ == "accuracy_reward"
    flipped = [trl_runs.noisy_label(p) for p in prompts]
    assert 0.2 < sum(flipped) / len(flipped) < 0.4
    assert noisy(prompts, right, **kw) == [0.0 if f else 1.0 for f in flipped]
    assert noisy(prompts, right, **kw) == noisy(prompts, right, **kw)  # fixed per prompt

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_length"].apply(setup) == 0
    by_length = setup.reward_funcs[0]
    cap = fmt.max_new_tokens
    assert by_length.__name__ == "accuracy_reward"
    assert by_length(prompts[:3], ["x" * 10, "y" * cap, "z" * (cap + 5)]) == [10 / cap, 1.0, 1.0]

    base_lr = trl_runs.base_config(200, 180, "/tmp/unused")["learning_rate"]
    for key, field, value in (("healthy_lr_double", "learning_rate", 2 * base_lr), ("healthy_clip_narrow", "epsilon", 0.1)):
        setup = trl_runs.Setup(model=None, steps=200, config=trl_runs.base_config(200, 180, "/tmp/unused"))
        assert trl_runs.RUNS[key].apply(setup) is None
        assert getattr(GRPOConfig(**setup.config), field) == pytest.approx(value)


def test_batch_11_runs_its_faults_on_wider_steps():
    """Batch 11: every run on 4 prompts x 8 completions a step (a config GRPOConfig takes), each
    with the fault, onset and reward function of the batch-2/5/10/1 run it repeats."""
    from trl import GRPOConfig

    repeats = {"wide_healthy": "healthy", "wide_healthy_cosine": "healthy_cosine",
               "wide_reward_noise": "reward_noise", "wide_reward_sign_flip": "reward_sign_flip",
               "wide_reward_label_noise": "reward_label_noise", "wide_update_dropped_late": "update_dropped_late"}
    assert set(repeats) == set(trl_runs.BATCHES["11"][0])
    for wide, narrow in repeats.items():
        made = {}
        for key in (wide, narrow):
            setup = trl_runs.Setup(model=None, steps=200, config=trl_runs.base_config(200, 200, "/tmp/unused"))
            made[key] = (trl_runs.RUNS[key].apply(setup), setup)
        (onset, w), (narrow_onset, n) = made[wide], made[narrow]
        assert onset == narrow_onset and trl_runs.RUNS[wide].label == trl_runs.RUNS[narrow].label
        config = GRPOConfig(**w.config)
        assert (config.per_device_train_batch_size, config.num_generations) == (32, 8)
        assert {k: v for k, v in w.config.items() if k not in trl_runs.WIDE} == {
            k: v for k, v in n.config.items() if k not in trl_runs.WIDE}
        assert [f.__name__ for f in w.reward_funcs] == [f.__name__ for f in n.reward_funcs]
        assert len(w.callbacks) == len(n.callbacks)


def test_the_callback_sends_what_each_step_did_to_the_weights(sqlite_live_server, tiny_checkpoint, tmp_path):
    """A real GRPOTrainer on the tiny Qwen3-MoE, 3 steps, through the server: every step of a
    healthy run moves the sampled weights and nothing moves them between steps; updates dropped from
    step 2 (after the norm was logged) leave them exactly as they were there; routers noised as step
    2 begins show as a change outside the optimizer at step 2 only, and the router rule reads it."""
    from moeproxy.signatures.canonical import RunMetrics, canonicalise
    from moeproxy.signatures.levels import whole_run_evidence

    from moeproxy.integrations.weight_probe import NAMES

    def probe(entry):
        return [{k: s["values"][v] for k, v in NAMES.items()} for s in entry["trace"]["steps"]]

    healthy = probe(_run("healthy", sqlite_live_server, tiny_checkpoint, tmp_path))
    assert all(p["update_ratio"] > 0 and p["update_ratio_min"] == p["update_ratio"] for p in healthy)
    assert all(p["outside_change"] == 0.0 and p["router_outside_change"] == 0.0 for p in healthy)

    entry = _run("update_dropped_late", sqlite_live_server, tiny_checkpoint, tmp_path)
    dropped = probe(entry)
    assert dropped[0]["update_ratio"] > 0 and [p["update_ratio"] for p in dropped[1:]] == [0.0, 0.0]
    assert all(s["values"]["grad_norm"] > 0 for s in entry["trace"]["steps"])  # the norm looks normal

    noised = _run("router_noise_mid", sqlite_live_server, tiny_checkpoint, tmp_path)
    outside = [p["router_outside_change"] for p in probe(noised)]
    assert outside[0] == 0.0 and outside[1] > 0.1 and outside[2] == 0.0
    run = canonicalise(RunMetrics.from_steps(noised["trace"]["steps"], framework="trl"))
    (found,) = [f for f in whole_run_evidence(run) if f.rule == "router_changed_outside_optimizer"]
    assert "from step 2" in found.text


def test_batch_12s_faults_act_where_they_say(tiny_checkpoint):
    """Batch 12 on a real AdamW and a real tiny Qwen3-MoE: updates dropped from step 50 and on every
    third step; the routers rounded to bf16 from step 150 and not before; the NaN at step 67."""
    steps = (1, 2, 3, 49, 50, 51, 52, 53, 54)
    _assert_updates_dropped("update_dropped_quarter", 50, steps, lambda step: step >= 50)
    _assert_updates_dropped("skip_every_third", 0, steps, lambda step: step % 3 == 0)
    _assert_routers_rounded_from(tiny_checkpoint, "router_downcast_late", 150)

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["nan_grad_third"].apply(setup) == 67


def test_batch_13s_faults_reach_the_trace_as_they_say(sqlite_live_server, tiny_checkpoint, tmp_path):
    """Batch 13 on the tiny checkpoint through the server for 3 steps (halfway: step 2): a checker
    that returns None leaves TRL's log from its step on while the format reward goes on; a reference
    synced to the policy every step gives a KL of exactly 0 while the weights move; an optimizer over
    a copy moves nothing while the gradient norm is the model's."""
    none = _run("reward_none_late", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert none["ended"] == "finished" and none["onset"] == 2 and none["label"] == "reward_fault"
    values = [s["values"] for s in none["trace"]["steps"]]
    assert "rewards/accuracy_reward/mean" in values[0]
    assert all("rewards/accuracy_reward/mean" not in v and "rewards/format_reward/mean" in v for v in values[1:])
    assert [v["reward"] for v in values[1:]] == pytest.approx([v["rewards/format_reward/mean"] for v in values[1:]])

    synced = _run("reference_synced_every_step", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert synced["config"]["sync_ref_model"] is True and synced["config"]["ref_model_mixup_alpha"] == 1.0
    values = [s["values"] for s in synced["trace"]["steps"]]
    assert [v["kl"] for v in values] == [0.0, 0.0, 0.0]
    assert all(v["moeproxy/update_ratio"] > 0 for v in values)

    copy = _run("optimizer_over_a_copy", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert copy["ended"] == "finished" and copy["label"] == "actor_update_omission"
    values = [s["values"] for s in copy["trace"]["steps"]]
    assert all(v["grad_norm"] > 0 and v["moeproxy/update_ratio"] == 0.0 for v in values)

    accumulated = _run("healthy_grad_accum", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert accumulated["config"]["gradient_accumulation_steps"] == 2
    assert [s["step"] for s in accumulated["trace"]["steps"]] == [1, 2, 3]


def test_batch_14s_faults_reach_the_trace_as_they_say(sqlite_live_server, tiny_checkpoint, tmp_path):
    """Batch 14 on the tiny checkpoint through the server for 3 steps (halfway: step 2): the
    accuracy reward weighted -1 in the total TRL logs beside its unweighted mean; the trainer's beta
    set to 0 stops the KL from its step on; beta x250 and LR x10 reach the config the run sends."""
    flipped = _run("reward_weight_flipped", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert flipped["config"]["reward_weights"] == [-1.0, 1.0]
    for step in flipped["trace"]["steps"]:
        v = step["values"]
        assert v["reward"] == pytest.approx(v["rewards/format_reward/mean"] - v["rewards/accuracy_reward/mean"])

    off = _run("kl_off_late", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert off["onset"] == 2 and off["label"] == "kl_misconfiguration"
    values = [s["values"] for s in off["trace"]["steps"]]
    assert "kl" in values[0] and all("kl" not in v for v in values[1:])

    beta = _run("beta_x250", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert beta["config"]["beta"] == pytest.approx(250 * trl_runs.HEALTHY_BETA)
    lr = _run("lr_x10_cosine", sqlite_live_server, tiny_checkpoint, tmp_path)
    base = trl_runs.base_config(3, 0, str(tmp_path))["learning_rate"]
    assert lr["config"]["learning_rate"] == pytest.approx(10 * base) and lr["config"]["lr_scheduler_type"] == "cosine"


def test_batch_15s_faults_reach_the_trace_as_they_say(sqlite_live_server, tiny_checkpoint, tmp_path):
    """Batch 15 on the tiny checkpoint through the server for 3 steps (halfway: step 2): frozen routers
    leave the probe no router weight to sample; the flipped sign makes every accuracy reward from its
    step on at most 0; the LR is 30x the schedule's from its step on (through a real AdamW)."""
    frozen = _run("healthy_routers_frozen", sqlite_live_server, tiny_checkpoint, tmp_path)
    values = [s["values"] for s in frozen["trace"]["steps"]]
    assert all(v["moeproxy/update_ratio"] > 0 and "moeproxy/router_outside_change" not in v for v in values)

    flipped = _run("reward_sign_flip_late", sqlite_live_server, tiny_checkpoint, tmp_path)
    assert flipped["onset"] == 2 and flipped["label"] == "reward_fault"
    accuracy = [s["values"]["rewards/accuracy_reward/mean"] for s in flipped["trace"]["steps"]]
    assert accuracy[0] >= 0 and all(a <= 0 for a in accuracy[1:])

    _assert_lr_raised("lr_x30_late", 100, 30.0)


def test_batch_16s_faults_act_where_they_say():
    """Batch 16 through a real AdamW and the real checker: the LR x0 and x1000 from step 100; the
    checker one call behind (its first call all 0, each later one the scores of the call before);
    the router NaN at step 150."""
    from moeproxy.reproduction.formats import get_format
    from moeproxy.reproduction.tasks import format_prompt, make_split

    _assert_lr_raised("lr_zero_late", 100, 0.0)
    _assert_lr_raised("lr_x1000_late", 100, 1000.0)

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["reward_previous_call"].apply(setup) == 0
    behind = setup.reward_funcs[0]
    assert behind.__name__ == "accuracy_reward"
    examples = make_split("train", 2, seed=0)
    right = [get_format("reasoning").target(e) for e in examples]

    def call(completions):
        return behind([format_prompt(e) for e in examples], completions, task=[e.task for e in examples],
                      answer=[e.answer for e in examples])

    assert call(right) == [0.0, 0.0]  # nothing scored before the first call
    assert call(["wrong", "wrong"]) == [1.0, 1.0]  # the right answers' scores, one call late
    assert call(right) == [0.0, 0.0]

    setup = trl_runs.Setup(model=None, steps=200, config={})
    assert trl_runs.RUNS["nan_router_grad_late"].apply(setup) == 150
