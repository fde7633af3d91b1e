"""The one reader of this process's RSS (issue 15, item 8): the figures it reads, its fallback
without procfs, and the stages that report a peak reading it."""

from __future__ import annotations

import resource
import sys

import pytest
from moeproxy.proxy_builder import process_memory
from moeproxy.proxy_builder.process_memory import current_rss_mb, peak_rss_mb, reset_peak_rss

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _fake_status(tmp_path, monkeypatch, **fields_kb):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\n" + "".join(f"{k}:\t{v} kB\n" for k, v in fields_kb.items()))
    monkeypatch.setattr(process_memory, "_STATUS", str(status))


def test_figures_are_the_status_fields_in_mib(tmp_path, monkeypatch):
    _fake_status(tmp_path, monkeypatch, VmHWM=3 * 1024 + 512, VmRSS=2048)
    assert peak_rss_mb() == 3.5
    assert current_rss_mb() == 2.0


def test_without_procfs_the_peak_is_ru_maxrss_and_the_current_rss_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(process_memory, "_STATUS", str(tmp_path / "missing"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert peak_rss_mb() == pytest.approx(rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024, rel=0.01)
    assert current_rss_mb() != current_rss_mb()  # NaN


@linux_only
def test_an_allocation_raises_the_peak_which_stays_until_a_reset():
    base = current_rss_mb()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(range(0, len(block), 4096))  # touch every page so it is resident
    assert current_rss_mb() >= base + 60
    assert peak_rss_mb() >= current_rss_mb()
    high = peak_rss_mb()
    del block  # a block this large is its own mapping: freeing it hands the pages back
    assert current_rss_mb() < high - 32
    assert peak_rss_mb() >= high - 1  # a high-water mark (the kernel records it lazily, to a page or so)
    if reset_peak_rss():  # where the kernel lets a process rewind it
        assert peak_rss_mb() < high - 32


def test_the_stages_read_the_same_figure(tmp_path, monkeypatch):
    """The builder's report and the engine's CPU peak both come from this reader."""
    from moeproxy.proxy_builder import report

    assert report.peak_rss_mb is peak_rss_mb
    pytest.importorskip("torch")
    from moeproxy.reproduction.device import peak_memory_mb, resolve_device

    _fake_status(tmp_path, monkeypatch, VmHWM=5120, VmRSS=1024)
    assert peak_memory_mb(resolve_device("cpu")) == 5.0


def _code_strings(tree):
    """The string constants of a module that are not docstrings (a docstring may name a /proc path)."""
    import ast

    docs = {id(body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and (body := node.body) and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_other_module_of_the_package_reads_procfs():
    """Every RSS figure goes through this module: no other installed module names a /proc path,
    not even inside a script it runs (as the fidelity probe once did)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    reader = Path(process_memory.__file__).resolve()
    folders = ("moeproxy", "proxy_builder", "reproduction", "signatures", "service", "migrations")
    readers = [
        f"{path.relative_to(root)}:{const.lineno}"
        for path in (p for folder in folders for p in (root / folder).rglob("*.py"))
        if path.resolve() != reader
        for const in _code_strings(ast.parse(path.read_text(), str(path)))
        if "/proc" in const.value
    ]
    assert readers == []
