"""Peak *tensor* memory of a block of work: what an accelerator's allocator would have to hold.

Why not the process's peak RSS (what :mod:`moeproxy.reproduction.device` reports on CPU): for
the project's reference models (3 M parameters) the interpreter, torch, transformers and the
allocator's retained pages are most of the resident set, so a proxy with half the parameters shows
0.97 of its original's RSS.  What decides whether a model fits on an accelerator is the bytes of
live tensors, the figure ``torch.cuda.max_memory_allocated`` reports; this package measures that
figure on every device.

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

The package, by job:

* :mod:`.peaks` — peak replay: pure functions from allocation events (or a categorised timeline)
  to the peak, overall and per phase window; no torch;
* :mod:`.meter` — the meter: :class:`TensorMemoryMeter` / :func:`measure_tensor_memory` around a
  block, on the allocator's counters or the torch profiler;
* :mod:`.workloads` — the figures the project reports: :func:`peak_generation_memory`,
  :func:`peak_rl_step_memory`, and :func:`rss_probe`, which runs :mod:`.rss_child` in a fresh
  process for the old process-RSS figure;
* :mod:`.rss_child` and :mod:`.generation_rss_child` — the fresh processes behind the RSS figures:
  RL steps on an engine (:func:`rss_probe`), and loading plus generation
  (:func:`moeproxy.reproduction.fidelity.measure_peak_memory_mb`); both read RSS through
  :mod:`moeproxy.proxy_builder.process_memory`.

Torch is imported inside functions so that importing this package costs nothing.
"""

from moeproxy.reproduction.memory.meter import (
    MIB,
    PHASE_PREFIX,
    TensorMemory,
    TensorMemoryMeter,
    measure_tensor_memory,
    tensor_bytes,
)
from moeproxy.reproduction.memory.peaks import (
    CATEGORIES,
    AllocationEvent,
    InvalidMemoryRequest,
    PeakSummary,
    WindowPeak,
    categorised_peak,
    peak_from_events,
)
from moeproxy.reproduction.memory.workloads import (
    GenerationMemory,
    RLStepMemory,
    peak_generation_memory,
    peak_rl_step_memory,
    rss_probe,
)

__all__ = [
    "CATEGORIES", "MIB", "PHASE_PREFIX", "AllocationEvent", "GenerationMemory", "InvalidMemoryRequest",
    "PeakSummary", "RLStepMemory", "TensorMemory", "TensorMemoryMeter", "WindowPeak", "categorised_peak",
    "measure_tensor_memory", "peak_from_events", "peak_generation_memory", "peak_rl_step_memory", "rss_probe",
    "tensor_bytes",
]
