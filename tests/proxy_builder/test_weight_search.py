"""--view-weights auto, and the in-memory proxy it evaluates against the proxy written to disk."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.proxy_builder.architectures import architecture_for, group_spec
from moeproxy.proxy_builder.build import BuildRequest, build_proxy, load_model
from moeproxy.proxy_builder.params import moe_layer_indices
from moeproxy.proxy_builder.weight_search import in_memory_proxy
from tiny_models import ARCH_CASES, tiny_config

torch.set_num_threads(1)


@pytest.mark.parametrize("arch", ["qwen2_moe", "mixtral", "deepseek_v3"])
def test_in_memory_proxy_equals_disk_proxy(arch, tiny_checkpoints, tiny_statistics, tmp_path):
    """The KL search evaluates exactly the model the surgery writes: same logits."""
    src = tiny_checkpoints[arch]
    result = build_proxy(BuildRequest(src, tmp_path / "p", keep=4), statistics=tiny_statistics[arch])
    kept = {int(k): v["kept_experts"] for k, v in result.report["layers"].items()}
    model, _ = load_model(src)
    config = json.loads((src / "config.json").read_text())
    a = architecture_for(config)
    live = in_memory_proxy(model, a, kept, 4, group_spec(a, config, 4, "per_group"))
    disk, _ = load_model(result.out_dir)
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(live(ids).logits, disk(ids).logits, rtol=0, atol=0)
        assert not torch.equal(model(ids).logits, disk(ids).logits)


def test_auto_view_weights(tiny_checkpoints, calibration_file, tmp_path):
    result = build_proxy(
        BuildRequest(
            tiny_checkpoints["qwen3_moe"],
            tmp_path / "p",
            keep=4,
            calibration=str(calibration_file),
            max_tokens=1500,
            seq_len=64,
            batch_size=4,
            view_weights="auto",
        )
    )  # fmt: skip
    report = result.report
    search = report["view_weight_search"]
    assert report["view_weights_mode"] == "auto" and search["step"] == 0.25
    assert len(search["grid"]) == 16
    best = min(search["grid"], key=lambda r: r["kl"])
    assert all(r["kl"] >= 0 for r in search["grid"])
    chosen = report["view_weights"]
    assert chosen == pytest.approx(best["weights"])
    assert report["calibration"]["heldout_tokens"] > 0
    assert report["calibration"]["tokens"] + report["calibration"]["heldout_tokens"] == 1500


@pytest.mark.parametrize("case", list(ARCH_CASES))
def test_moe_layers_agree_with_planner(case):
    """The builder's and the planner's tables agree on which layers are MoE."""
    arch, overrides = ARCH_CASES[case]
    for extra in ({}, {"num_hidden_layers": 4}, {"first_k_dense_replace": 2, "num_hidden_layers": 4},
                  {"decoder_sparse_step": 2, "num_hidden_layers": 4}, {"mlp_only_layers": [0]}):  # fmt: skip
        cfg = tiny_config(arch, **{**overrides, **extra})
        assert architecture_for(cfg).moe_layers(cfg) == moe_layer_indices(cfg)


def test_mtp_layers_take_the_last_layers_selection(tiny_checkpoints, tiny_statistics, tmp_path):
    """A DeepSeek checkpoint with a multi-token-prediction layer (index >= num_hidden_layers) on disk."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    src = tmp_path / "mtp"
    shutil.copytree(tiny_checkpoints["deepseek_v3"], src)
    with safe_open(str(src / "model.safetensors"), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
        meta = fh.metadata()
    for k in list(state):
        if k.startswith("model.layers.2."):
            state[k.replace("model.layers.2.", "model.layers.3.")] = state[k].clone()
    save_file(state, str(src / "model.safetensors"), metadata=meta)
    result = build_proxy(BuildRequest(src, tmp_path / "p", keep=4), statistics=tiny_statistics["deepseek_v3"])
    layers = result.report["layers"]
    assert layers["3"] == {"kept_experts": layers["2"]["kept_experts"], "copied_from_layer": 2}
    with safe_open(str(result.out_dir / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
        kept = layers["2"]["kept_experts"]
        np.testing.assert_array_equal(
            fh.get_tensor("model.layers.3.mlp.gate.weight").numpy(), state["model.layers.3.mlp.gate.weight"][kept].numpy()
        )
    assert "model.layers.3.mlp.experts.3.up_proj.weight" in keys
    assert "model.layers.3.mlp.experts.4.up_proj.weight" not in keys
