"""Device strings, dtype support and peak-memory measurement, in one place.

Everything that touches an accelerator goes through here so that the engine runs unchanged on
``cpu``, ``cuda`` and Ascend ``npu`` (``torch_npu`` is imported lazily, only when ``npu`` is asked
for).  Peak memory is measured the way each device can: on CUDA/NPU the allocator's
``max_memory_allocated``; on CPU the process's peak resident set size (``VmHWM`` in
``/proc/self/status``), which ``reset_peak`` rewinds through ``/proc/self/clear_refs`` where the
kernel allows it (Linux >= 4.0), so a per-step peak can be taken.  The RSS figures are read by
:mod:`moeproxy.proxy_builder.process_memory`, the one reader every stage shares.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from moeproxy.proxy_builder.process_memory import peak_rss_mb, reset_peak_rss
from moeproxy.reproduction.errors import DeviceUnavailable

if TYPE_CHECKING:  # pragma: no cover
    import torch

DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda", "npu")

DTYPES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    kind: str  # cpu | cuda | npu
    string: str  # what torch.device() takes, e.g. "cuda:0"
    name: str  # human-readable, for manifests


def _import_npu() -> None:
    try:
        import torch_npu  # noqa: F401  (registers the "npu" device with torch)
    except ImportError as exc:  # pragma: no cover - needs an Ascend host
        raise DeviceUnavailable("device 'npu' needs torch_npu (pip install 'moeproxy[npu]')") from exc


def resolve_device(spec: str = "cpu") -> DeviceInfo:
    """``cpu``, ``cuda``, ``cuda:N``, ``npu``, ``npu:N`` or ``auto`` -> a usable device, or DeviceUnavailable."""
    import torch

    spec = (spec or "cpu").strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            spec = "cuda"
        else:
            try:
                _import_npu()
                spec = "npu" if torch.npu.is_available() else "cpu"  # type: ignore[attr-defined]
            except DeviceUnavailable:
                spec = "cpu"
    kind, _, index = spec.partition(":")
    if kind not in DEVICE_KINDS:
        raise DeviceUnavailable(f"unknown device {spec!r}; use one of cpu, cuda[:N], npu[:N], auto")
    if index and not index.isdigit():
        raise DeviceUnavailable(f"bad device index in {spec!r}")
    if kind == "cpu":
        return DeviceInfo("cpu", "cpu", "cpu")
    if kind == "npu":
        _import_npu()
    backend = getattr(torch, kind)
    if not backend.is_available():
        raise DeviceUnavailable(f"device {kind!r} requested but torch reports it unavailable")
    idx = int(index or 0)
    if idx >= backend.device_count():
        raise DeviceUnavailable(f"{spec!r}: only {backend.device_count()} {kind} device(s) visible")
    name = backend.get_device_name(idx) if hasattr(backend, "get_device_name") else kind
    return DeviceInfo(kind, f"{kind}:{idx}", str(name))


def torch_dtype(name: str) -> torch.dtype:
    """``float32``/``fp32``/``bf16``/… -> torch dtype (ValueError for anything else)."""
    import torch

    canonical = DTYPES.get(str(name).lower().removeprefix("torch."))
    if canonical is None:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(set(DTYPES))}")
    return getattr(torch, canonical)


@cache
def dtype_supported(device: str, dtype: str) -> bool:
    """Whether a matmul and a log-softmax run in ``dtype`` on ``device`` (checked once, cached)."""
    import torch

    try:
        dt = torch_dtype(dtype)
        x = torch.ones(4, 4, dtype=dt, device=device)
        torch.log_softmax(x @ x, dim=-1).sum().item()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def require_dtype(device: str, dtype: str) -> None:
    if not dtype_supported(device, dtype):
        raise DeviceUnavailable(f"dtype {dtype} is not supported on {device}")


# --- peak memory ---------------------------------------------------------------------------------------

def reset_peak(device: DeviceInfo) -> None:
    """Start a new peak-memory window (best effort on CPU: needs a writable clear_refs)."""
    import torch

    if device.kind == "cpu":
        reset_peak_rss()
    else:
        getattr(torch, device.kind).reset_peak_memory_stats(device.string)


def peak_memory_mb(device: DeviceInfo) -> float:
    """Peak memory since the last ``reset_peak``: RSS high-water mark on CPU, allocator peak elsewhere."""
    import torch

    if device.kind == "cpu":
        return peak_rss_mb()
    return getattr(torch, device.kind).max_memory_allocated(device.string) / 2**20


def synchronize(device: DeviceInfo) -> None:
    """Wait for queued kernels, so wall-clock timings mean what they say."""
    import torch

    if device.kind != "cpu":
        getattr(torch, device.kind).synchronize(device.string)


def set_cpu_threads(n: int | None) -> int:
    """Set torch's intra-op threads (``None`` keeps the current value, or OMP_NUM_THREADS)."""
    import torch

    if n is None:
        env = os.environ.get("OMP_NUM_THREADS")
        n = int(env) if env and env.isdigit() else torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    return int(torch.get_num_threads())
