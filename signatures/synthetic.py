"""Synthetic RL metric traces with known answers, for tests and the latency benchmark.

Nothing here comes from a model: each fault class is drawn as the signature SPEC section 3
describes it (which metrics move, in which direction, with which shape), on top of an autocorrelated
healthy baseline, under verl's metric names. Tests use it to check that each component finds what
was put in (the onset step, the direction, the injected class first); the latency benchmark uses it
to build a library of the right size. Fingerprints built from these traces are marked
``provenance.source = "synthetic"`` and are never shipped as the package's library.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from moeproxy.signatures.canonical import RunMetrics

METRICS: tuple[str, ...] = (
    "critic/score/mean",
    "actor/kl_loss",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/lr",
    "response_length/mean",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "rollout_corr/kl",
    "moe/routing_agreement",
    "moe/expert_entropy",
)


def _ar(rng: np.random.Generator, n: int, phi: float = 0.6) -> np.ndarray:
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i] * np.sqrt(1 - phi * phi)
    return x


def healthy_traces(n: int, rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    t = np.arange(n, dtype=np.float64)
    tau = max(8.0, n / 4)
    return {
        "critic/score/mean": 0.2 + 0.5 * (1 - np.exp(-t / tau)) + 0.02 * _ar(rng, n),
        "actor/kl_loss": 1e-3 * scale * (1 + t / tau) + 1e-4 * scale * _ar(rng, n),
        "actor/ppo_kl": 2e-4 + 2e-5 * _ar(rng, n),
        "actor/entropy": 1.2 - 0.05 * t / n + 0.01 * _ar(rng, n),
        "actor/grad_norm": 0.5 * scale + 0.05 * scale * _ar(rng, n),
        "actor/pg_loss": 0.02 * _ar(rng, n),
        "actor/pg_clipfrac": 2e-3 + 2e-4 * _ar(rng, n),
        "actor/lr": np.full(n, 1e-6),
        "response_length/mean": 12.0 + 0.3 * _ar(rng, n),
        "training/rollout_probs_diff_mean": 1e-3 + 5e-5 * _ar(rng, n),
        "training/rollout_probs_diff_max": 0.02 + 1e-3 * _ar(rng, n),
        "rollout_corr/kl": 1e-4 + 5e-6 * _ar(rng, n),
        "moe/routing_agreement": 0.995 + 5e-4 * _ar(rng, n),
        "moe/expert_entropy": 3.5 + 0.01 * _ar(rng, n),
    }


Injector = Callable[[dict[str, np.ndarray], np.ndarray, float, np.random.Generator], None]


def _after(t: np.ndarray, onset: int) -> np.ndarray:
    return (t >= onset).astype(np.float64)


def _ramp(t: np.ndarray, onset: int, length: float) -> np.ndarray:
    return np.clip((t - onset) / length, 0.0, None)


def _omission(x, t, onset, mag, rng):
    post = _after(t, onset)
    x["actor/ppo_kl"] = x["actor/ppo_kl"] * (1 - post) + post * 1e-7 * (1 + 0.1 * np.abs(rng.normal(size=t.size)))
    x["actor/pg_clipfrac"] = x["actor/pg_clipfrac"] * (1 - post)
    frozen = x["critic/score/mean"][onset]
    x["critic/score/mean"] = np.where(post > 0, frozen + 0.02 * _ar(rng, t.size), x["critic/score/mean"])
    x["actor/kl_loss"] = np.where(post > 0, x["actor/kl_loss"][onset], x["actor/kl_loss"])


def _stale(x, t, onset, mag, rng):
    r = _ramp(t, onset, 4.0)
    x["training/rollout_probs_diff_mean"] += 1e-3 * mag * (_after(t, onset) * 10 + 5 * r)
    x["rollout_corr/kl"] += 1e-4 * mag * (_after(t, onset) * 20 + 10 * r)
    x["actor/pg_clipfrac"] += 0.05 * _after(t, onset)
    x["actor/grad_norm"] *= 1 - 0.8 * _after(t, onset)
    frozen = x["critic/score/mean"][onset]
    x["critic/score/mean"] = np.where(t >= onset, frozen + 0.02 * _ar(rng, t.size), x["critic/score/mean"])


def _precision(x, t, onset, mag, rng):
    post = _after(t, onset)
    x["training/rollout_probs_diff_mean"] *= 1 + 10 * mag * post
    x["training/rollout_probs_diff_max"] *= 1 + 2 * mag * post
    x["rollout_corr/kl"] *= 1 + 15 * mag * post
    x["actor/pg_clipfrac"] += 0.01 * mag * post


def _noise(x, t, onset, mag, rng):
    x["training/rollout_probs_diff_max"] += 0.3 * mag * _after(t, onset)
    x["training/rollout_probs_diff_mean"] += 3e-4 * mag * _ramp(t, onset, 10.0)
    late = onset + 8
    spikes = (t >= late) & (rng.random(t.size) < 0.3)
    x["actor/grad_norm"] += np.where(spikes, 5.0 * mag, 0.0)


def _routing(x, t, onset, mag, rng):
    r = _ramp(t, onset, 10.0)
    x["training/rollout_probs_diff_mean"] += 1e-3 * mag * (3 * _after(t, onset) + 3 * r)
    x["rollout_corr/kl"] += 1e-4 * mag * (5 * _after(t, onset) + 5 * r)
    x["moe/routing_agreement"] -= 0.1 * mag * _after(t, onset)


def _router(x, t, onset, mag, rng):
    post = _after(t, onset)
    x["moe/expert_entropy"] -= 1.5 * mag * post
    x["critic/score/mean"] -= 0.3 * mag * _ramp(t, onset, 5.0).clip(0, 1)
    x["actor/entropy"] += 0.1 * mag * post


def _overflow(x, t, onset, mag, rng):
    bad = (t >= onset) & (rng.random(t.size) < 0.6)
    bad[onset] = True
    x["actor/grad_norm"] = np.where(bad, np.where(rng.random(t.size) < 0.5, np.inf, np.nan), x["actor/grad_norm"])
    x["actor/pg_loss"] = np.where(t >= onset + 2, np.nan, x["actor/pg_loss"])
    x["critic/score/mean"] -= 0.5 * _ramp(t, onset + 2, 5.0).clip(0, 1)


def _lr(x, t, onset, mag, rng):
    post = _after(t, onset)
    x["actor/lr"] = x["actor/lr"] * (1 + 99 * post)
    x["actor/grad_norm"] += 3.0 * mag * post * (1 + np.abs(rng.normal(size=t.size)))
    x["actor/kl_loss"] += 0.05 * mag * _ramp(t, onset, 5.0)
    x["actor/entropy"] -= 0.8 * _ramp(t, onset, 6.0).clip(0, 1)
    x["critic/score/mean"] -= 0.4 * _ramp(t, onset, 6.0).clip(0, 1)


def _kl(x, t, onset, mag, rng):
    x["actor/kl_loss"] += 1e-3 * mag * (np.exp(_ramp(t, onset, 8.0).clip(0, 6)) - 1)
    x["response_length/mean"] += 3.0 * mag * _ramp(t, onset, 10.0)


def _reward(x, t, onset, mag, rng):
    post = _after(t, onset)
    x["critic/score/mean"] = x["critic/score/mean"] * (1 - post) + post * (0.01 + 0.005 * _ar(rng, t.size))
    x["actor/pg_loss"] *= 1 - 0.9 * post
    x["actor/grad_norm"] *= 1 - 0.7 * post


INJECTORS: dict[str, Injector] = {
    "actor_update_omission": _omission,
    "stale_weight_sync": _stale,
    "rollout_logp_precision": _precision,
    "operator_numeric_noise": _noise,
    "routing_mismatch": _routing,
    "router_corruption": _router,
    "gradient_overflow": _overflow,
    "lr_misconfiguration": _lr,
    "kl_misconfiguration": _kl,
    "reward_fault": _reward,
}


def synthetic_run(fault_class: str, *, steps: int = 60, onset: int = 20, magnitude: float = 1.0,
                  seed: int = 0, scale: float = 1.0, metrics: tuple[str, ...] | None = None) -> RunMetrics:
    """One run of ``fault_class`` (or ``"healthy"``) under verl names; ``scale`` changes the levels
    of the scale-dependent metrics, the way a larger model differs from its proxy."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64)
    x = healthy_traces(steps, rng, scale)
    if fault_class != "healthy":
        INJECTORS[fault_class](x, t, onset, magnitude, rng)
    keep = metrics or METRICS
    return RunMetrics.from_arrays({m: x[m] for m in keep}, framework="verl",
                                  name=f"synthetic-{fault_class}-seed{seed}")
