"""Peak *tensor* memory of a block of work: what an accelerator's allocator would have to hold.

Why not the process's peak RSS (what :mod:`.device` reports on CPU): for the project's reference
models (3 M parameters) the interpreter, torch, transformers and the allocator's retained pages
are most of the resident set, so a proxy with half the parameters shows 0.97 of its original's
RSS.  What decides whether a model fits on an accelerator is the bytes of live tensors, the
figure ``torch.cuda.max_memory_allocated`` reports; this module measures that figure on every
device.

How, per device:

* ``cuda`` / ``npu``: the caching allocator's own counters (``reset_peak_memory_stats`` at the
  start, ``memory_allocated`` and ``max_memory_allocated`` at the end; ``torch_npu`` exposes the
  same functions under ``torch.npu``).  Tensors alive before the block are in the counters
  already.
* ``cpu``: the torch profiler with ``profile_memory=True`` records every allocation and free of
  torch's CPU allocator (address, size, time).  The running sum of allocations minus frees of
  blocks allocated inside the window, maximised over time, is the peak.  The profiler sees only
  allocations made *inside* the window, on the thread that opened it, so:

  - tensors alive when the block starts are not seen; pass their bytes as ``live_at_start``
    (:func:`tensor_bytes` sums the distinct storages of modules/tensors), or put their creation
    (the model load) inside the block, as :func:`peak_generation_memory` and
    :func:`peak_rl_step_memory` do;
  - transformers 5 converts checkpoint tensors on a thread pool, whose allocations the profiler
    does not record; the meter sets ``HF_DEACTIVATE_ASYNC_LOAD=1`` for the window so loading runs
    on the measured thread;
  - a free of a block allocated before the window is counted in ``freed_preexisting_bytes`` and
    not subtracted (the window cannot know whether it was part of ``live_at_start``), so the peak
    is never under-stated.

  Phases (``with meter.phase(name):``) mark parts of a block; each gets its own peak, counting
  what earlier parts allocated and still hold.  That is how a load is kept inside the block (its
  tensors are seen) without its transient buffers deciding the figure.

  With ``categories=True`` the profiler also traces Python calls (``with_stack=True``) and
  torch's memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the analysis behind
  ``export_memory_timeline``) sorts every byte into parameter / optimizer state / gradient /
  activation / temporary / input / autograd detail; the split at the moment of the peak is
  returned.  That analysis is a private torch API: when it fails the measurement still stands,
  with ``by_category`` left ``None`` and the reason in ``notes``.

One CPU caveat measured here (transformers 5.24): a checkpoint loaded in the dtype it is stored
in keeps the whole file buffer alive (parameters are views into it, and per-expert tensors stay
there after being stacked), so such a load holds more than its parameter bytes.  Loading a bf16
checkpoint in fp32, as the reference models are, converts every tensor and holds exactly the
parameter and buffer bytes.

Torch is imported inside functions so that importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from moeproxy.reproduction.errors import ReproductionError

MIB = 2**20
PHASE_PREFIX = "moeproxy.memory/"  # record_function names that mark phases in a CPU profile

#: torch memory-profiler categories, in the order results list them; ``unknown`` holds bytes the
#: analysis could not attribute to any tensor it saw used by an operator
CATEGORIES: tuple[str, ...] = (
    "parameter", "optimizer_state", "gradient", "activation", "temporary", "input", "autograd_detail", "unknown",
)


class InvalidMemoryRequest(ReproductionError, ValueError):
    """A memory measurement that cannot be made as asked (no prompts, a negative baseline, ...)."""


@dataclass(frozen=True)
class TensorMemory:
    """Tensor bytes of one measured block, or of one phase of it.

    ``peak_bytes`` includes ``live_at_start_bytes`` (for a phase: everything alive when the phase
    began, allocated earlier in the block).
    """

    device: str
    method: str  # "allocator" (cuda/npu counters) or "profiler" (CPU allocation events)
    peak_bytes: int
    end_bytes: int  # still alive when the block (phase) ended
    live_at_start_bytes: int
    freed_preexisting_bytes: int = 0  # CPU: frees of blocks allocated before the window (not subtracted)
    by_category: dict[str, int] | None = None  # bytes per category at the peak (CPU with categories)
    phases: dict[str, TensorMemory] = field(default_factory=dict)  # named parts of the block
    notes: tuple[str, ...] = ()

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB

    def to_dict(self) -> dict[str, Any]:
        out = {
            "device": self.device, "method": self.method, "peak_bytes": self.peak_bytes,
            "peak_mib": self.peak_mib, "end_bytes": self.end_bytes,
            "live_at_start_bytes": self.live_at_start_bytes,
            "freed_preexisting_bytes": self.freed_preexisting_bytes,
            "by_category": None if self.by_category is None else dict(self.by_category),
            "notes": list(self.notes),
        }
        if self.phases:
            out["phases"] = {name: p.to_dict() for name, p in self.phases.items()}
        return out


# --- pure parts ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllocationEvent:
    """One allocator event: ``size`` > 0 allocates ``size`` bytes at ``ptr``, < 0 frees the block."""

    time_ns: int
    size: int
    ptr: int


@dataclass(frozen=True)
class WindowPeak:
    """Live bytes at a window's start, its maximum inside the window, and at its end."""

    start_bytes: int
    peak_bytes: int
    end_bytes: int
    by_category: dict[str, int] | None = None  # split at the window's peak


@dataclass(frozen=True)
class PeakSummary:
    peak_bytes: int
    end_bytes: int
    freed_preexisting_bytes: int
    peak_time_ns: int | None
    live_at_end: dict[int, int] = field(default_factory=dict)  # ptr -> bytes of blocks still alive
    windows: dict[str, WindowPeak] = field(default_factory=dict)


class _Windows:
    """Per-window start / peak / end of a running total that changes at increasing times."""

    def __init__(self, windows: Mapping[str, tuple[int, int]] | None):
        self.bounds = dict(windows or {})
        for name, (lo, hi) in self.bounds.items():
            if hi < lo:
                raise InvalidMemoryRequest(f"window {name!r} ends ({hi}) before it starts ({lo})")
        self.open: dict[str, list] = {}  # name -> [start, peak, split]
        self.done: dict[str, WindowPeak] = {}

    def before(self, t: int, current: int, split) -> None:
        """Called before the changes at time ``t`` are applied."""
        for name, (lo, hi) in self.bounds.items():
            if name in self.done:
                continue
            if name not in self.open and t >= lo:
                self.open[name] = [current, current, split()]
            if name in self.open and t > hi:
                self._close(name, current)

    def after(self, t: int, current: int, split) -> None:
        for name, w in self.open.items():
            if current > w[1] and t <= self.bounds[name][1]:
                w[1], w[2] = current, split()

    def finish(self, current: int, split) -> dict[str, WindowPeak]:
        for name in self.bounds:
            if name not in self.done:
                self.open.setdefault(name, [current, current, split()])
                self._close(name, current)
        return {name: self.done[name] for name in self.bounds}

    def _close(self, name: str, current: int) -> None:
        start, peak, split = self.open.pop(name)
        self.done[name] = WindowPeak(start, peak, current, split)


def peak_from_events(
    events: Iterable[AllocationEvent],
    *,
    live_at_start: int = 0,
    windows: Mapping[str, tuple[int, int]] | None = None,
) -> PeakSummary:
    """The running sum of in-window allocations and frees, maximised over time.

    Events are taken in time order (stable for equal times, so pass them in the order they were
    recorded).  A free whose block was not allocated in the window is reported, not subtracted.
    ``windows`` (name -> (start_ns, end_ns), inclusive) also gives each interval's own peak, with
    everything allocated before it still counted.
    """
    if live_at_start < 0:
        raise InvalidMemoryRequest(f"live_at_start={live_at_start}: bytes alive at the start cannot be negative")
    live: dict[int, int] = {}
    current = peak = int(live_at_start)
    peak_time: int | None = None
    freed_pre = 0
    tracker = _Windows(windows)
    no_split = lambda: None
    for ev in sorted(events, key=lambda e: e.time_ns):
        tracker.before(ev.time_ns, current, no_split)
        if ev.size > 0:
            live[ev.ptr] = live.get(ev.ptr, 0) + ev.size
            current += ev.size
            if current > peak:
                peak, peak_time = current, ev.time_ns
        elif ev.size < 0:
            size = live.pop(ev.ptr, None)
            if size is None:
                freed_pre += -ev.size
            else:
                current -= size
        tracker.after(ev.time_ns, current, no_split)
    return PeakSummary(peak, current, freed_pre, peak_time, live, tracker.finish(current, no_split))


def categorised_peak(
    timeline: Iterable[tuple[int, str, int]],
    *,
    live_at_start: int = 0,
    windows: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[int, dict[str, int], dict[str, WindowPeak]]:
    """Peak total and its split, from ``(time_ns, category, delta_bytes)`` changes (and per window).

    ``live_at_start`` bytes are counted as ``parameter`` (what is alive before a block that loads
    nothing is, in this project's uses, the weights).  Changes at one timestamp are applied
    together before the total is compared, so a same-instant create/destroy pair is no peak.
    """
    sums = dict.fromkeys(CATEGORIES, 0)
    sums["parameter"] += int(live_at_start)
    total = sum(sums.values())
    best_total, best = total, dict(sums)
    tracker = _Windows(windows)
    split = lambda: dict(sums)
    pending: int | None = None
    for t, category, delta in sorted(timeline, key=lambda x: x[0]):
        if t != pending:
            if pending is not None:
                tracker.after(pending, total, split)
                if total > best_total:
                    best_total, best = total, dict(sums)
            tracker.before(t, total, split)
            pending = t
        sums[category] += int(delta)
        total += int(delta)
    if pending is not None:
        tracker.after(pending, total, split)
        if total > best_total:
            best_total, best = total, dict(sums)
    return best_total, best, tracker.finish(total, split)


def tensor_bytes(*objects: Any) -> int:
    """Bytes of the distinct storages behind tensors and modules (parameters and buffers).

    Storages shared by several tensors (tied embeddings, views) count once, at their full size.
    """
    import torch

    seen: dict[tuple[str, int], int] = {}

    def add(t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            raise InvalidMemoryRequest(f"tensor_bytes takes tensors and modules, not {type(t).__name__}")
        st = t.untyped_storage()
        seen[(str(t.device), st.data_ptr())] = st.nbytes()

    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                add(t)
        elif isinstance(obj, torch.Tensor):
            add(obj)
        elif isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
            for t in obj:
                add(t)
        else:
            add(obj)
    return sum(seen.values())


# --- the meter -----------------------------------------------------------------------------------------

@contextmanager
def _sync_transformers_loading() -> Iterator[None]:
    key = "HF_DEACTIVATE_ASYNC_LOAD"
    old = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _allocation_events(prof) -> list[AllocationEvent]:
    """CPU allocator events of a finished profile, in recording order."""
    from torch._C._profiler import _EventType

    out: list[AllocationEvent] = []
    stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while stack:
        ev = stack.pop()
        if ev.typed[0] == _EventType.Allocation:
            fields = ev.typed[1]
            if fields.device.type == "cpu":
                out.append(AllocationEvent(int(ev.start_time_ns), int(fields.alloc_size), int(fields.ptr)))
        stack.extend(reversed(ev.children))
    out.sort(key=lambda e: e.time_ns)
    return out


def _category_timeline(prof) -> list[tuple[int, str, int]]:
    """``(time_ns, category, delta)`` from torch's memory profiler, CPU tensors only."""
    import torch
    from torch.profiler._memory_profiler import Action, TensorKey

    mp = prof._memory_profile()
    cpu = torch.device("cpu")
    cats = mp._categories

    def name(key, version) -> str:
        c = cats.get(key, version) if isinstance(key, TensorKey) else None
        return "unknown" if c is None else c.name.lower()

    out: list[tuple[int, str, int]] = []
    created: set = set()
    for t, action, (key, version), nbytes in mp.timeline:  # sorted by time; pre-existing first (t = -1)
        if key.device != cpu:
            continue
        if action == Action.PREEXISTING:
            # Allocated before the window: what was alive then is the caller's live_at_start, and
            # like the allocator-event peak, its frees are not subtracted (below).
            continue
        if action == Action.CREATE:
            created.add(key)
            out.append((t, name(key, version), nbytes))
        elif action == Action.INCREMENT_VERSION:
            out.append((t, name(key, version), -nbytes))
            out.append((t, name(key, version + 1), nbytes))
        elif action == Action.DESTROY and (key in created or not isinstance(key, TensorKey)):
            # untyped blocks (no TensorKey) cannot be matched to their allocation here; a free of a
            # pre-window one is subtracted, and the totals then differ (the meter notes it)
            out.append((t, name(key, version), -nbytes))
    return out


class TensorMemoryMeter:
    """Context manager: peak tensor bytes of the block it wraps; ``result`` after exit.

    ``with meter.phase(name):`` inside the block names a part of it; ``result.phases[name]`` is
    that part's own peak, counting everything the block allocated before it and still held::

        with TensorMemoryMeter("cpu") as meter:
            with meter.phase("load"):
                model = AutoModelForCausalLM.from_pretrained(path)
            with meter.phase("generate"):
                model.generate(...)
        meter.result.phases["generate"].peak_bytes   # weights + KV cache + activations
    """

    def __init__(self, device: str = "cpu", *, live_at_start: int = 0, categories: bool = False):
        from moeproxy.reproduction.device import resolve_device

        if live_at_start < 0:
            raise InvalidMemoryRequest(f"live_at_start={live_at_start}: bytes alive at the start cannot be negative")
        self.device = resolve_device(device)
        self.live_at_start = int(live_at_start)
        self.categories = bool(categories)
        self.result: TensorMemory | None = None
        self._prof = None
        self._env = None
        self._phase_names: list[str] = []
        self._phases: dict[str, TensorMemory] = {}  # cuda/npu: filled as phases end
        self._peak_so_far = 0
        self._start_allocated = 0

    # --- accelerator counters ----------------------------------------------------------------------

    def _backend(self):
        import torch

        return getattr(torch, self.device.kind)

    def _counters(self) -> tuple[int, int]:
        """(allocated now, peak since the last reset), after the queued kernels finished."""
        be, dev = self._backend(), self.device.string
        be.synchronize(dev)
        return int(be.memory_allocated(dev)), int(be.max_memory_allocated(dev))

    # --- the window --------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self._env = _sync_transformers_loading()
        self._env.__enter__()
        if self.device.kind == "cpu":
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(
                activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                with_stack=self.categories,
            )
            self._prof.__enter__()
        else:
            self._backend().synchronize(self.device.string)
            self._backend().reset_peak_memory_stats(self.device.string)
            self._start_allocated, self._peak_so_far = self._counters()
        return self

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name in self._phase_names:
            raise InvalidMemoryRequest(f"phase {name!r} measured twice in one block; give each phase its own name")
        self._phase_names.append(name)
        if self.device.kind == "cpu":
            from torch.profiler import record_function

            with record_function(PHASE_PREFIX + name):
                yield
            return
        be, dev = self._backend(), self.device.string
        start, peak = self._counters()
        self._peak_so_far = max(self._peak_so_far, peak)
        be.reset_peak_memory_stats(dev)
        yield
        end, peak = self._counters()
        self._peak_so_far = max(self._peak_so_far, peak)
        self._phases[name] = TensorMemory(self.device.string, "allocator", peak, end, start)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.device.kind == "cpu":
                self._prof.__exit__(exc_type, exc, tb)
                if exc_type is None:
                    self.result = self._cpu_result()
            elif exc_type is None:
                end, peak = self._counters()
                self.result = TensorMemory(
                    device=self.device.string, method="allocator", peak_bytes=max(self._peak_so_far, peak),
                    end_bytes=end, live_at_start_bytes=self._start_allocated, phases=dict(self._phases),
                )
        finally:
            self._prof = None  # the trace can be large; keep only the figures
            self._env.__exit__(exc_type, exc, tb)

    def _cpu_result(self) -> TensorMemory:
        windows = _phase_windows(self._prof, self._phase_names)
        summary = peak_from_events(_allocation_events(self._prof), live_at_start=self.live_at_start, windows=windows)
        by_category, phase_split, notes = None, {}, []
        if self.categories:
            try:
                total, by_category, cat_windows = categorised_peak(
                    _category_timeline(self._prof), live_at_start=self.live_at_start, windows=windows
                )
                phase_split = {name: w.by_category for name, w in cat_windows.items()}
                if total != summary.peak_bytes:
                    notes.append(
                        f"categorised peak {total} B differs from the allocator-event peak {summary.peak_bytes} B "
                        "(the memory profiler times a free at its operator; categories are the split at its own peak)"
                    )
            except Exception as exc:  # noqa: BLE001 - private torch analysis; the measured peak stands without it
                notes.append(f"no categories: torch memory profiler failed ({type(exc).__name__}: {exc})")
        phases = {
            name: TensorMemory("cpu", "profiler", w.peak_bytes, w.end_bytes, w.start_bytes,
                               by_category=phase_split.get(name))
            for name, w in summary.windows.items()
        }
        return TensorMemory(
            device="cpu", method="profiler", peak_bytes=summary.peak_bytes, end_bytes=summary.end_bytes,
            live_at_start_bytes=self.live_at_start, freed_preexisting_bytes=summary.freed_preexisting_bytes,
            by_category=by_category, phases=phases, notes=tuple(notes),
        )


def _phase_windows(prof, names: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(start_ns, end_ns) of each phase's ``record_function`` range in a finished profile."""
    from torch._C._profiler import _EventType

    wanted = {PHASE_PREFIX + n: n for n in names}
    out: dict[str, tuple[int, int]] = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack and len(out) < len(wanted):
        ev = stack.pop()
        stack.extend(ev.children)
        if ev.typed[0] != _EventType.TorchOp:  # record_function ranges are op events
            continue
        try:
            name = ev.name
        except UnicodeDecodeError:  # seen with with_stack=True: a name torch cannot decode is not ours
            continue
        if name in wanted:
            out[wanted[name]] = (int(ev.start_time_ns), int(ev.end_time_ns))
    missing = [n for n in names if n not in out]
    if missing:
        raise InvalidMemoryRequest(f"phase(s) {missing} left no trace in the profile (a phase must run on the measured thread)")
    return {n: out[n] for n in names}


@contextmanager
def measure_tensor_memory(device: str = "cpu", *, live_at_start: int = 0, categories: bool = False):
    """``with measure_tensor_memory("cpu") as meter: ...`` then ``meter.result`` (a :class:`TensorMemory`)."""
    meter = TensorMemoryMeter(device, live_at_start=live_at_start, categories=categories)
    with meter:
        yield meter


# --- the two figures the project reports ---------------------------------------------------------------

def _check_model_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise InvalidMemoryRequest(f"{path}: not a checkpoint directory (no config.json)")
    return path


class _PhaseFigure:
    """A measured block whose reported figure is the peak of one of its phases (``FIGURE_PHASE``)."""

    FIGURE_PHASE: ClassVar[str]
    SETUP_PHASE: ClassVar[str]  # the phase before it (the model loaded), reported as <name>_peak_bytes
    memory: TensorMemory

    @property
    def peak(self) -> TensorMemory:
        return self.memory.phases[self.FIGURE_PHASE]

    @property
    def peak_bytes(self) -> int:
        return self.peak.peak_bytes

    def _figures(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes, "by_category": self.peak.by_category,
            f"{self.SETUP_PHASE}_peak_bytes": self.memory.phases[self.SETUP_PHASE].peak_bytes,
            "block": self.memory.to_dict(),
        }


@dataclass(frozen=True)
class GenerationMemory(_PhaseFigure):
    """``memory`` is the whole block, with phases ``load`` and ``generate``; the figure is the
    peak of ``generate``: the weights and everything generation adds (KV cache, activations)."""

    FIGURE_PHASE: ClassVar[str] = "generate"
    SETUP_PHASE: ClassVar[str] = "load"
    model_dir: str
    batch_size: int
    prompt_tokens: int
    max_new_tokens: int
    parameter_bytes: int  # parameters + buffers of the loaded model
    memory: TensorMemory

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir, "batch_size": self.batch_size, "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens, "parameter_bytes": self.parameter_bytes,
            **self._figures(),
        }


def peak_generation_memory(
    model_dir: str | Path,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 9,
    device: str = "cpu",
    categories: bool = False,
) -> GenerationMemory:
    """Load ``model_dir`` in fp32 and greedily generate ``max_new_tokens`` for the batch ``prompts``.

    The load is inside the measured block (phase ``load``), so the weights are counted without a
    baseline; the reported peak is that of phase ``generate``, which leaves out the loader's own
    transient buffers (on CPU the bf16 file buffer being converted; an accelerator never holds it).
    """
    import torch
    from moeproxy.reproduction.policy import load_tokenizer

    path = _check_model_dir(model_dir)
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise InvalidMemoryRequest("prompts must be a non-empty sequence of strings")
    if max_new_tokens < 1:
        raise InvalidMemoryRequest(f"max_new_tokens={max_new_tokens}: generate at least one token")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = load_tokenizer(path)
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)
    with measure_tensor_memory(device, categories=categories) as meter:
        dev = meter.device.string
        with meter.phase("load"):
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(dev)
            model.eval()
        with meter.phase("generate"), torch.no_grad():
            model.generate(
                input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev),
                do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )
        parameter_bytes = tensor_bytes(model)
    return GenerationMemory(
        str(path), len(prompts), int(enc["input_ids"].shape[1]), max_new_tokens, parameter_bytes, meter.result,
    )


@dataclass(frozen=True)
class RLStepMemory(_PhaseFigure):
    """``memory`` is the whole block, with phases ``engine`` (three policy copies loaded) and
    ``steps``; the figure is the peak of ``steps``."""

    FIGURE_PHASE: ClassVar[str] = "steps"
    SETUP_PHASE: ClassVar[str] = "engine"
    model_dir: str
    engine: dict[str, Any]  # EngineConfig.to_dict()
    steps: int
    parameter_bytes: int  # parameters + buffers of one policy copy
    copies: int  # policy copies the engine holds (trainer, rollout, reference)
    memory: TensorMemory

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir, "engine": self.engine, "steps": self.steps,
            "parameter_bytes": self.parameter_bytes, "copies": self.copies, **self._figures(),
        }


def peak_rl_step_memory(
    model_dir: str | Path,
    *,
    config=None,
    steps: int = 1,
    seed: int = 0,
    device: str = "cpu",
    categories: bool = False,
) -> RLStepMemory:
    """Build the GRPO engine on ``model_dir`` and run ``steps`` RL steps: peak tensor bytes.

    The block covers the engine's construction (phase ``engine``: trainer, rollout and reference
    copies) and the steps (phase ``steps``: rollout, log-prob passes, mini-batch updates with their
    gradients and the AdamW moments created on the first optimizer step, weight sync).  The
    reported peak is that of ``steps``, with the three copies counted because they were allocated
    earlier in the block.  ``config`` is an :class:`~moeproxy.reproduction.config.EngineConfig`
    (default: the engine's defaults).
    """
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.engine import GRPOEngine

    path = _check_model_dir(model_dir)
    if steps < 1:
        raise InvalidMemoryRequest(f"steps={steps}: measure at least one RL step")
    config = config or EngineConfig()
    if not isinstance(config, EngineConfig):
        raise InvalidMemoryRequest(f"config must be an EngineConfig, not {type(config).__name__}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with measure_tensor_memory(device, categories=categories) as meter:
        with meter.phase("engine"):
            engine = GRPOEngine(path, config=config, seed=seed, device=device)
        with meter.phase("steps"):
            for k in range(steps):
                engine.step(k)
        parameter_bytes = tensor_bytes(engine.trainer_policy.model)
        copies = 2 + (engine.trainer.ref is not None)
    return RLStepMemory(str(path), config.to_dict(), steps, parameter_bytes, copies, meter.result)


# --- the process-RSS figure --------------------------------------------------------------------------

_RSS_PROBE = """
import json, sys, torch
torch.set_num_threads(1)
from moeproxy.reproduction.config import EngineConfig
from moeproxy.proxy_builder.process_memory import current_rss_mb
from moeproxy.reproduction.engine import GRPOEngine
from transformers import AutoConfig, AutoModelForCausalLM
with torch.device("meta"):  # import every module the model needs, allocate nothing
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))
base = current_rss_mb()
e = GRPOEngine(sys.argv[1], config=EngineConfig.from_dict(json.loads(sys.argv[2])), seed=0)
peaks = [e.step(k)["perf/peak_memory_mb"] for k in range(int(sys.argv[3]))]
print(json.dumps({"peak_rss_mb": max(peaks), "rss_before_load_mb": base, "run_mb": max(peaks) - base}))
"""


def rss_probe(model_dir: str | Path, config: Any, steps: int = 1) -> dict[str, Any]:
    """Peak RSS of engine construction + ``steps`` RL steps in a fresh process, minus its RSS before
    loading (in one long process freed pages stay mapped, which hides differences). The process
    figure the engine reports as ``perf/peak_memory_mb``, kept for comparison with the tensor peak."""
    import json
    import subprocess
    import sys

    if steps < 1:
        raise InvalidMemoryRequest("steps must be >= 1")
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(model_dir), json.dumps(config.to_dict()), str(steps)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}
