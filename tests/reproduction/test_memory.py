"""Peak tensor memory: the event arithmetic against hand-computed peaks, a model load against its
exact parameter bytes, and a half-expert proxy against its original in a real RL step."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.reproduction.memory import (
    CATEGORIES,
    AllocationEvent,
    InvalidMemoryRequest,
    categorised_peak,
    measure_tensor_memory,
    peak_from_events,
    peak_generation_memory,
    peak_rl_step_memory,
    tensor_bytes,
)
from repro_models import small_config

torch.set_num_threads(1)

FLOAT32 = 4


def _bf16_tiny(out, **overrides):
    """A tiny Qwen3-MoE stored in bf16 with the task suite's tokenizer, as the reference models are."""
    from moeproxy.reproduction.tokenizer import VOCAB_SIZE, build_tokenizer
    from tiny_models import build_model

    cfg = {"vocab_size": VOCAB_SIZE, "hidden_size": 48, "num_experts_per_tok": 2, "num_experts": 8, "head_dim": 12}
    cfg.update(overrides)
    model = build_model("qwen3_moe", seed=0, **cfg)
    model.to(torch.bfloat16).save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _bf16_tiny(tmp_path_factory.mktemp("memory") / "qwen3-moe-8e")


@pytest.fixture(scope="module")
def tiny_proxy(tiny, tmp_path_factory):
    from moeproxy.proxy_builder import BuildRequest, build_proxy
    from moeproxy.reproduction.tasks import calibration_corpus

    out = tmp_path_factory.mktemp("memory") / "qwen3-moe-4e"
    build_proxy(
        BuildRequest(
            tiny, out, keep_ratio=0.5, method="frequency", calibration=calibration_corpus(64, seed=0), seed=0
        )
    )
    return out


# --- the arithmetic ----------------------------------------------------------------------------------

def _naive_peak(ops, sizes):
    """Replay alloc/free ops on a dict and take the max of the live total after every op."""
    live, peak = {}, 0
    for op, name in ops:
        if op == "alloc":
            live[name] = sizes[name]
        else:
            del live[name]
        peak = max(peak, sum(live.values()))
    return peak, sum(live.values())


def test_known_tensors_give_the_hand_computed_peak():
    with measure_tensor_memory("cpu") as meter:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 B
        b = torch.empty(2000, dtype=torch.float32)  # 8000 B -> 12000
        c = torch.empty(500, dtype=torch.float32)  # 2000 B -> 14000
        del b  # -> 6000
        d = torch.empty(3000, dtype=torch.float32)  # 12000 B -> 18000, the peak
        del a  # -> 14000
    r = meter.result
    assert (r.peak_bytes, r.end_bytes, r.method) == (18000, 14000, "profiler")
    assert (c.numel(), d.numel()) == (500, 3000)


def test_random_alloc_free_sequences_match_a_naive_replay():
    rng = random.Random(0)
    for trial in range(5):
        sizes, ops, alive = {}, [], []
        for i in range(40):
            if alive and rng.random() < 0.4:
                ops.append(("free", alive.pop(rng.randrange(len(alive)))))
            else:
                sizes[i] = rng.randrange(1, 5000) * FLOAT32
                ops.append(("alloc", i))
                alive.append(i)
        expected_peak, expected_end = _naive_peak(ops, sizes)
        held = {}
        with measure_tensor_memory("cpu", live_at_start=100 * trial) as meter:
            for op, name in ops:
                if op == "alloc":
                    held[name] = torch.empty(sizes[name] // FLOAT32, dtype=torch.float32)
                else:
                    del held[name]
        assert meter.result.peak_bytes == expected_peak + 100 * trial
        assert meter.result.end_bytes == expected_end + 100 * trial


def test_phases_have_their_own_hand_computed_peaks():
    with measure_tensor_memory("cpu") as meter:
        with meter.phase("first"):
            x = torch.empty(1000, dtype=torch.float32)  # 4000
            y = torch.empty(500, dtype=torch.float32)  # 6000, the first phase's peak
            del y  # 4000
        with meter.phase("second"):
            z = torch.empty(2000, dtype=torch.float32)  # 12000, the second phase's peak
            del x  # 8000
    r = meter.result
    first, second = r.phases["first"], r.phases["second"]
    assert (first.live_at_start_bytes, first.peak_bytes, first.end_bytes) == (0, 6000, 4000)
    assert (second.live_at_start_bytes, second.peak_bytes, second.end_bytes) == (4000, 12000, 8000)
    assert (r.peak_bytes, r.end_bytes, z.numel()) == (12000, 8000, 2000)
    with pytest.raises(InvalidMemoryRequest, match="twice"), measure_tensor_memory("cpu") as meter:
        with meter.phase("a"):
            pass
        with meter.phase("a"):
            pass


def test_peak_from_events_reports_preexisting_frees_without_subtracting():
    events = [
        AllocationEvent(1, 100, 0xA),
        AllocationEvent(2, -50, 0xB),  # a block from before the window
        AllocationEvent(3, 30, 0xC),
        AllocationEvent(4, -100, 0xA),
        AllocationEvent(5, 20, 0xD),
    ]
    s = peak_from_events(events, live_at_start=1000, windows={"tail": (4, 5), "after": (9, 9)})
    assert (s.peak_bytes, s.end_bytes, s.freed_preexisting_bytes, s.peak_time_ns) == (1130, 1050, 50, 3)
    assert s.live_at_end == {0xC: 30, 0xD: 20}
    tail, after = s.windows["tail"], s.windows["after"]
    assert (tail.start_bytes, tail.peak_bytes, tail.end_bytes) == (1130, 1130, 1050)
    assert (after.start_bytes, after.peak_bytes, after.end_bytes) == (1050, 1050, 1050)
    with pytest.raises(InvalidMemoryRequest):
        peak_from_events(events, live_at_start=-1)


def test_categorised_peak_applies_one_instant_together():
    timeline = [
        (1, "parameter", 100), (2, "activation", 40), (3, "activation", 60),
        (3, "activation", -40),  # same instant as the +60: no 200-byte peak
        (4, "gradient", 10), (5, "activation", -60),
    ]
    total, split, windows = categorised_peak(timeline, live_at_start=5, windows={"late": (4, 9)})
    assert total == 175
    assert split == {**dict.fromkeys(CATEGORIES, 0), "parameter": 105, "activation": 60, "gradient": 10}
    late = windows["late"]
    assert (late.start_bytes, late.peak_bytes, late.end_bytes) == (165, 175, 115)
    assert late.by_category == split


def test_tensor_bytes_counts_shared_storage_once():
    lin = torch.nn.Linear(4, 3)  # 12 + 3 floats
    view = lin.weight.data[:1]
    assert tensor_bytes(lin) == 15 * FLOAT32
    assert tensor_bytes(lin, view, [lin.bias]) == 15 * FLOAT32
    with pytest.raises(InvalidMemoryRequest):
        tensor_bytes("weights")


# --- real models ---------------------------------------------------------------------------------------

def _checkpoint_bytes(path):
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def test_loading_a_model_holds_its_exact_parameter_bytes(tiny):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)  # imports and lazy inits outside
    with measure_tensor_memory("cpu") as meter:
        model = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    exact = tensor_bytes(model)
    assert exact == FLOAT32 * (sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers()))
    r = meter.result
    assert r.end_bytes == exact  # bf16 on disk -> fp32: every tensor converted, nothing else kept
    # while loading, the bf16 file buffer and at most one expert stack being converted are alive on top
    largest = max(t.untyped_storage().nbytes() for t in model.parameters())
    assert exact <= r.peak_bytes <= exact + _checkpoint_bytes(tiny) + largest


def test_generation_peak_counts_weights_and_cache(tiny):
    g = peak_generation_memory(tiny, ["count: a a a", "1+2=", "()()"], max_new_tokens=6)
    assert g.batch_size == 3 and g.memory.device == "cpu"
    load, generate = g.memory.phases["load"], g.memory.phases["generate"]
    assert load.end_bytes == generate.live_at_start_bytes == g.parameter_bytes
    assert g.peak_bytes == generate.peak_bytes > g.parameter_bytes  # weights + activations + KV cache
    assert g.memory.peak_bytes == max(load.peak_bytes, generate.peak_bytes)


def test_categories_attribute_adamw_moments_to_optimizer_state(tiny):
    r = peak_rl_step_memory(tiny, config=small_config(max_new_tokens=3), categories=True)
    cats = r.peak.by_category
    assert cats is not None, r.memory.notes
    assert set(cats) == set(CATEGORIES)
    assert sum(cats.values()) == r.peak_bytes  # the categorised timeline and the allocator events agree
    assert not r.memory.notes
    # AdamW creates exp_avg and exp_avg_sq (fp32, one each per parameter) on the first optimizer
    # step and keeps them; the peak is in the update, at or after that step, so both are counted
    trainable = r.parameter_bytes
    assert 2 * trainable <= cats["optimizer_state"] <= 2 * trainable + 64 * FLOAT32
    assert cats["parameter"] >= trainable


def test_half_expert_proxy_needs_less_memory_for_an_rl_step(tiny, tiny_proxy):
    config = small_config()
    original = peak_rl_step_memory(tiny, config=config)
    proxy = peak_rl_step_memory(tiny_proxy, config=config)
    assert original.copies == proxy.copies == 3
    parameter_ratio = proxy.parameter_bytes / original.parameter_bytes
    memory_ratio = proxy.peak_bytes / original.peak_bytes
    assert 0.5 < parameter_ratio < 1  # experts are half, attention and embeddings stay
    # three weight copies, gradients and AdamW scale with the parameters; activations do not
    assert parameter_ratio < memory_ratio < 1
    # at least every copy's weights, the gradients and both AdamW moments are alive at the peak
    assert original.peak_bytes >= 3 * original.parameter_bytes + 2 * original.parameter_bytes
    assert original.memory.phases["steps"].live_at_start_bytes >= 3 * original.parameter_bytes


def test_bad_requests_fail_before_work(tmp_path, tiny):
    with pytest.raises(InvalidMemoryRequest, match="config.json"):
        peak_generation_memory(tmp_path, ["x"])
    with pytest.raises(InvalidMemoryRequest, match="prompts"):
        peak_generation_memory(tiny, [])
    with pytest.raises(InvalidMemoryRequest, match="steps"):
        peak_rl_step_memory(tiny, steps=0)
    with pytest.raises(InvalidMemoryRequest, match="EngineConfig"):
        peak_rl_step_memory(tiny, config={"lr": 1.0})
    with pytest.raises(InvalidMemoryRequest, match="negative"):
        measure_tensor_memory("cpu", live_at_start=-1).__enter__()


def test_rss_probe_reports_the_process_figure_of_a_fresh_engine(tiny):
    from moeproxy.reproduction.memory import rss_probe

    out = rss_probe(tiny, small_config(), steps=1)
    assert "error" not in out, out
    assert out["peak_rss_mb"] >= out["rss_before_load_mb"] > 0
    assert out["run_mb"] == pytest.approx(out["peak_rss_mb"] - out["rss_before_load_mb"])
    with pytest.raises(InvalidMemoryRequest, match="steps"):
        rss_probe(tiny, small_config(), steps=0)
