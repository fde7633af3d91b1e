"""The GRPO engine: verl's formulas against naive references, metric names, weight sync, healthy
runs, determinism of a re-run manifest, the CLI, devices and configuration errors."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.reproduction import algos
from moeproxy.reproduction.backend import (
    LocalTorchBackend,
    ModelSpec,
    load_manifest,
    read_trace,
    traces_equal,
    write_trace,
)
from moeproxy.reproduction.config import EngineConfig, lr_at
from moeproxy.reproduction.device import (
    dtype_supported,
    peak_memory_mb,
    reset_peak,
    resolve_device,
)
from moeproxy.reproduction.engine import GRPOEngine
from moeproxy.reproduction.errors import DeviceUnavailable, InvalidEngineConfig
from moeproxy.reproduction.faults import FaultSpec
from moeproxy.reproduction.hooks import SyncPlan
from moeproxy.reproduction.metrics import STEP_METRICS
from moeproxy.reproduction.trainer import response_log_probs
from repro_models import cached_warm_tiny, small_config
from typer.testing import CliRunner

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    return cached_warm_tiny(tmp_path_factory.getbasetemp() / "repro-models")


# --- formulas against naive references ---------------------------------------------------------------

def test_grpo_advantages_match_a_loop():
    gen = torch.Generator().manual_seed(0)
    scores = (torch.rand(24, generator=gen) > 0.5).float()
    adv = algos.grpo_advantages(scores, 4)
    for g in range(6):
        grp = scores[g * 4 : (g + 1) * 4].tolist()
        mean = sum(grp) / 4
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / 3)  # unbiased, as torch.std
        for i in range(4):
            assert adv[g * 4 + i].item() == pytest.approx((grp[i] - mean) / (std + 1e-6), abs=1e-5)
    assert torch.allclose(algos.grpo_advantages(torch.tensor([1.0, 0.0]), 1), torch.tensor([1.0, 0.0]))


def test_vanilla_policy_loss_matches_the_formula():
    gen = torch.Generator().manual_seed(1)
    old = -torch.rand(5, 7, generator=gen) * 3
    new = old + torch.randn(5, 7, generator=gen) * 0.5
    adv = torch.randn(5, generator=gen)
    mask = (torch.rand(5, 7, generator=gen) > 0.2).long()
    loss, m = algos.vanilla_policy_loss(old, new, adv, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    tot, n, clipped, kl = 0.0, 0, 0, 0.0
    for b in range(5):
        a = adv[b].item()
        for t in range(7):
            if not mask[b, t]:
                continue
            r = math.exp(new[b, t].item() - old[b, t].item())
            l1, l2 = -a * r, -a * min(max(r, 0.8), 1.28)
            cl = max(l1, l2)
            if a < 0:
                cl = min(cl, -a * 3.0)
            tot += cl
            n += 1
            clipped += l2 > l1
            kl += old[b, t].item() - new[b, t].item()
    assert loss.item() == pytest.approx(tot / n, rel=1e-5)
    assert m["pg_clipfrac"].item() == pytest.approx(clipped / n, abs=1e-6)
    assert m["ppo_kl"].item() == pytest.approx(kl / n, rel=1e-4, abs=1e-7)


def test_kl_estimators_and_verl_clamp():
    logp, ref = torch.tensor([-1.0, -30.0, -2.0]), torch.tensor([-1.5, 0.0, -2.0])
    k1 = algos.kl_estimator("k1")(logp, ref)
    assert torch.allclose(k1, logp - ref)
    lv = algos.kl_estimator("low_var_kl")(logp, ref)
    x = (ref - logp)[0].item()
    assert lv[0].item() == pytest.approx(math.exp(x) - x - 1, rel=1e-6)
    assert lv[1].item() == pytest.approx(10.0)  # clamped as verl does
    assert lv[2].item() == 0.0
    assert algos.low_var_kl_unclamped(logp, ref)[1].item() > 1e12
    with pytest.raises(InvalidEngineConfig):
        algos.kl_estimator("k9")


def test_token_mean_aggregation_ignores_nan_on_padding():
    loss = torch.tensor([[1.0, 3.0, float("nan")], [2.0, float("nan"), float("nan")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert algos.agg_loss(loss, mask, "token-mean").item() == pytest.approx(2.0)
    assert algos.agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)


def test_lr_schedule_warmup_then_constant():
    cfg = EngineConfig(lr=1e-3, lr_warmup_steps=3)
    lrs = [lr_at(cfg, s) for s in range(6)]
    assert lrs[0] > 0 and lrs[0] < lrs[1] < lrs[2] < lrs[3] == lrs[5] == 1e-3


def test_config_validation():
    with pytest.raises(InvalidEngineConfig, match="ppo_mini_batch_size"):
        EngineConfig(prompts_per_step=10, ppo_mini_batch_size=4)
    with pytest.raises(InvalidEngineConfig, match="kl_loss_type"):
        EngineConfig(kl_loss_type="nope")
    with pytest.raises(InvalidEngineConfig, match="unknown task"):
        EngineConfig(tasks=("chess",))
    cfg = EngineConfig(tasks=("counting",))
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(InvalidEngineConfig, match="unknown engine option"):
        EngineConfig.from_dict({"learning_rate": 1})


def test_device_module():
    cpu = resolve_device("cpu")
    assert cpu.kind == "cpu" and cpu.string == "cpu"
    assert dtype_supported("cpu", "float32")
    with pytest.raises(DeviceUnavailable):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailable):
            resolve_device("cuda")
    reset_peak(cpu)
    big = torch.ones(8 * 2**20 // 4)  # 8 MB
    assert peak_memory_mb(cpu) > 8
    del big


# --- the engine --------------------------------------------------------------------------------------

def test_metric_names_are_verl_names_and_map_to_canonical_metrics(warm):
    engine = GRPOEngine(warm, config=small_config(), seed=0)
    values = engine.step(0)
    missing = [m for m in STEP_METRICS if m not in values]
    assert not missing
    layers = [k for k in values if k.startswith("moe/expert_entropy/layer_")]
    assert len(layers) == len(engine.trainer_policy.moe_layers)
    from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, alias_index

    index = alias_index(DEFAULT_ALIASES, "verl")
    spec_names = {  # SPEC section 4, verl column
        "critic/score/mean": "reward_mean", "actor/kl_loss": "kl", "actor/ppo_kl": "ppo_kl",
        "training/rollout_probs_diff_mean": "rollout_train_logp_diff", "rollout_corr/kl": "rollout_kl",
        "rollout_corr/rollout_is_mean": "importance_ratio", "moe/routing_agreement": "routing_agreement",
        "moe/expert_entropy": "expert_entropy",
        "training/rollout_probs_diff_max": "rollout_train_logp_diff_max", "actor/entropy": "entropy",
        "actor/grad_norm": "grad_norm", "actor/pg_loss": "pg_loss", "actor/pg_clipfrac": "clip_frac",
        "response_length/mean": "response_length", "actor/lr": "lr",
    }
    for name, canonical in spec_names.items():
        assert name in values
        assert index.get(name) == canonical, name


def test_healthy_run_has_tiny_logp_diff_and_no_nan(warm):
    trace = GRPOEngine(warm, config=small_config(), seed=1).run(3)
    for rec in trace:
        v = rec["values"]
        assert all(math.isfinite(x) for x in v.values()), v
        assert v["training/rollout_probs_diff_mean"] < 1e-5
        assert v["moe/routing_agreement"] == 1.0
        assert 0 < v["moe/expert_entropy"] <= 1
        assert 0 <= v["critic/score/mean"] <= 1
    assert any(rec["values"]["actor/ppo_kl"] != 0 for rec in trace)  # 4 mini-batch updates per step


def test_weight_sync_makes_rollout_and_trainer_log_probs_equal(warm):
    engine = GRPOEngine(warm, config=small_config(lr=1e-3), seed=2)
    engine.step(0)  # one update, then the sync
    _, ids, mask = engine.prompts(1)

    def rollout_vs_trainer():
        rb = engine.rollout.generate(
            ids, mask, step=1, generator=torch.Generator().manual_seed(0), injector=engine.injector, ctx=engine.ctx
        )
        with torch.no_grad():
            train, _ = response_log_probs(
                engine.trainer_policy, rb.input_ids, rb.attention_mask, rb.responses, temperature=1.0
            )
        m = rb.response_mask.bool()
        return (train[m] - rb.rollout_log_probs[m]).abs().max().item()

    assert rollout_vs_trainer() < 1e-5
    # one more update without a sync: the copies now differ
    engine.trainer.update(1, _batch_for_update(engine, 1))
    assert rollout_vs_trainer() > 1e-4
    copied = engine.rollout.load_weights(engine.trainer_policy, SyncPlan())
    assert copied == len(list(engine.trainer_policy.model.parameters())) + len(
        list(engine.trainer_policy.model.buffers())
    )
    assert rollout_vs_trainer() < 1e-5


def _batch_for_update(engine, step):
    from moeproxy.reproduction.trainer import TrainBatch

    examples, ids, mask = engine.prompts(step)
    rb = engine.rollout.generate(ids, mask, step=step, generator=engine.sampler, injector=engine.injector, ctx=engine.ctx)
    scores = torch.tensor(engine.score(step, examples, engine.completions(rb.responses, rb.response_mask)))
    adv = algos.grpo_advantages(scores, engine.config.group_size)
    adv = adv + torch.linspace(-1, 1, adv.numel())  # make sure the update moves the weights
    old, _, _ = engine.trainer.old_log_probs(step, rb.input_ids, rb.attention_mask, rb.responses, rb.response_mask)
    ref = engine.trainer.ref_log_probs(rb.input_ids, rb.attention_mask, rb.responses)
    return TrainBatch(rb.input_ids, rb.attention_mask, rb.responses, rb.response_mask, adv, old, ref, rb.rollout_log_probs)


def test_deepseek_v3_router_family_runs(tmp_path_factory):
    model = cached_warm_tiny(tmp_path_factory.getbasetemp() / "repro-models", arch="deepseek_v3", sft_steps=60)
    trace = GRPOEngine(model, config=small_config(), seed=0).run(1)
    v = trace[0]["values"]
    assert v["moe/routing_agreement"] == 1.0 and math.isfinite(v["actor/grad_norm"])
    assert len([k for k in v if k.startswith("moe/expert_entropy/layer_")]) == 2  # first layer is dense


# --- traces, manifests, CLI --------------------------------------------------------------------------

def test_trace_files_keep_nan_and_inf(tmp_path):
    trace = [{"step": 0, "values": {"a": float("nan"), "b": float("inf"), "c": -float("inf"), "d": 1.5}}]
    path = write_trace(tmp_path / "t.jsonl", trace)
    text = path.read_text()
    assert "NaN" in text and "Infinity" in text and "-Infinity" in text
    assert json.loads(text)["step"] == 0
    assert traces_equal(read_trace(path), trace)


def test_backend_writes_manifest_and_rerun_reproduces_the_trace(warm, tmp_path):
    from moeproxy.cli import app

    runner = CliRunner()
    out1 = tmp_path / "run1"
    res = runner.invoke(app, [
        "reproduce", "--model", str(warm), "--fault", "routing_mismatch", "--param", "onset=1",
        "--param", "magnitude=0.5", "--steps", "2", "--seeds", "0", "--out", str(out1), "--json",
        "--engine", "tasks=counting,brackets", "--engine", "max_new_tokens=4", "--engine", "prompts_per_step=4",
        "--engine", "ppo_mini_batch_size=2",
    ])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out1 / "manifest.json").read_text())
    assert manifest["fault"] == {
        "class": "routing_mismatch", "variant": "router_logit_noise", "family": "routing",
        "params": {"onset": 1, "duration": None, "magnitude": 0.5, "side": "rollout"},
    }
    assert manifest["seeds"] == [0] and manifest["steps"] == 2
    assert set(manifest["traces"].values()) == {"routing_mismatch-seed0.jsonl", "healthy-seed0.jsonl"}
    assert manifest["cost"]["wall_time_s"] > 0 and manifest["cost"]["peak_memory_mb"] > 0
    fault1 = read_trace(out1 / "routing_mismatch-seed0.jsonl")
    healthy1 = read_trace(out1 / "healthy-seed0.jsonl")
    assert [r["step"] for r in fault1] == [0, 1]
    # same seed: identical before the onset, different from it on
    assert traces_equal(fault1[:1], healthy1[:1])
    assert fault1[1]["values"]["moe/routing_agreement"] < healthy1[1]["values"]["moe/routing_agreement"]

    out2 = tmp_path / "run2"
    res = runner.invoke(app, ["reproduce", "--manifest", str(out1 / "manifest.json"), "--out", str(out2), "--quiet"])
    assert res.exit_code == 0, res.output
    for name in ("routing_mismatch-seed0.jsonl", "healthy-seed0.jsonl"):
        assert traces_equal(read_trace(out1 / name), read_trace(out2 / name))
    req = load_manifest(out2 / "manifest.json")
    assert req.fault == FaultSpec("routing_mismatch", "router_logit_noise", {"onset": 1, "magnitude": 0.5})


def test_cli_refuses_bad_input_with_a_message(warm, tmp_path):
    from moeproxy.cli import app

    runner = CliRunner()
    base = ["reproduce", "--model", str(warm), "--steps", "1", "--out", str(tmp_path / "x")]
    for extra, needle in [
        (["--fault", "cosmic_rays"], "unknown fault class"),
        (["--fault", "reward_fault", "--variant", "sometimes"], "no variant"),
        (["--fault", "reward_fault", "--param", "colour=red"], "takes no parameter"),
        (["--fault", "reward_fault", "--param", "onset"], "key=value"),
        (["--fault", "healthy", "--engine", "ppo_mini_batch_size=3"], "ppo_mini_batch_size"),
        (["--fault", "healthy", "--seeds", "a,b"], "--seeds"),
    ]:
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        assert needle in res.output, (extra, res.output)
    res = runner.invoke(app, ["reproduce", "--model", str(tmp_path / "missing"), "--fault", "healthy", "--out", "x"])
    assert res.exit_code == 2 and "not a directory" in res.output


def test_backend_run_one_without_files(warm):
    trace, info = LocalTorchBackend().run_one(
        ModelSpec(str(warm)), FaultSpec("healthy"), 0, 1, config=small_config()
    )
    assert len(trace) == 1 and info["model"]["num_experts"] == 8 and info["cost"]["wall_time_s"] > 0


def test_post_streams_every_step_to_the_service_over_http(warm, tmp_path):
    """``--post`` goes through moeproxy.client.MetricsClient to a real HTTP server."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from moeproxy.cli import app

    received: dict[str, list] = {"runs": [], "metrics": [], "auth": []}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received["auth"].append(self.headers.get("Authorization"))
            if self.path == "/api/v1/runs":
                received["runs"].append(body)
                self._reply(201, {"id": len(received["runs"])})
            else:
                received["metrics"].append((self.path, body))
                self._reply(200, {"accepted": sum(len(s["values"]) for s in body["steps"])})

        def do_PATCH(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(200, {})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        res = CliRunner().invoke(app, [
            "reproduce", "--model", str(warm), "--fault", "reward_fault", "--variant", "constant", "--steps", "2",
            "--out", str(tmp_path / "o"), "--post", url, "--token", "tok123", "--quiet",
            "--engine", "tasks=counting", "--engine", "max_new_tokens=3", "--engine", "prompts_per_step=2",
            "--engine", "ppo_mini_batch_size=1",
        ])
    finally:
        server.shutdown()
    assert res.exit_code == 0, res.output
    names = sorted(r["name"] for r in received["runs"])
    assert len(names) == 2 and any(n.endswith("healthy-seed0") for n in names)
    assert all(r["framework"] == "verl" for r in received["runs"])
    assert set(received["auth"]) == {"Bearer tok123"}
    steps = sorted((p, s["step"]) for p, body in received["metrics"] for s in body["steps"])
    assert len(steps) == 4 and {s for _, s in steps} == {0, 1}
    one = received["metrics"][0][1]["steps"][0]["values"]
    assert "critic/score/mean" in one and "training/rollout_probs_diff_mean" in one
