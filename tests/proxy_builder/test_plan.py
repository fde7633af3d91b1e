"""The resource planner (issue 9): paper figures, invariants, bad specs.  Torch-free."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moeproxy.proxy_builder.params import count_parameters, expert_count, top_k
from moeproxy.proxy_builder.plan import (
    PlanAssumptions,
    load_preset,
    plan,
    preset_names,
    resolve_keep,
    strip_notes,
)
from moeproxy.proxy_builder.plan_errors import (
    InvalidAssumptions,
    InvalidKeepSpec,
    PlanError,
    UnknownPreset,
    UnsupportedArchitecture,
)
from typer.testing import CliRunner

from moeproxy.cli import app

runner = CliRunner()

# Published totals (model cards), in billions; MTP layers excluded for DeepSeek.
PUBLISHED_B = {
    "qwen3-30b-a3b": 30.5,
    "qwen3-235b-a22b": 235.0,
    "deepseek-v3": 671.0,
    "deepseek-v3.2": 671.0,
    "mixtral-8x7b": 46.7,
    "olmoe-1b-7b": 6.9,
    "qwen2-57b-a14b": 57.4,
}


def _cli_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_preset_is_shipped_and_matches_its_published_size():
    assert sorted(PUBLISHED_B) == preset_names()
    for name, billions in PUBLISHED_B.items():
        cfg = load_preset(name)
        assert cfg["_source"].startswith("https://huggingface.co/")
        total = count_parameters(strip_notes(cfg)).total / 1e9
        assert total == pytest.approx(billions, rel=0.01), name


def test_paper_qwen3_30b_a3b_16_to_8():
    out = _cli_json("--preset", "qwen3-30b-a3b", "--keep", "48")
    assert out["original"]["devices"] == 16
    assert out["proxy"]["devices"] == 8
    assert out["saving"]["devices_ratio"] == 2.0
    assert out["original"]["experts_per_layer"] == 128 and out["proxy"]["experts_per_layer"] == 48


def test_paper_deepseek_v32_512_to_64():
    out = _cli_json("--preset", "deepseek-v3.2", "--keep", "16")
    assert out["original"]["devices"] == 512
    assert out["proxy"]["devices"] == 64
    assert out["saving"]["devices_ratio"] == 8.0
    assert out["saving"]["devices_saved_fraction"] == pytest.approx(0.875)


def test_json_shape_and_memory_components_add_up():
    out = _cli_json("--preset", "mixtral-8x7b", "--keep-ratio", "0.5")
    assert set(out) >= {"original", "proxy", "saving", "assumptions"}
    for side in ("original", "proxy"):
        mem = out[side]["memory_gb"]
        parts = sum(v for k, v in mem.items() if k not in {"total", "per_device"})
        assert parts == pytest.approx(mem["total"], abs=0.01)
        assert mem["per_device"] * out[side]["devices"] == pytest.approx(mem["total"], rel=1e-3)
        usable = out["assumptions"]["device_memory_gb"] * out["assumptions"]["usable_memory_fraction"]
        assert mem["per_device"] <= usable + 1e-6
    assert set(out["saving"]) >= {"devices_ratio", "memory_ratio", "parameter_ratio"}
    assert out["proxy"]["experts_per_layer"] == 4


def test_cli_model_dir_and_config_file(tmp_path):
    cfg = strip_notes(load_preset("olmoe-1b-7b"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_dir = _cli_json("--model", str(tmp_path), "--keep", "16")
    by_file = _cli_json("--config", str(tmp_path / "config.json"), "--keep", "16")
    assert by_dir == by_file
    assert by_dir["proxy"]["experts_per_layer"] == 16


def test_cli_table_list_and_markdown():
    table = runner.invoke(app, ["plan", "--preset", "qwen3-30b-a3b", "--keep", "48"])
    assert table.exit_code == 0 and "devices" in table.stdout and "routed_experts" in table.stdout
    listing = runner.invoke(app, ["plan", "--list-presets"])
    assert listing.exit_code == 0
    assert all(name in listing.stdout for name in preset_names())
    md = runner.invoke(app, ["plan", "--all-presets", "--keep-ratio", "0.5", "--markdown"])
    assert md.exit_code == 0
    assert md.stdout.count("\n| ") >= len(preset_names())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "qwen3-30b-a3b", "--keep", "129"], "only 128"),
        (["--preset", "qwen3-30b-a3b", "--keep", "4"], "at least 8"),
        (["--preset", "qwen3-30b-a3b", "--keep-ratio", "0"], "(0, 1]"),
        (["--preset", "qwen3-30b-a3b", "--keep-ratio", "1.5"], "(0, 1]"),
        (["--preset", "qwen3-30b-a3b"], "exactly one of keep"),
        (["--preset", "qwen3-30b-a3b", "--keep", "48", "--keep-ratio", "0.5"], "exactly one of keep"),
        (["--preset", "no-such-model", "--keep", "8"], "no preset"),
        (["--keep", "8"], "exactly one of --model"),
        (["--preset", "qwen3-30b-a3b", "--config", "x.json", "--keep", "8"], "exactly one of --model"),
        (["--config", "/nonexistent/config.json", "--keep", "8"], "no config.json"),
        (["--preset", "qwen3-30b-a3b", "--keep", "48", "--device-memory-gb", "-1"], "device_memory_gb"),
        (["--preset", "deepseek-v3", "--keep", "16", "--seq-len", "1000000"], "activations per device"),
    ],
)
def test_cli_rejects_bad_input_clearly(args, message):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_unknown_architecture_is_named():
    cfg = {**strip_notes(load_preset("mixtral-8x7b")), "model_type": "llama"}
    with pytest.raises(UnsupportedArchitecture, match=r"'llama'.*supported"):
        plan(cfg, keep=4)
    with pytest.raises(UnsupportedArchitecture):
        count_parameters({"model_type": None})


def test_incomplete_config_is_named():
    from moeproxy.proxy_builder.plan_errors import IncompleteConfig

    cfg = strip_notes(load_preset("deepseek-v3"))
    del cfg["kv_lora_rank"]
    with pytest.raises(IncompleteConfig, match="kv_lora_rank"):
        plan(cfg, keep=16)
    with pytest.raises(IncompleteConfig, match="kv_lora_rank"):
        count_parameters(cfg)
    result = runner.invoke(app, ["plan", "--config", "/dev/null", "--keep", "8"])
    assert result.exit_code == 2 and "error:" in result.stderr


def test_errors_are_value_errors_with_one_base():
    for exc in (UnsupportedArchitecture, InvalidKeepSpec, UnknownPreset, InvalidAssumptions):
        assert issubclass(exc, PlanError) and issubclass(exc, ValueError)
    with pytest.raises(UnknownPreset):
        load_preset("gpt-5")
    with pytest.raises(InvalidAssumptions):
        PlanAssumptions(usable_memory_fraction=1.5)
    with pytest.raises(InvalidAssumptions):
        PlanAssumptions(grad_bytes=-2)
    with pytest.raises(InvalidKeepSpec):
        count_parameters(strip_notes(load_preset("olmoe-1b-7b")), keep=65)


def test_keep_ratio_rounds_to_experts():
    cfg = strip_notes(load_preset("qwen3-30b-a3b"))
    assert resolve_keep(cfg, keep_ratio=0.375) == 48
    assert resolve_keep(cfg, keep_ratio=1.0) == 128
    with pytest.raises(InvalidKeepSpec, match="at least 8"):
        resolve_keep(cfg, keep_ratio=0.01)


def test_keeping_every_expert_changes_nothing():
    for name in preset_names():
        cfg = load_preset(name)
        p = plan(cfg, keep=expert_count(strip_notes(cfg)))
        assert p.proxy.devices == p.original.devices
        assert p.proxy.parameters == p.original.parameters


PRESETS = st.sampled_from(sorted(PUBLISHED_B))


@settings(max_examples=60, deadline=None)
@given(name=PRESETS, data=st.data())
def test_more_experts_kept_never_means_fewer_devices(name, data):
    cfg = strip_notes(load_preset(name))
    lo, hi = top_k(cfg), expert_count(cfg)
    k1 = data.draw(st.integers(lo, hi))
    k2 = data.draw(st.integers(k1, hi))
    p1, p2 = plan(cfg, keep=k1), plan(cfg, keep=k2)
    assert p1.proxy.devices <= p2.proxy.devices
    assert p1.proxy.parameters.total <= p2.proxy.parameters.total
    assert p2.proxy.devices <= p2.original.devices


@settings(max_examples=60, deadline=None)
@given(
    name=PRESETS,
    seq=st.integers(256, 16384),
    extra_seq=st.integers(0, 8192),
    batch=st.integers(1, 1024),
    extra_batch=st.integers(0, 1024),
    memory=st.sampled_from([32.0, 64.0, 96.0]),
)
def test_devices_monotone_in_seq_len_and_batch(name, seq, extra_seq, batch, extra_batch, memory):
    cfg = strip_notes(load_preset(name))
    keep = max(top_k(cfg), expert_count(cfg) // 4)
    base = PlanAssumptions(device_memory_gb=memory, seq_len=seq, rollout_batch=batch)
    longer = replace(base, seq_len=seq + extra_seq)
    bigger = replace(base, rollout_batch=batch + extra_batch)
    try:
        p = plan(cfg, keep=keep, assumptions=base)
    except InvalidAssumptions:  # one micro-batch does not fit a small device: nothing to compare
        return
    for other in (longer, bigger):
        try:
            q = plan(cfg, keep=keep, assumptions=other)
        except InvalidAssumptions:
            continue
        assert q.original.devices >= p.original.devices
        assert q.proxy.devices >= p.proxy.devices


def test_more_device_memory_never_needs_more_devices():
    cfg = load_preset("qwen3-235b-a22b")
    counts = [
        plan(cfg, keep=32, assumptions=PlanAssumptions(device_memory_gb=m)).original.devices
        for m in (48, 64, 80, 96, 141)
    ]
    assert counts == sorted(counts, reverse=True)


def test_deployment_rounding():
    cfg = strip_notes(load_preset("qwen3-30b-a3b"))
    p = plan(cfg, keep=48)
    assert p.proxy.expert_parallel == 8 and 48 % p.proxy.expert_parallel == 0
    for name in preset_names():
        d = plan(load_preset(name), keep_ratio=0.5).to_dict()
        for side in ("original", "proxy"):
            n = d[side]["devices"]
            assert n & (n - 1) == 0  # power of two
            assert n <= 8 or n % 8 == 0  # whole nodes above one node
            assert d[side]["experts_per_layer"] % d[side]["expert_parallel"] == 0


def test_docs_tables_are_up_to_date():
    """docs/planner.md holds the tables benchmarks/plan_table.py generates (re-make with --write-docs)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("plan_table", root / "benchmarks" / "plan_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from moeproxy.cli.plan import markdown_table

    docs = (root / "docs" / "planner.md").read_text()
    assert markdown_table(module.preset_rows()) in docs
    assert module.sensitivity_markdown(module.sensitivity()) in docs


@pytest.mark.parametrize("name", preset_names())
def test_planner_and_builder_agree_on_k_for_every_ratio(name):
    """`moeproxy plan --keep-ratio` and `moeproxy build --keep-ratio` resolve one K (issue 15):
    DeepSeek-V3 with E = 256 in 8 groups at r = 0.3 is 80 (10 per group) for both, not 77."""
    from moeproxy.proxy_builder.architectures import architecture_for
    from moeproxy.proxy_builder.build import BuildRequest, _resolve_keep

    cfg = strip_notes(load_preset(name))
    arch = architecture_for(cfg)
    for ratio in (0.125, 0.2, 0.25, 0.3, 0.375, 0.5, 0.7, 1.0):
        req = BuildRequest("unused", "unused", keep_ratio=ratio)
        built = _resolve_keep(req, arch, cfg, arch.expert_count(cfg))
        try:
            planned = resolve_keep(cfg, keep_ratio=ratio)
        except InvalidKeepSpec:
            continue  # below top_k: the planner refuses, and so does the builder's validation
        assert planned == built, (name, ratio)
    if cfg.get("n_group") == 8 and arch.expert_count(cfg) == 256:
        assert resolve_keep(cfg, keep_ratio=0.3) == 80
