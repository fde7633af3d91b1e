"""This process's resident memory, read from the kernel: the one reader of RSS for every stage.

The builder reports its own peak (``proxy_report.json``, ``benchmarks/build.py``), the reproduction
engine its per-step peak on CPU (``perf/peak_memory_mb``), and the fidelity harness the peak a fresh
process adds to load a checkpoint. It lives in the first stage so that all of them can import it;
it needs nothing but the standard library.

Linux: ``VmRSS`` and ``VmHWM`` of ``/proc/self/status``. ``VmHWM`` is the high-water mark of this
program's own memory; getrusage's ``ru_maxrss`` also keeps a forked parent's mark across exec, so it
is only the fallback where there is no procfs.
"""

from __future__ import annotations

import resource
import sys

_STATUS = "/proc/self/status"


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status``, or None without procfs."""
    try:
        with open(_STATUS) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_mb() -> float:
    """Resident memory now, in MiB (NaN without procfs)."""
    kb = _status_kb("VmRSS")
    return float("nan") if kb is None else kb / 1024


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB, since it started or since :func:`reset_peak_rss`.

    Without procfs, ``ru_maxrss`` (the whole life of the process, still a peak): kilobytes on Linux,
    bytes on macOS.
    """
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def reset_peak_rss() -> bool:
    """Rewind the high-water mark to the current RSS, so the next peak is of what follows.

    Needs a writable ``/proc/self/clear_refs`` (Linux >= 4.0); returns whether it was reset.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5 = reset the peak RSS to the current RSS (proc(5))
    except OSError:
        return False
    return True
