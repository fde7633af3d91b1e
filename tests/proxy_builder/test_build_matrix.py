"""Every architecture x every selection method: prune, reload, run, and check the surgery tensor by tensor.

Done-when of issue 4: kept experts bit-identical to the originals at their old
ids, non-expert tensors byte-identical, router rows / biases sliced in the same
order, config patched (expert count only), top-k unchanged, and the proxy loads
with ``AutoModelForCausalLM.from_pretrained`` and runs forward + generate.
"""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.proxy_builder.architectures import architecture_for
from moeproxy.proxy_builder.build import BuildRequest, build_proxy
from moeproxy.proxy_builder.methods import METHODS
from safetensors import safe_open
from tiny_models import ARCH_CASES

torch.set_num_threads(1)
KEEP = 4


def _tensors(directory) -> dict[str, bytes]:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():  # noqa: SIM118 (safe_open is not iterable)
                out[k] = fh.get_tensor(k)
    return out


def _raw(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def check_surgery(src, dst, kept_by_layer: dict[int, list[int]], keep: int) -> None:
    """The proxy's tensors against the original's, key by key."""
    config = json.loads((src / "config.json").read_text())
    arch = architecture_for(config)
    orig, proxy = _tensors(src), _tensors(dst)
    expert = arch.expert_key_pattern()
    routers = {f"{arch.prefix(layer)}.{s}": layer for layer in kept_by_layer for s in (arch.router_weight, *arch.router_vectors)}
    expected_keys = set()
    for name, tensor in orig.items():
        m = expert.match(name)
        if m and m["expert"] is not None and int(m["layer"]) in kept_by_layer:
            kept = kept_by_layer[int(m["layer"])]
            e = int(m["expert"])
            if e in kept:
                new = f"{arch.prefix(int(m['layer']))}.experts.{kept.index(e)}.{m['rest']}"
                expected_keys.add(new)
                assert _raw(proxy[new]) == _raw(tensor), f"{new} is not expert {e}'s {m['rest']}"
        elif (m and m["fused"] is not None and int(m["layer"]) in kept_by_layer) or name in routers:
            layer = int(m["layer"]) if m else routers[name]
            expected_keys.add(name)
            sliced = tensor[kept_by_layer[layer]]
            assert proxy[name].dtype == tensor.dtype
            assert _raw(proxy[name]) == _raw(sliced), f"{name} rows are not the kept experts' rows"
        else:
            expected_keys.add(name)
            assert _raw(proxy[name]) == _raw(tensor), f"{name} changed"
    assert set(proxy) == expected_keys

    new_config = json.loads((dst / "config.json").read_text())
    changed = {k for k in config if config[k] != new_config.get(k)} | (set(new_config) - set(config))
    assert changed == {k for k in arch.expert_count_keys if k in config}
    assert all(new_config[k] == keep for k in changed)
    assert new_config[arch.top_k_key] == config[arch.top_k_key]
    assert list(new_config) == list(config)  # key order preserved: patched, not re-serialised


def check_loads_and_runs(dst, num_experts: int) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    routers = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    assert routers and all(r.weight.shape[0] == num_experts for r in routers)
    tok = AutoTokenizer.from_pretrained(dst)
    batch = tok(["the fox", "a much longer prompt"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
        assert torch.isfinite(logits).all()
        out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, batch["input_ids"].shape[1] + 3)


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("arch", list(ARCH_CASES))
def test_every_architecture_every_method(arch, method, tiny_checkpoints, tiny_statistics, tmp_path):
    src = tiny_checkpoints[arch]
    result = build_proxy(
        BuildRequest(src, tmp_path / "proxy", keep=KEEP, method=method), statistics=tiny_statistics[arch]
    )
    report = result.report
    kept = {int(layer): entry["kept_experts"] for layer, entry in report["layers"].items()}
    config = json.loads((src / "config.json").read_text())
    moe_layers = architecture_for(config).moe_layers(config)
    assert sorted(kept) == moe_layers
    for layer, ids in kept.items():
        assert ids == sorted(set(ids)) and len(ids) == KEEP and all(0 <= i < 8 for i in ids)
        if METHODS[method].views:  # clustering: clusters partition the experts, each holds its kept expert
            clusters = report["layers"][str(layer)]["clusters"]
            assert sorted(i for c in clusters for i in c) == list(range(8))
            assert all(k in c for k, c in zip(ids, clusters, strict=True))
    if arch.startswith("deepseek"):  # per-group retention: 2 experts in each group of 4
        for ids in kept.values():
            assert sum(i < 4 for i in ids) == 2
    assert report["method"] == method and report["keep"] == KEEP and report["top_k"] == 2
    assert report["parameters"]["proxy"] < report["parameters"]["original"]
    check_surgery(src, result.out_dir, kept, KEEP)
    check_loads_and_runs(result.out_dir, KEEP)


def test_method_results_differ_where_they_should(tiny_checkpoints, tiny_statistics, tmp_path):
    """first_k keeps 0..K-1 and frequency keeps the K most activated (ties to the lower id)."""
    src, stats = tiny_checkpoints["qwen3_moe"], tiny_statistics["qwen3_moe"]
    first = build_proxy(
        BuildRequest(src, tmp_path / "a", keep=KEEP, method="first_k"), statistics=stats
    ).report
    freq = build_proxy(
        BuildRequest(src, tmp_path / "b", keep=KEEP, method="frequency"), statistics=stats
    ).report
    for layer, entry in first["layers"].items():
        assert entry["kept_experts"] == [0, 1, 2, 3]
        f = stats[int(layer)].frequency
        kept = freq["layers"][layer]["kept_experts"]
        assert min(f[kept]) >= max(f[[i for i in range(8) if i not in kept]])


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "deepseek_v3"])
def test_fused_expert_checkpoint(arch, tmp_path, tiny_statistics):
    """A checkpoint with experts stacked on disk ([E, ...] tensors) is sliced along dim 0."""
    from tiny_models import build_tiny

    src = build_tiny(arch, tmp_path, layout="fused")
    result = build_proxy(
        BuildRequest(src, tmp_path / "proxy", keep=KEEP, method="three_view"),
        statistics=tiny_statistics[arch],
    )
    kept = {int(k): v["kept_experts"] for k, v in result.report["layers"].items()}
    with safe_open(str(result.out_dir / "model.safetensors"), framework="pt") as fh:
        assert any(re.search(r"experts\.gate_up_proj$", k) for k in fh.keys())  # noqa: SIM118
    check_surgery(src, result.out_dir, kept, KEEP)
    check_loads_and_runs(result.out_dir, KEEP)


def test_sharded_checkpoint_keeps_shards_and_index(tmp_path, tiny_statistics):
    from tiny_models import build_tiny

    src = build_tiny("qwen2_moe", tmp_path, max_shard_size="40KB")
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) > 2
    result = build_proxy(
        BuildRequest(src, tmp_path / "proxy", keep=KEEP, method="three_view"),
        statistics=tiny_statistics["qwen2_moe"],
    )
    out = result.out_dir
    assert sorted(p.name for p in out.glob("*.safetensors")) == shards
    index = json.loads((out / "model.safetensors.index.json").read_text())
    on_disk = {}
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            on_disk.update({k: f.name for k in fh.keys()})  # noqa: SIM118
    assert index["weight_map"] == on_disk
    assert index["metadata"]["total_size"] == result.report["memory"]["checkpoint_bytes"]["proxy"]
    kept = {int(k): v["kept_experts"] for k, v in result.report["layers"].items()}
    check_surgery(src, out, kept, KEEP)
    check_loads_and_runs(out, KEEP)


def test_qwen3_config_with_both_expert_keys(tmp_path, tiny_statistics):
    """Released Qwen3-MoE configs carry num_experts; transformers 5.24 writes num_local_experts: both patched."""
    from tiny_models import build_tiny

    src = build_tiny("qwen3_moe", tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    assert "num_local_experts" in cfg and "num_experts" not in cfg  # what this transformers writes
    cfg["num_experts"] = cfg["num_local_experts"]
    (src / "config.json").write_text(json.dumps(cfg, indent=2))
    result = build_proxy(
        BuildRequest(src, tmp_path / "proxy", keep=KEEP, method="frequency"),
        statistics=tiny_statistics["qwen3_moe"],
    )
    new = json.loads((result.out_dir / "config.json").read_text())
    assert new["num_experts"] == new["num_local_experts"] == KEEP
    assert result.report["config_changes"] == {"num_experts": [8, KEEP], "num_local_experts": [8, KEEP]}
    check_loads_and_runs(result.out_dir, KEEP)


def test_deepseek_flatten_group_policy(tiny_checkpoints, tiny_statistics, tmp_path):
    """keep=3 is impossible per group (not divisible by n_group=2) but works with n_group rewritten to 1."""
    src = tiny_checkpoints["deepseek_v3"]
    result = build_proxy(
        BuildRequest(src, tmp_path / "p", keep=3, method="three_view", group_policy="flatten"),
        statistics=tiny_statistics["deepseek_v3"],
    )  # fmt: skip
    new = json.loads((result.out_dir / "config.json").read_text())
    assert (new["n_routed_experts"], new["n_group"], new["topk_group"]) == (3, 1, 1)
    assert result.report["group_routing"]["policy"] == "flatten"
    kept = {int(k): v["kept_experts"] for k, v in result.report["layers"].items()}
    check_loads_and_runs(result.out_dir, 3)
    orig, proxy = _tensors(src), _tensors(result.out_dir)
    for layer, ids in kept.items():
        name = f"model.layers.{layer}.mlp.gate.e_score_correction_bias"
        assert proxy[name].dtype == torch.float32
        assert torch.equal(proxy[name], orig[name][ids])


def test_keep_ratio(tiny_checkpoints, tiny_statistics, tmp_path):
    result = build_proxy(
        BuildRequest(tiny_checkpoints["olmoe"], tmp_path / "p", keep_ratio=0.5, method="three_view"),
        statistics=tiny_statistics["olmoe"],
    )  # fmt: skip
    assert result.report["keep"] == 4
    # DeepSeek per-group: the ratio applies inside each group (0.75 of 4 per group -> 3 per group).
    result = build_proxy(
        BuildRequest(tiny_checkpoints["deepseek_v3"], tmp_path / "q", keep_ratio=0.75, method="frequency"),
        statistics=tiny_statistics["deepseek_v3"],
    )  # fmt: skip
    assert result.report["keep"] == 6


def test_report_contents(tiny_checkpoints, tiny_statistics, tmp_path):
    src = tiny_checkpoints["qwen3_moe"]
    stats = tiny_statistics["qwen3_moe"]
    report = build_proxy(BuildRequest(src, tmp_path / "p", keep=KEEP), statistics=stats).report
    on_disk = json.loads((tmp_path / "p" / "proxy_report.json").read_text())
    assert on_disk == report
    assert report["view_weights"] == pytest.approx({"router": 1 / 3, "coact": 1 / 3, "proto": 1 / 3})
    assert report["representative"] == "most_frequent"
    for layer, entry in report["layers"].items():
        s = stats[int(layer)]
        assert entry["frequencies"] == s.frequency.tolist()
        mass = s.routing_mass[entry["kept_experts"]].sum() / s.routing_mass.sum()
        assert entry["routing_mass_kept"] == pytest.approx(mass)
    mem = report["memory"]
    assert 0 < mem["accelerator_memory_ratio"] <= 1
    assert mem["checkpoint_bytes"]["proxy"] < mem["checkpoint_bytes"]["original"]
    assert report["parameters"]["by_component"]["proxy"]["routed_experts"] * 2 == (
        report["parameters"]["by_component"]["original"]["routed_experts"]
    )
    assert report["peak_rss_mb"] > 0 and report["timing_s"]["total"] > 0
    assert "proxy_report.json" in report["files"] and "tokenizer.json" in report["files"]
