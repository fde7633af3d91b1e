"""The fidelity harness on tiny model pairs built with the real proxy builder."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.proxy_builder.build import BuildRequest, build_proxy
from moeproxy.reproduction import fidelity
from moeproxy.reproduction.fidelity import (
    EvalSettings,
    FidelityError,
    evaluate_pair,
    normalised_entropy,
    wilson_interval,
)
from moeproxy.reproduction.reference import TrainingRecipe, save_checkpoint, train_model
from moeproxy.reproduction.tasks import TASKS, calibration_corpus, format_prompt, make_split
from typer.testing import CliRunner

from moeproxy.cli import app

torch.set_num_threads(1)

TINY = {
    "qwen3_moe": {"hidden_size": 32, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2},
    "deepseek_v3": {"hidden_size": 32, "num_hidden_layers": 3, "n_routed_experts": 8, "n_group": 2,
                    "topk_group": 1, "num_experts_per_tok": 2},
}
FAST = EvalSettings(prompts_per_task=6, kl_texts_per_task=4, batch_size=64, measure_cost=False)


@pytest.fixture(scope="module", params=sorted(TINY))
def original(request, tmp_path_factory):
    """A tiny model of each architecture, trained a few steps so routing is not uniform."""
    arch = request.param
    recipe = TrainingRecipe(steps=15, batch_size=16, lr=1e-2, warmup_steps=2, save_dtype="float32",
                            bias_update_speed=1e-3 if arch == "deepseek_v3" else 0.0)
    result = train_model(arch, recipe, TINY[arch])
    return save_checkpoint(result, tmp_path_factory.mktemp(arch) / "original", recipe, {"arch": arch})


def _proxy(original, out, keep, method):
    return build_proxy(
        BuildRequest(
            original,
            out,
            keep=keep,
            method=method,
            calibration=calibration_corpus(64, seed=0),
            max_tokens=1500,
            seq_len=64,
            batch_size=16,
        )
    ).out_dir


def test_wilson_interval():
    lo, hi = wilson_interval(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.19, abs=0.01)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] > 0.2
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(10, 10)[0] < 0.8
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_normalised_entropy():
    assert normalised_entropy([5, 5, 5, 5]) == pytest.approx(1.0)
    assert normalised_entropy([9, 0, 0, 0]) == 0.0
    assert 0 < normalised_entropy([8, 1, 1, 1]) < 1


def test_all_experts_kept_is_exact(original, tmp_path):
    n = TINY_EXPERTS(original)
    proxy = _proxy(original, tmp_path / "full", n, "three_view")
    report = evaluate_pair(original, proxy, FAST)
    assert report["kl"] == pytest.approx(0.0, abs=1e-6)
    assert report["kl_answer"] == pytest.approx(0.0, abs=1e-6)
    assert report["routing_agreement"] == 1.0
    assert report["routing_coverage"] == 1.0
    assert report["hidden_cosine_mean"] == pytest.approx(1.0, abs=1e-5)
    assert report["parameter_ratio"] == 1.0
    assert report["proxy"]["accuracy"] == report["original"]["accuracy"]


def TINY_EXPERTS(path) -> int:
    cfg = json.loads((path / "config.json").read_text())
    return cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg["num_local_experts"]


def test_damaged_proxy_scores_worse(original, tmp_path):
    n = TINY_EXPERTS(original)
    smallest = 4 if "n_group" in json.loads((original / "config.json").read_text()) else 2  # 2 per group
    good = evaluate_pair(original, _proxy(original, tmp_path / "good", n * 3 // 4, "three_view"), FAST)
    bad = evaluate_pair(original, _proxy(original, tmp_path / "bad", smallest, "first_k"), FAST)
    for report in (good, bad):
        assert report["kl"] > 0
        assert report["routing_agreement"] < 1
        assert report["parameter_ratio"] < 1
    assert bad["kl"] > good["kl"]
    assert bad["routing_agreement"] < good["routing_agreement"]
    assert bad["routing_coverage"] <= good["routing_coverage"]


def test_agreement_counts_pruned_experts_as_misses():
    """Against a naive loop: original top-k sets vs proxy choices mapped through kept ids."""
    gen = torch.Generator().manual_seed(0)
    n_tok, n_orig, k = 50, 8, 2
    o_topk = torch.stack([torch.randperm(n_orig, generator=gen)[:k] for _ in range(n_tok)])
    kept = [1, 3, 4, 6]
    p_topk = torch.stack([torch.randperm(len(kept), generator=gen)[:k] for _ in range(n_tok)])
    orig = fidelity.Capture(None, None, {0: o_topk}, {0: o_topk[:, 0]}, [], {})
    prox = fidelity.Capture(None, None, {0: p_topk}, {0: p_topk[:, 0]}, [], {})
    scores = fidelity.routing_scores(orig, prox, {0: kept}, n_orig)
    agree = sum(len(set(o.tolist()) & {kept[j] for j in p.tolist()}) for o, p in zip(o_topk, p_topk)) / (k * n_tok)
    cover = sum(int(o[0]) in kept for o in o_topk) / n_tok
    assert scores["routing_agreement"] == pytest.approx(agree)
    assert scores["routing_coverage"] == pytest.approx(cover)


@pytest.mark.slow  # starts fresh interpreters for the memory probe
def test_report_schema_and_cli(original, tmp_path):
    n = TINY_EXPERTS(original)
    proxy = _proxy(original, tmp_path / "half", n // 2, "frequency")
    out = tmp_path / "report.json"
    # The cost probes start fresh interpreters (slow): measure them on one architecture only.
    measure = "n_group" not in json.loads((original / "config.json").read_text())
    result = CliRunner().invoke(app, ["eval", "--original", str(original), "--proxy", str(proxy),
                                      "--prompts-per-task", "4", "--kl-texts-per-task", "3",
                                      "--out", str(out), "--json", *([] if measure else ["--no-cost"])])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for side in ("original", "proxy"):
        assert set(report[side]["accuracy"]) == set(TASKS)
        assert all(0 <= v <= 1 for v in report[side]["accuracy"].values())
        assert math.isfinite(report[side]["mean_accuracy"])
        if measure:
            assert report[side]["peak_memory_mb"] > 0
        assert all(len(ci) == 2 for ci in report[side]["accuracy_ci95"].values())
    keys = ["retention", "kl", "kl_answer", "routing_coverage", "routing_agreement", "hidden_cosine_mean",
            "parameter_ratio"] + (["throughput_ratio", "memory_ratio"] if measure else [])
    for key in keys:
        assert isinstance(report[key], float), key
    assert 0 <= report["routing_agreement"] <= 1 and 0 <= report["routing_coverage"] <= 1
    assert report["parameter_ratio"] < 1
    assert len(report["hidden_cosine_per_layer"]) == json.loads((original / "config.json").read_text())[
        "num_hidden_layers"]


def test_mismatched_proxy_is_a_clear_error(original, tmp_path):
    n = TINY_EXPERTS(original)
    proxy = _proxy(original, tmp_path / "p", n // 2, "random")
    (proxy / "proxy_report.json").unlink()
    with pytest.raises(FidelityError, match="proxy_report.json"):
        evaluate_pair(original, proxy, FAST)
    result = CliRunner().invoke(app, ["eval", "--original", str(tmp_path / "nope"), "--proxy", str(proxy)])
    assert result.exit_code == 2 and "not a checkpoint" in result.output


# --- the peak-memory probe: a fresh process reading RSS through the one reader ----------------------

def _probe_inputs(tmp_path):
    from tiny_models import build_tiny

    prompts = [format_prompt(e) for e in make_split("heldout", 4, seed=0)]
    return build_tiny("qwen3_moe", tmp_path), prompts


def test_the_probe_reports_through_the_one_rss_reader(tmp_path, monkeypatch, capsys):
    """The probe's arithmetic on known status figures: peak minus the RSS before the measured load."""
    from moeproxy.proxy_builder import process_memory
    from moeproxy.reproduction.memory import generation_rss_child

    model_dir, prompts = _probe_inputs(tmp_path)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t5120 kB\nVmRSS:\t1024 kB\n")
    monkeypatch.setattr(process_memory, "_STATUS", str(status))
    generation_rss_child.main([str(model_dir), json.dumps(prompts)])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["peak_rss_mb"], out["rss_before_load_mb"], out["run_mb"]) == (5.0, 1.0, 4.0)
    assert isinstance(out["hwm_reset"], bool)


@pytest.mark.slow  # starts a fresh interpreter that loads the model twice
def test_peak_memory_is_what_a_fresh_process_adds_to_load_and_generate(tmp_path):
    model_dir, prompts = _probe_inputs(tmp_path)
    peak_mb = fidelity.measure_peak_memory_mb(model_dir, prompts)
    assert math.isfinite(peak_mb) and peak_mb > 0
