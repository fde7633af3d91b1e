"""The meter: peak tensor bytes of a block of work, from the allocator's counters (cuda/npu) or
the torch profiler's CPU allocation events, with named phases and, on CPU, the split by category.

See the package docstring (:mod:`moeproxy.reproduction.memory`) for how each device is measured.
Torch is imported inside functions so that importing this module costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self

from moeproxy.reproduction.memory.peaks import (
    AllocationEvent,
    InvalidMemoryRequest,
    categorised_peak,
    peak_from_events,
)

MIB = 2**20
PHASE_PREFIX = "moeproxy.memory/"  # record_function names that mark phases in a CPU profile


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
