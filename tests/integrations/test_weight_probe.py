"""The weight probe of MoeproxyCallback on a real torch module and a real AdamW: what an optimizer
step moved, what moved between steps, the MoE routers apart, and what a log reports."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moeproxy.integrations.weight_probe import NAMES, ROUTER_WEIGHT, WeightProbe


class Block(torch.nn.Module):
    """A layer shaped like transformers' MoE layers: ``mlp.gate`` is the router, ``mlp.gate_proj``
    a dense MLP's projection (not a router)."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Module()
        self.mlp.gate = torch.nn.Linear(8, 4, bias=False)
        self.mlp.gate_proj = torch.nn.Linear(8, 8)
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return (self.mlp.gate(x).sum() + self.mlp.gate_proj(x).sum() + self.frozen(x).sum()) ** 2


def _step(model, opt, probe, *, drop: bool = False) -> None:
    model(torch.randn(16, 8)).backward()
    probe.before_step()
    if drop:  # a wrapper that drops the update after the norm was measured
        opt.zero_grad(set_to_none=True)
    opt.step()
    probe.after_step()
    opt.zero_grad()


@pytest.fixture
def setup():
    torch.manual_seed(0)
    model = Block()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    probe = WeightProbe(model)
    probe.start()
    return model, opt, probe


def test_the_router_pattern_names_routers_only():
    for name in ("model.layers.0.mlp.gate.weight", "model.layers.3.block_sparse_moe.gate.weight",
                 "model.layers.1.mlp.router.weight"):
        assert ROUTER_WEIGHT.search(name), name
    for name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate.bias", "lm_head.weight"):
        assert not ROUTER_WEIGHT.search(name), name


def test_a_step_moves_the_weights_a_dropped_one_does_not(setup):
    model, opt, probe = setup
    assert probe.has_routers
    _step(model, opt, probe)
    first = probe.flush()
    assert first[NAMES["update_ratio"]] > 0 and first[NAMES["update_ratio_min"]] == first[NAMES["update_ratio"]]
    assert first[NAMES["outside_change"]] == 0.0 and first[NAMES["router_outside_change"]] == 0.0
    _step(model, opt, probe)
    _step(model, opt, probe, drop=True)
    _step(model, opt, probe)
    three = probe.flush()  # one log over three steps: the mean, and the dropped one as the smallest
    assert three[NAMES["update_ratio_min"]] == 0.0 < three[NAMES["update_ratio"]]
    assert probe.flush() == {}  # nothing measured since


def test_weights_written_between_steps_show_as_outside_changes_routers_apart(setup):
    model, opt, probe = setup
    _step(model, opt, probe)
    probe.flush()
    with torch.no_grad():
        model.mlp.gate_proj.weight.add_(0.01)  # not a router
    _step(model, opt, probe)
    dense = probe.flush()
    assert dense[NAMES["outside_change"]] > 1e-3 and dense[NAMES["router_outside_change"]] == 0.0
    with torch.no_grad():
        model.mlp.gate.weight.copy_(model.mlp.gate.weight.to(torch.bfloat16).float())  # a bf16 round trip
    _step(model, opt, probe)
    _step(model, opt, probe)
    routed = probe.flush()
    assert 1e-6 < routed[NAMES["router_outside_change"]] < 1e-2  # the largest of the log's two steps


def test_frozen_weights_are_not_read_and_a_model_without_trainable_weights_reports_nothing(setup):
    model, opt, probe = setup
    assert all(p.requires_grad for p, *_ in probe._picks)
    with torch.no_grad():
        model.frozen.weight.add_(1.0)  # a frozen base moved by a merge and back: not the probe's business
    _step(model, opt, probe)
    assert probe.flush()[NAMES["outside_change"]] == 0.0
    model.requires_grad_(False)
    empty = WeightProbe(model)
    empty.start()
    empty.before_step()
    empty.after_step()
    assert empty.empty and empty.flush() == {}


class Client:
    """What MoeproxyCallback hands its logs to, kept in memory."""

    def __init__(self, *a, **k):
        self.sent, self.closed = [], None

    def log(self, step, values):
        self.sent.append((step, values))

    def close(self, status):
        self.closed = status


def _state(step: int):
    class State:
        is_world_process_zero = True
        global_step = step

    return State


def _one_step_through_the_callback(step: int):
    """A MoeproxyCallback started on a fresh layer, through one real AdamW step at ``step``."""
    from moeproxy.integrations.transformers import MoeproxyCallback

    State = _state(step)
    torch.manual_seed(0)
    model = Block()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    cb = MoeproxyCallback("http://127.0.0.1:1", "t", "r", client_factory=Client)
    cb.on_train_begin(None, State, None, model=model)
    model(torch.randn(4, 8)).backward()
    cb.on_pre_optimizer_step(None, State, None)
    opt.step()
    cb.on_optimizer_step(None, State, None)
    return cb, model, State


def test_the_callback_sends_the_probe_and_survives_a_probe_that_fails():
    from moeproxy.integrations.transformers import MoeproxyCallback

    cb, model, State = _one_step_through_the_callback(1)
    cb.on_log(None, State, None, logs={"loss": 0.5})
    ((step, values),) = cb.client.sent
    assert step == 1 and values["loss"] == 0.5 and values[NAMES["update_ratio"]] > 0

    cb.probe._picks[0] = (None, None, 0, False)  # a parameter the probe cannot read any more
    cb.on_pre_optimizer_step(None, State, None)  # warns and turns the probe off; training goes on
    assert cb.probe is None
    cb.on_log(None, State, None, logs={"loss": 0.4})
    assert cb.client.sent[-1][1] == {"loss": 0.4}
    off = MoeproxyCallback("http://127.0.0.1:1", "t", "r", client_factory=Client, probe_weights=False)
    off.on_train_begin(None, State, None, model=model)
    assert off.probe is None

    class DeepSpeedArgs:
        deepspeed = "ds_config.json"

        def to_dict(self):
            return {}

    ds = MoeproxyCallback("http://127.0.0.1:1", "t", "r", client_factory=Client)
    ds.on_train_begin(DeepSpeedArgs(), State, None, model=model)
    assert ds.probe is None  # DeepSpeed updates inside backward: the probe would see no update

    class LayerWiseDummyOptimizer:  # transformers' stand-in for optimizers that step in backward hooks
        pass

    layer_wise = MoeproxyCallback("http://127.0.0.1:1", "t", "r", client_factory=Client)
    layer_wise.on_train_begin(None, State, None, model=model, optimizer=LayerWiseDummyOptimizer())
    assert layer_wise.probe is None


def test_steps_after_the_last_log_are_sent_when_training_ends():
    cb, _model, State = _one_step_through_the_callback(7)
    client = cb.client
    cb.on_train_end(None, State, None)
    ((step, values),) = client.sent
    assert step == 7 and values[NAMES["update_ratio"]] > 0 and client.closed == "finished"


def test_the_sample_is_the_sampled_elements_in_order(setup):
    """The one-copy-per-device gather against reading each tensor's elements one by one."""
    model, _opt, probe = setup
    everything, routers = probe._sample()
    naive = [p.detach().reshape(-1)[idx].double() for p, idx, *_ in probe._picks]
    assert torch.equal(everything, torch.cat(naive))
    assert torch.equal(routers, torch.cat([x for x, r in zip(naive, [r for *_, r in probe._picks], strict=True) if r]))
    assert everything.numel() == sum(min(64, p.numel()) for p in model.parameters() if p.requires_grad)


def test_a_trainer_that_updates_outside_the_optimizer_step_turns_the_probe_off(setup):
    """DeepSpeed steps its engine inside backward and the wrapped optimizer.step() does nothing: on
    the first step the weights moved before the window and not in it, so the probe stops there,
    before anything is sent; a warm-up's LR-0 first step (nothing moved at all) does not stop it."""
    from moeproxy.integrations.weight_probe import ProbeOutOfStep

    model, opt, probe = setup
    model(torch.randn(16, 8)).backward()
    opt.step()  # the update, inside "backward"
    probe.before_step()
    with pytest.raises(ProbeOutOfStep):
        probe.after_step()  # the wrapper's step() is a no-op

    torch.manual_seed(0)
    model = Block()
    still = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    probe = WeightProbe(model)
    probe.start()
    _step(model, still, probe)
    assert probe.flush()[NAMES["update_ratio"]] == 0.0


def test_weights_that_turn_nan_make_every_figure_nan(setup):
    import math

    model, opt, probe = setup
    _step(model, opt, probe)
    probe.flush()
    with torch.no_grad():
        model.mlp.gate.weight[0, 0] = float("nan")
    _step(model, opt, probe)
    _step(model, opt, probe)
    out = probe.flush()
    assert math.isnan(out[NAMES["outside_change"]]) and math.isnan(out[NAMES["router_outside_change"]])
    assert math.isnan(out[NAMES["update_ratio"]]) and math.isnan(out[NAMES["update_ratio_min"]])


def test_a_sample_size_under_one_is_refused():
    with pytest.raises(ValueError, match="per_tensor"):
        WeightProbe(Block(), per_tensor=0)
