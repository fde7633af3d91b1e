import json
import math

import numpy as np
import pytest
from moeproxy.signatures.canonical import RunMetrics, canonicalise, load_run, parse_value, step_grid
from moeproxy.signatures.errors import InvalidRun
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, alias_index, canonical_name


@pytest.mark.parametrize(
    ("framework", "name", "canonical"),
    [
        ("verl", "critic/score/mean", "reward_mean"),
        ("verl", "training/rollout_probs_diff_mean", "rollout_train_logp_diff"),
        ("verl", "rollout_corr/kl", "rollout_kl"),
        ("trl", "sampling/sampling_logp_difference/mean", "rollout_train_logp_diff"),
        ("trl", "loss", "pg_loss"),
        ("openrlhf", "train/actor_grad_norm", "grad_norm"),
        ("mindspeed_rl", "grpo/score/mean", "reward_mean"),
        ("trl", "rewards/accuracy_reward/mean", "reward_component/accuracy_reward"),
        ("trl", "rewards/accuracy_reward/std", "rewards/accuracy_reward/std"),
        ("verl", "my/custom_metric", "my/custom_metric"),
        # Earlier releases' names: verl <= 0.2, TRL <= 0.15.
        ("verl", "critic/kl", "kl"),
        ("verl", "actor/reward_kl_penalty", "kl"),
        ("verl", "actor/entropy_loss", "entropy"),
        ("trl", "completion_length", "response_length"),
        ("trl", "rewards/correctness_reward_func", "reward_component/correctness_reward_func"),
    ],
)
def test_alias_mapping(framework, name, canonical):
    assert canonical_name(name, alias_index(DEFAULT_ALIASES, framework)) == canonical


def test_known_framework_does_not_borrow_another_frameworks_alias():
    # "loss" is TRL's pg_loss; a verl run's "loss" keeps its own name.
    assert canonical_name("loss", alias_index(DEFAULT_ALIASES, "verl")) == "loss"


def test_canonicalise_renames_and_keeps_the_first_listed_of_two_names_for_one_metric():
    run = RunMetrics.from_arrays({
        "critic/score/mean": [0.1, 0.2, 0.3],
        "critic/rewards/mean": [9.0, 9.0, 9.0],  # also reward_mean for verl, listed second
        "unknown/thing": [1.0, 2.0, 3.0],
    }, framework="verl")
    c = canonicalise(run)
    assert c.metrics["reward_mean"].source == "critic/score/mean"
    assert c.metrics["critic/rewards/mean"].source == "critic/rewards/mean"
    assert "unknown/thing" in c.metrics
    assert c.renamed == {"critic/score/mean": "reward_mean"}


def test_a_current_name_wins_over_an_earlier_releases_name_for_the_same_metric():
    run = RunMetrics.from_arrays({"actor/entropy": [0.5, 0.4, 0.3], "actor/entropy_loss": [9.0, 9.0, 9.0],
                                  "actor/kl_loss": [0.0, 0.1, 0.2], "critic/kl": [5.0, 5.0, 5.0]}, framework="verl")
    c = canonicalise(run)
    assert c.metrics["entropy"].source == "actor/entropy" and c.metrics["kl"].source == "actor/kl_loss"
    old = canonicalise(RunMetrics.from_arrays({"actor/entropy_loss": [0.5, 0.4, 0.3], "critic/kl": [0.0, 0.1, 0.2]},
                                              framework="verl"))
    assert old.renamed == {"actor/entropy_loss": "entropy", "critic/kl": "kl"}


def test_trl_and_verl_names_land_on_the_same_canonical_metrics():
    verl = canonicalise(RunMetrics.from_arrays({"actor/grad_norm": [1.0], "actor/entropy": [2.0]}, framework="verl"))
    trl = canonicalise(RunMetrics.from_arrays({"grad_norm": [1.0], "entropy": [2.0]}, framework="trl"))
    assert set(verl.metrics) == set(trl.metrics) == {"grad_norm", "entropy"}


@pytest.mark.parametrize(("raw", "expected"), [
    ("NaN", math.nan), ("Infinity", math.inf), ("-Infinity", -math.inf), (3, 3.0), ("1e-3", 1e-3),
    (float("inf"), math.inf),
])
def test_parse_value(raw, expected):
    v = parse_value(raw)
    assert (math.isnan(v) and math.isnan(expected)) or v == expected


def test_parse_value_rejects_text():
    with pytest.raises(InvalidRun):
        parse_value("high")


def test_nonfinite_values_are_kept_as_an_indicator_with_first_step():
    gn = [1.0, 1.1, float("nan"), 1.2, float("inf"), float("-inf"), 1.0]
    c = canonicalise(RunMetrics.from_arrays({"actor/grad_norm": gn}, steps=range(10, 17), framework="verl"))
    s = c.metrics["grad_norm"]
    assert s.nonfinite.tolist() == [False, False, True, False, True, True, False]
    assert (s.nan_count, s.posinf_count, s.neginf_count) == (1, 1, 1)
    assert c.first_nonfinite_step("grad_norm") == 12
    assert np.isfinite(s.values).all()  # the numeric channel is filled
    assert s.values[2] == pytest.approx(1.15)


def test_gaps_are_interpolated_and_marked_unobserved():
    run = RunMetrics.from_columns({
        "a": {"steps": [0, 1, 2, 3, 4], "values": [0, 1, 2, 3, 4]},
        "b": {"steps": [0, 4], "values": [0.0, 8.0]},
    })
    c = canonicalise(run)
    assert c.steps.tolist() == [0, 1, 2, 3, 4]
    assert c.metrics["b"].values.tolist() == [0, 2, 4, 6, 8]
    assert c.metrics["b"].observed.tolist() == [True, False, False, False, True]


def test_grid_uses_the_common_stride_and_bins_long_runs():
    assert step_grid([np.array([0, 10, 20]), np.array([5, 15])]).tolist() == [0, 5, 10, 15, 20]
    grid = step_grid([np.arange(0, 100_000)], max_points=1000)
    assert grid.size <= 1000 and grid[0] == 0
    run = RunMetrics.from_arrays({"x": np.arange(10_000.0)})
    c = canonicalise(run, max_points=100)
    assert c.n_steps == 100
    assert c.metrics["x"].values[0] == pytest.approx(49.5)  # mean of the first bin


def test_load_jsonl_with_nan_literals(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_text('{"step": 0, "values": {"actor/grad_norm": 1.0}}\n'
                 '{"step": 1, "values": {"actor/grad_norm": NaN}}\n'
                 '{"step": 2, "values": {"actor/grad_norm": Infinity, "critic/score/mean": "NaN"}}\n')
    run = load_run(p, framework="verl")
    gn = run.series["actor/grad_norm"]
    assert gn.steps.tolist() == [0, 1, 2] and math.isnan(gn.values[1]) and gn.values[2] == math.inf
    assert math.isnan(run.series["critic/score/mean"].values[0])


def test_load_json_object_with_framework(tmp_path):
    p = tmp_path / "body.json"
    p.write_text(json.dumps({"framework": "trl", "steps": [{"step": 3, "values": {"loss": 0.5}},
                                                          {"step": 3, "values": {"loss": 0.25}}]}))
    run = load_run(p)
    assert run.framework == "trl"
    assert run.series["loss"].values.tolist() == [0.25]  # a re-sent step overwrites
    assert "pg_loss" in canonicalise(run).metrics


@pytest.mark.parametrize("text", ['{"steps": [{"step": -1, "values": {}}]}', '[1, 2]', "not json",
                                  '{"steps": [{"step": 1, "values": {"a": "x"}}]}'])
def test_bad_run_files_raise_invalid_run(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(InvalidRun):
        load_run(p)


def test_to_steps_round_trip_keeps_nonfinite_as_strings():
    run = RunMetrics.from_arrays({"a": [1.0, float("nan"), float("-inf")]})
    steps = run.to_steps()
    assert steps[1]["values"]["a"] == "NaN" and steps[2]["values"]["a"] == "-Infinity"
    back = RunMetrics.from_steps(steps)
    assert np.array_equal(back.series["a"].values, run.series["a"].values, equal_nan=True)


def naive_bins(steps: np.ndarray, values: np.ndarray, grid: np.ndarray) -> dict[int, dict]:
    """Per grid bin, by a loop over the points: what bin_series must compute."""
    stride = int(grid[1] - grid[0]) if grid.size > 1 else 1
    out: dict[int, dict] = {}
    for step, value in zip(steps.tolist(), values.tolist(), strict=True):
        b = out.setdefault(min((step - int(grid[0])) // stride, grid.size - 1),
                           {"finite": [], "nan": 0, "posinf": 0, "neginf": 0})
        if math.isnan(value):
            b["nan"] += 1
        elif value == math.inf:
            b["posinf"] += 1
        elif value == -math.inf:
            b["neginf"] += 1
        else:
            b["finite"].append(value)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_bin_series_against_a_naive_loop(seed):
    from moeproxy.signatures.canonical import MetricSeries, bin_series

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    steps = np.sort(rng.choice(20_000, n, replace=False)).astype(np.int64) * int(rng.integers(1, 4))
    values = rng.normal(size=n)
    for token, share in ((np.nan, 0.05), (np.inf, 0.01), (-np.inf, 0.01)):
        values[rng.random(n) < share] = token
    grid = step_grid([steps], max_points=int(rng.integers(2, 500)))
    got = bin_series(MetricSeries(steps, values), grid, extremes=True)
    want = naive_bins(steps, values, grid)
    assert got.bins.tolist() == sorted(want)
    for i, b in enumerate(got.bins.tolist()):
        w = want[b]
        assert got.finite_count[i] == len(w["finite"])
        assert got.finite_sum[i] == pytest.approx(sum(w["finite"]), abs=1e-9)
        assert (got.nan[i], got.posinf[i], got.neginf[i]) == (w["nan"], w["posinf"], w["neginf"])
        if w["finite"]:
            assert (got.lowest[i], got.highest[i]) == (min(w["finite"]), max(w["finite"]))
        else:
            assert math.isnan(got.lowest[i]) and math.isnan(got.highest[i])
    assert got.last_step == int(steps[-1])
