import numpy as np
from moeproxy.signatures.canonical import MetricSeries, RunMetrics
from moeproxy.signatures.consistency import consistency
from moeproxy.signatures.synthetic import synthetic_run


def _mirrored(run: RunMetrics, onset: int) -> RunMetrics:
    """The same run with every effect reversed around its pre-onset level."""
    out = {}
    for name, s in run.series.items():
        base = float(np.median(s.values[:onset]))
        out[name] = MetricSeries(s.steps, 2 * base - s.values)
    return RunMetrics(out, run.framework)


def test_a_run_is_consistent_with_itself():
    run = synthetic_run("stale_weight_sync", seed=1, steps=60, onset=20)
    r = consistency(run, run)
    assert r.verdict == "consistent"
    assert r.direction_agreement == 1.0
    changed = [m for m in r.metrics if m.changed]
    assert changed and all(m.onset_offset in (0, None) and (m.dtw_distance or 0) == 0 for m in changed)
    d = r.to_dict()
    assert d["verdict"] == "consistent" and d["changed_metrics"] == len(changed)


def test_opposite_direction_copy_is_inconsistent():
    run = synthetic_run("rollout_logp_precision", seed=2, steps=60, onset=20)
    r = consistency(run, _mirrored(run, 20))
    assert r.verdict == "inconsistent"
    assert r.direction_agreement == 0.0


def test_proxy_like_and_original_like_runs_of_one_fault_are_consistent():
    proxy = synthetic_run("routing_mismatch", seed=3, steps=60, onset=20)
    original = synthetic_run("routing_mismatch", seed=4, steps=60, onset=21, scale=4.0)
    r = consistency(proxy, original)
    assert r.verdict in ("consistent", "partially consistent")
    key = {m.metric: m for m in r.metrics}
    assert key["rollout_train_logp_diff"].agrees and key["rollout_train_logp_diff"].onset_offset == 1


def test_different_faults_are_not_consistent():
    a = synthetic_run("lr_misconfiguration", seed=5, steps=60, onset=20)
    b = synthetic_run("stale_weight_sync", seed=6, steps=60, onset=20)
    assert consistency(a, b).verdict != "consistent"


def test_two_healthy_runs_are_consistent():
    a = synthetic_run("healthy", seed=7, steps=60)
    b = synthetic_run("healthy", seed=8, steps=60, scale=2.0)
    assert consistency(a, b).verdict in ("consistent", "partially consistent")
