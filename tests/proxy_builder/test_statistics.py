"""Routing statistics: the vectorised accumulator against a naive per-token loop, and the hooks end to end."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.proxy_builder.architectures import architecture_for
from moeproxy.proxy_builder.build import load_model
from moeproxy.proxy_builder.layer_stats import Batch, load_statistics, save_statistics
from moeproxy.proxy_builder.statistics import RoutingAccumulator, collect_statistics

torch.set_num_threads(1)


def naive(x, ids, w, mask, num_experts, weighted):
    e, h = num_experts, x.shape[1]
    freq = np.zeros(e, np.int64)
    co = np.zeros((e, e), np.int64)
    psum = np.zeros((e, h))
    pw = np.zeros(e)
    mass = np.zeros(e)
    tokens = 0
    for t in range(x.shape[0]):
        if mask is not None and not mask[t]:
            continue
        tokens += 1
        chosen = [int(i) for i in ids[t]]
        for slot, i in enumerate(chosen):
            freq[i] += 1
            weight = float(w[t, slot])
            mass[i] += weight
            psum[i] += (weight if weighted else 1.0) * x[t].astype(np.float64)
            pw[i] += weight if weighted else 1.0
            for j in chosen:
                co[i, j] += 1
    return tokens, freq, co, psum, pw, mass


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accumulator_matches_naive_loop(seed, weighted):
    rng = np.random.default_rng(seed)
    e, h, k = 10, 6, 3
    acc = RoutingAccumulator(0, e, h, weighted_prototypes=weighted)
    batches = []
    for _ in range(4):
        t = int(rng.integers(1, 40))
        x = rng.normal(size=(t, h)).astype(np.float32)
        ids = np.stack([rng.choice(e, size=k, replace=False) for _ in range(t)])
        w = rng.random((t, k)).astype(np.float32)
        mask = rng.random(t) > 0.3
        batches.append((x, ids, w, mask))
        acc.update(torch.from_numpy(x), torch.from_numpy(ids), torch.from_numpy(w), torch.from_numpy(mask))
    cat = [np.concatenate([b[i] for b in batches]) for i in range(4)]
    tokens, freq, co, psum, pw, mass = naive(*cat, e, weighted)
    s = acc.result(torch.zeros(e, h))
    assert s.tokens == tokens
    np.testing.assert_array_equal(s.frequency, freq)
    np.testing.assert_array_equal(s.coactivation, co)
    np.testing.assert_array_equal(np.diag(s.coactivation), s.frequency)
    np.testing.assert_allclose(s.prototype_sum, psum, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.prototype_weight, pw, rtol=1e-5)
    np.testing.assert_allclose(s.routing_mass, mass, rtol=1e-5)
    expected_proto = psum / np.where(pw > 0, pw, 1)[:, None]
    np.testing.assert_allclose(s.prototypes, expected_proto, rtol=1e-4, atol=1e-5)


def test_fully_masked_batch_counts_nothing():
    acc = RoutingAccumulator(0, 4, 2)
    acc.update(torch.ones(3, 2), torch.tensor([[0, 1]] * 3), torch.ones(3, 2), torch.zeros(3, dtype=torch.bool))
    s = acc.result(torch.zeros(4, 2))
    assert s.tokens == 0 and s.frequency.sum() == 0 and s.coactivation.sum() == 0


def _routing_by_hand(model, arch, layers, ids):
    """Top-k ids per MoE layer recomputed from the router module on captured inputs (no accumulator)."""
    captured = {}
    modules = dict(model.named_modules())
    handles = [
        modules[arch.runtime_router.format(layer=layer)].register_forward_hook(
            lambda m, a, o, layer=layer: captured.__setitem__(layer, (a[0].reshape(-1, a[0].shape[-1]), o[2]))
        )
        for layer in layers
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in handles:
        h.remove()
    return captured


@pytest.mark.parametrize("arch_name", ["qwen3_moe", "deepseek_v3"])
def test_hooks_count_what_the_router_chose(arch_name, tiny_checkpoints):
    path = tiny_checkpoints[arch_name]
    model, _ = load_model(path)
    config = model.config.to_dict()
    arch = architecture_for(config)
    layers = arch.moe_layers(config)
    ids = torch.randint(4, 200, (1, 50), generator=torch.Generator().manual_seed(0))
    stats = collect_statistics(model, [Batch(ids.numpy(), np.ones_like(ids.numpy()))], arch, layers)
    by_hand = _routing_by_hand(model, arch, layers, ids)
    for layer in layers:
        _x, chosen = by_hand[layer]
        expected = np.bincount(chosen.reshape(-1).numpy(), minlength=8)
        np.testing.assert_array_equal(stats[layer].frequency, expected)
        assert stats[layer].tokens == 50
        np.testing.assert_array_equal(stats[layer].router_weight, dict(model.named_parameters())[
            arch.runtime_router.format(layer=layer) + ".weight"].detach().numpy())


def test_padding_is_excluded(tiny_checkpoints):
    """A right-padded batch gives the same statistics as the sequences run one by one."""
    path = tiny_checkpoints["olmoe"]
    model, _ = load_model(path)
    config = model.config.to_dict()
    arch = architecture_for(config)
    layers = arch.moe_layers(config)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, 200, size=n) for n in (5, 17, 9)]
    width = max(len(s) for s in seqs)
    ids = np.zeros((3, width), np.int64)
    mask = np.zeros((3, width), np.int64)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = s
        mask[r, : len(s)] = 1
    padded = collect_statistics(model, [Batch(ids, mask)], arch, layers)
    single = collect_statistics(model, [Batch(s[None], np.ones((1, len(s)), np.int64)) for s in seqs], arch, layers)
    for layer in layers:
        assert padded[layer].tokens == single[layer].tokens == 31
        np.testing.assert_array_equal(padded[layer].frequency, single[layer].frequency)
        np.testing.assert_array_equal(padded[layer].coactivation, single[layer].coactivation)
        np.testing.assert_allclose(padded[layer].prototype_sum, single[layer].prototype_sum, rtol=1e-4, atol=1e-5)
    unmasked = collect_statistics(model, [Batch(ids, np.ones_like(mask))], arch, layers)
    assert unmasked[layers[0]].tokens == 3 * width  # without the mask, padding would count


def test_statistics_round_trip(tiny_statistics, tmp_path):
    stats = tiny_statistics["deepseek_v3"]
    save_statistics(stats, tmp_path / "s.npz")
    back = load_statistics(tmp_path / "s.npz")
    assert sorted(back) == sorted(stats)
    for layer in stats:
        assert back[layer].tokens == stats[layer].tokens
        np.testing.assert_array_equal(back[layer].coactivation, stats[layer].coactivation)
        np.testing.assert_array_equal(back[layer].router_weight, stats[layer].router_weight)
