"""Shared fixtures of the proxy-builder tests: tiny checkpoints and their routing statistics.

Built once per session (each is a few hundred KB) so the every-architecture x
every-method matrix stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny_models import ARCH_CASES

CALIBRATION_LINES = [
    f"line {i}: the {['red', 'blue', 'green'][i % 3]} fox has {i * 7 % 13} legs and {i % 5} tails; sum={i + 3}"
    for i in range(120)
]


@pytest.fixture(scope="session")
def calibration_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calibration.txt"
    path.write_text("\n".join(CALIBRATION_LINES) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from tiny_models import build_tiny

    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for name, (arch, overrides) in ARCH_CASES.items():
        out[name] = build_tiny(arch, root / name, **overrides)
    return out


@pytest.fixture(scope="session")
def tiny_statistics(tiny_checkpoints, calibration_file):
    """Routing statistics of every tiny checkpoint on the calibration file (3000 tokens)."""
    import torch

    torch.set_num_threads(1)
    from moeproxy.proxy_builder.architectures import architecture_for
    from moeproxy.proxy_builder.build import BuildRequest, calibration_batches, load_model
    from moeproxy.proxy_builder.statistics import collect_statistics
    from tiny_models import load_config

    stats = {}
    for name, path in tiny_checkpoints.items():
        config = load_config(path)
        arch = architecture_for(config)
        model, tok = load_model(path)
        req = BuildRequest(path, path.parent / "unused", keep=4, calibration=str(calibration_file),
                           max_tokens=3000, seq_len=64, batch_size=8)  # fmt: skip
        batches = calibration_batches(req, tok, config["vocab_size"])
        stats[name] = collect_statistics(model, batches, arch, arch.moe_layers(config))
    return stats
