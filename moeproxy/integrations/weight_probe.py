"""What the optimizer did to the policy's weights, from a fixed sample of them (``MoeproxyCallback``).

No trainer logs whether an optimizer step changed the weights, or whether something else did:
an update that a wrapper drops after the gradient norm was measured (a skipped step, an optimizer
built over other parameters than the ones that train) leaves the gradient norm normal and the
policy where it was, and router weights damaged between steps (a down-cast, a merge, a reload)
leave no mark in the loss for many steps (SPEC section 3: actor_update_omission,
router_corruption). A few fixed elements of every trainable weight, read before and after each
optimizer step, tell both apart cheaply: ``PER_TENSOR`` elements a tensor (a few thousand numbers
for a small model, tens of thousands for a 30B MoE).

What it measures, per optimizer step (relative L2 changes of the sampled elements):

- the update: after the step against before it (0 exactly when the step changed nothing);
- the change outside the optimizer: before this step against after the previous one (0 exactly in
  a healthy run: nothing but the optimizer writes the weights), for all sampled weights and for
  the MoE routers alone (``ROUTER_WEIGHT``).

:meth:`WeightProbe.flush` hands what was measured since the last call to the logger, under
:data:`NAMES`: the mean and the smallest update (a step dropped now and then shows in the
smallest), the largest outside change (one event must not be averaged away). Weights that turned
NaN make every figure NaN from then on: nothing it says about them would mean anything.

The probe brackets ``optimizer.step()``. A trainer that updates the weights elsewhere (DeepSpeed
steps its engine inside ``backward``, the layer-wise optimizers in backward hooks) shows a first
step whose update is 0 while the weights moved before it: :meth:`WeightProbe.after_step` raises
:class:`ProbeOutOfStep` there, and the callback turns the probe off before it sends anything.

Only trainable parameters are sampled (a frozen base under PEFT is merged and unmerged for
generation in some setups, which moves it by round-off and means nothing). A parameter whose local
tensor is empty is left out; with nothing left to sample the probe measures nothing. Needs torch
(the ``[ml]`` extra, as ``transformers`` does).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

#: Elements sampled from each trainable tensor (all of a tensor that has fewer).
PER_TENSOR = 64
#: An MoE router's weight under the names transformers' MoE models give it: Qwen2/3-MoE, OLMoE,
#: DeepSeek-V2/V3 ``mlp.gate.weight``, Mixtral ``block_sparse_moe.gate.weight``, GPT-OSS
#: ``mlp.router.weight``. A dense MLP's ``gate_proj`` does not match.
ROUTER_WEIGHT = re.compile(r"(^|\.)(gate|router)\.weight$")
#: The names the callback logs (aliases of the canonical metrics of the same name without the
#: prefix, signatures/vocabulary.py).
NAMES = {
    "update_ratio": "moeproxy/update_ratio",
    "update_ratio_min": "moeproxy/update_ratio_min",
    "outside_change": "moeproxy/outside_change",
    "router_outside_change": "moeproxy/router_outside_change",
}


class ProbeError(RuntimeError):
    """The probe cannot measure this model or this trainer (the callback turns it off)."""


class ProbeOutOfStep(ProbeError):
    """The weights moved outside ``optimizer.step()`` on the first step and not inside it: the
    trainer applies its update elsewhere, so the probe's window does not bracket it."""


@dataclass
class _Pending:
    updates: list[float] = field(default_factory=list)
    outside: float = 0.0
    router_outside: float | None = None


def _worst(a: float | None, b: float) -> float:
    """The larger change, NaN as soon as either is (``max`` keeps whichever NaN comes first)."""
    if a is None:
        return b
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


class WeightProbe:
    """Samples fixed elements of ``model``'s trainable weights; :meth:`before_step` and
    :meth:`after_step` around each optimizer step, :meth:`flush` at each log."""

    def __init__(self, model: Any, *, per_tensor: int = PER_TENSOR, seed: int = 0):
        import torch

        if per_tensor < 1:
            raise ValueError(f"per_tensor must be at least 1, not {per_tensor}")
        gen = torch.Generator().manual_seed(seed)
        # (parameter, flat indices, the largest of them, is a router): the largest kept as a Python
        # int, so the size check of every sample reads no value back from an accelerator.
        self._picks: list[tuple[Any, Any, int, bool]] = []
        for name, p in model.named_parameters():
            n = _local(p).numel()
            if not p.requires_grad or n == 0:
                continue
            # Drawn with replacement: a permutation of a fused expert tensor (4e8 elements in a
            # 30B MoE) would cost gigabytes; a repeated index only reads one element twice.
            idx = torch.arange(n) if n <= per_tensor else torch.randint(n, (per_tensor,), generator=gen)
            self._picks.append((p, idx, int(idx.max()), bool(ROUTER_WEIGHT.search(name))))
        self.has_routers = any(r for *_, r in self._picks)
        self._last: tuple[Any, Any] | None = None  # after the last optimizer step: (all, routers)
        self._before: tuple[Any, Any] | None = None
        self._outside_now = 0.0  # the change outside the optimizer before the step under way
        self._steps = 0
        self._pending = _Pending()

    @property
    def empty(self) -> bool:
        return not self._picks

    def _sample(self) -> tuple[Any, Any]:
        import torch

        with torch.no_grad():
            parts = []
            for k, (p, idx, largest, router) in enumerate(self._picks):
                local = _local(p)
                if idx.device != local.device:  # kept where the weight lives: one move, not one a step
                    idx = idx.to(local.device)
                    self._picks[k] = (p, idx, largest, router)
                if largest >= local.numel():  # its local size changed (a re-sharded view)
                    raise ProbeError(f"a parameter's local size changed to {local.numel()} elements")
                # torch.take reads a non-contiguous tensor without copying it whole; float32 on the
                # device is exact for bf16, fp16 and fp32 weights (MPS has no float64).
                wide = torch.float64 if local.dtype == torch.float64 else torch.float32
                parts.append(torch.take(local.detach(), idx).to(wide))
            host = _to_host(parts)
        routers = [x for x, (*_, r) in zip(host, self._picks, strict=True) if r]
        return torch.cat(host), (torch.cat(routers) if routers else None)

    def start(self) -> None:
        """The weights as training starts: the first step's outside change is against these."""
        if not self.empty:
            self._last = self._sample()

    def before_step(self) -> None:
        if self.empty:
            return
        self._before = self._sample()
        self._outside_now = 0.0
        if self._last is not None:
            (all_now, routers_now), (all_then, routers_then) = self._before, self._last
            self._outside_now = _relative(all_now, all_then)
            self._pending.outside = _worst(self._pending.outside, self._outside_now)
            if routers_now is not None:
                self._pending.router_outside = _worst(self._pending.router_outside,
                                                      _relative(routers_now, routers_then))

    def after_step(self) -> None:
        if self.empty or self._before is None:
            return
        after = self._sample()
        update = _relative(after[0], self._before[0])
        self._steps += 1
        if self._steps == 1 and update == 0.0 and self._outside_now > 0.0:
            raise ProbeOutOfStep("the weights moved before optimizer.step() and not in it: this trainer "
                                 "updates them elsewhere (DeepSpeed, a layer-wise optimizer)")
        self._pending.updates.append(update)
        self._last, self._before = after, None

    def flush(self) -> dict[str, float]:
        """What was measured since the last flush, under :data:`NAMES`; {} when no step was."""
        p, self._pending = self._pending, _Pending()
        if not p.updates:
            return {}
        finite = [u for u in p.updates if not math.isnan(u)]
        out = {NAMES["update_ratio"]: math.fsum(finite) / len(finite) if finite else math.nan,
               NAMES["update_ratio_min"]: min(finite) if finite else math.nan,
               NAMES["outside_change"]: p.outside}
        if p.router_outside is not None:
            out[NAMES["router_outside_change"]] = p.router_outside
        return out


def _to_host(parts: list[Any]) -> list[Any]:
    """``parts`` on the CPU in float64, one copy per device (a few thousand numbers in all, where a
    copy per tensor would be a thousand small transfers a step on an accelerator)."""
    import torch

    by_device: dict[Any, list[int]] = {}
    for i, x in enumerate(parts):
        by_device.setdefault(x.device, []).append(i)
    host: list[Any] = [None] * len(parts)
    for ids in by_device.values():
        flat = torch.cat([parts[i] for i in ids]).cpu().double()  # cat promotes float32 beside float64
        for i, chunk in zip(ids, flat.split([parts[i].numel() for i in ids]), strict=True):
            host[i] = chunk
    return host


def _local(p: Any) -> Any:
    """The part of a parameter this process holds (a DTensor's local shard; the tensor itself)."""
    to_local = getattr(p, "to_local", None)
    return to_local() if callable(to_local) else p


def _relative(now: Any, then: Any) -> float:
    """‖now − then‖ / ‖then‖ (the change itself where ``then`` is all 0: a LoRA B at its start);
    NaN where either holds a NaN."""
    diff = float((now - then).norm())
    base = float(then.norm())
    return diff / base if base > 0 else diff
