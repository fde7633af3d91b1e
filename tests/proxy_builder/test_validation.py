"""Impossible requests fail before any statistics are collected, with a clear message, and write nothing."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moeproxy.proxy_builder import build as build_module
from moeproxy.proxy_builder.build import BuildRequest, build_proxy
from moeproxy.proxy_builder.errors import (
    CalibrationError,
    CheckpointError,
    InvalidPruneRequest,
    ProxyBuildError,
    UnsupportedArchitecture,
)
from moeproxy.proxy_builder.plan_errors import UnsupportedArchitecture as PlannerUnsupported
from typer.testing import CliRunner

from moeproxy.cli import app

torch.set_num_threads(1)
runner = CliRunner()


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the model (the first expensive step) fails the test: validation must stop earlier."""

    def boom(*a, **k):
        raise AssertionError("model loaded although the request is invalid")

    monkeypatch.setattr(build_module, "load_model", boom)


def _copy(src, tmp_path, name="model"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _assert_nothing_written(out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


CASES = {
    "keep more than E": ("qwen3_moe", {"keep": 9}, InvalidPruneRequest, "only 8"),
    "keep below top_k": ("mixtral", {"keep": 1}, InvalidPruneRequest, "keep at least 2"),
    "ratio below top_k": ("olmoe", {"keep_ratio": 0.1}, InvalidPruneRequest, "keep at least 2"),
    "deepseek keep not divisible by n_group": ("deepseek_v3", {"keep": 3}, InvalidPruneRequest, "Valid --keep values: 4, 6, 8"),
    "deepseek one expert per group": ("deepseek_v3", {"keep": 2}, InvalidPruneRequest, "2 groups would keep 1 < 2"),
    "unknown method": ("qwen2_moe", {"keep": 4, "method": "magic"}, InvalidPruneRequest, "unknown method 'magic'"),
    "no calibration": ("qwen3_moe", {"keep": 4}, CalibrationError, "needs calibration data"),
    "missing calibration file": ("qwen3_moe", {"keep": 4, "calibration": "/nonexistent/c.txt"}, CalibrationError, "does not exist"),
    "unknown calibration source": ("qwen3_moe", {"keep": 4, "calibration": "nosuch:x"}, CalibrationError, "unknown calibration source"),
    "bad view weights": ("qwen3_moe", {"keep": 4, "view_weights": "1,2"}, InvalidPruneRequest, "takes 3 numbers"),
    "zero view weights for method": ("qwen3_moe", {"keep": 4, "method": "router", "view_weights": "0,1,1"}, InvalidPruneRequest, "no positive weight"),
    "auto with one view": ("qwen3_moe", {"keep": 4, "method": "coact", "view_weights": "auto"}, InvalidPruneRequest, "at least 2 views"),
    "weights for a baseline": ("qwen3_moe", {"keep": 4, "method": "frequency", "view_weights": "1,1,1"}, InvalidPruneRequest, "uses no views"),
    "unknown device": ("qwen3_moe", {"keep": 4, "method": "first_k", "device": "tpu"}, InvalidPruneRequest, "unknown device"),
    "unknown representative": ("qwen3_moe", {"keep": 4, "representative": "oldest"}, InvalidPruneRequest, "representative"),
    "keep and ratio": ("qwen3_moe", {"keep": 4, "keep_ratio": 0.5}, InvalidPruneRequest, "exactly one"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_impossible_requests(case, tiny_checkpoints, calibration_file, tmp_path, no_model_load):
    arch, kwargs, error, message = CASES[case]
    kwargs = dict(kwargs)
    kwargs.setdefault("calibration", None if case in ("no calibration",) else str(calibration_file))
    out = tmp_path / "proxy"
    with pytest.raises(error, match=message):
        build_proxy(BuildRequest(tiny_checkpoints[arch], out, **kwargs))
    _assert_nothing_written(out)


def test_deepseek_top_k_above_group_capacity(tmp_path, no_model_load):
    from tiny_models import build_tiny

    src = build_tiny("deepseek_v3", tmp_path, num_experts_per_tok=3)
    with pytest.raises(InvalidPruneRequest, match=r"top_k=3 > topk_group=1 x 2 kept per group") as exc:
        build_proxy(BuildRequest(src, tmp_path / "p", keep=4, method="first_k"))
    assert "Valid --keep values: 6, 8" in str(exc.value) and "--group-policy flatten" in str(exc.value)
    _assert_nothing_written(tmp_path / "p")


def test_unsupported_architecture(tiny_checkpoints, tmp_path, no_model_load):
    src = _copy(tiny_checkpoints["qwen3_moe"], tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["model_type"] = "llama"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitecture, match="'llama' is not supported; supported: deepseek_v3") as exc:
        build_proxy(BuildRequest(src, tmp_path / "p", keep=4, method="first_k"))
    assert isinstance(exc.value, PlannerUnsupported)  # one name for both stages' callers
    _assert_nothing_written(tmp_path / "p")


@pytest.mark.parametrize("damage", ["no dir", "no config", "no weights", "bin only", "missing shard", "config disagrees"])
def test_missing_or_broken_files(damage, tmp_path, no_model_load):
    from tiny_models import build_tiny

    src = build_tiny("qwen2_moe", tmp_path, max_shard_size="40KB" if damage == "missing shard" else None)
    if damage == "no dir":
        src = tmp_path / "nowhere"
    elif damage == "no config":
        (src / "config.json").unlink()
    elif damage == "no weights":
        (src / "model.safetensors").unlink()
    elif damage == "bin only":
        (src / "model.safetensors").rename(src / "pytorch_model.bin")
    elif damage == "missing shard":
        sorted(src.glob("model-*.safetensors"))[1].unlink()
    elif damage == "config disagrees":
        cfg = json.loads((src / "config.json").read_text())
        cfg["num_experts"] = 16
        (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError):
        build_proxy(BuildRequest(src, tmp_path / "p", keep=4, method="first_k"))
    _assert_nothing_written(tmp_path / "p")


def test_output_directory_in_the_way(tiny_checkpoints, tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "keep-me.txt").write_text("x")
    with pytest.raises(InvalidPruneRequest, match="not empty"):
        build_proxy(BuildRequest(tiny_checkpoints["olmoe"], out, keep=4, method="first_k"))
    assert [p.name for p in out.iterdir()] == ["keep-me.txt"]
    with pytest.raises(InvalidPruneRequest, match="must not be the model directory"):
        build_proxy(
            BuildRequest(
                tiny_checkpoints["olmoe"], tiny_checkpoints["olmoe"] / "sub", keep=4, method="first_k"
            )
        )
    build_proxy(BuildRequest(tiny_checkpoints["olmoe"], out, keep=4, method="first_k", overwrite=True))
    assert (out / "proxy_report.json").is_file() and not (out / "keep-me.txt").exists()


def test_failure_during_build_leaves_nothing(tiny_checkpoints, tmp_path, monkeypatch):
    """A crash after validation (here: in the surgery) removes the partial output."""
    from moeproxy.proxy_builder import surgery

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(build_module, "write_proxy_checkpoint", broken)
    with pytest.raises(OSError):
        build_proxy(BuildRequest(tiny_checkpoints["olmoe"], tmp_path / "p", keep=4, method="first_k"))
    _assert_nothing_written(tmp_path / "p")
    assert surgery.write_proxy_checkpoint is not broken


def test_all_errors_are_value_errors():
    for cls in (InvalidPruneRequest, CheckpointError, CalibrationError, UnsupportedArchitecture):
        assert issubclass(cls, ProxyBuildError) and issubclass(cls, ValueError)


# --- CLI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--keep", "9"], "only 8 per MoE layer"),
        (["--keep", "4", "--method", "magic"], "unknown method"),
        (["--keep", "4"], "needs calibration data"),
        ([], "exactly one of keep"),
    ],
)
def test_cli_rejects_with_message_and_exit_code(args, message, tiny_checkpoints, tmp_path, no_model_load):
    out = tmp_path / "p"
    result = runner.invoke(app, ["build", "--model", str(tiny_checkpoints["qwen3_moe"]), "--out", str(out), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    _assert_nothing_written(out)


def test_cli_builds_with_json_report(tiny_checkpoints, calibration_file, tmp_path):
    out = tmp_path / "p"
    result = runner.invoke(
        app,
        ["build", "--model", str(tiny_checkpoints["deepseek_v3"]), "--out", str(out), "--keep", "4",
         "--calibration", str(calibration_file), "--max-tokens", "500", "--seq-len", "32", "--json", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == json.loads((out / "proxy_report.json").read_text())
    assert report["calibration"]["tokens"] == 500
    assert report["group_routing"]["policy"] == "per_group"


def test_cli_synthetic_calibration(tiny_checkpoints, tmp_path):
    """synthetic:tasks reaches the reproduction task corpus through the CLI's lazy registration."""
    pytest.importorskip("moeproxy.reproduction.tasks")
    out = tmp_path / "p"
    result = runner.invoke(
        app,
        ["build", "--model", str(tiny_checkpoints["olmoe"]), "--out", str(out), "--keep-ratio", "0.5",
         "--calibration", "synthetic:tasks", "--max-tokens", "400", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "proxy_report.json").read_text())
    assert report["calibration"]["source"] == "synthetic:tasks" and report["calibration"]["tokens"] == 400


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_unavailable_device(tiny_checkpoints, calibration_file, tmp_path, no_model_load):
    with pytest.raises(InvalidPruneRequest, match="'cuda' is not available"):
        build_proxy(
            BuildRequest(
                tiny_checkpoints["olmoe"],
                tmp_path / "p",
                keep=4,
                calibration=str(calibration_file),
                device="cuda",
            )
        )
    _assert_nothing_written(tmp_path / "p")


def test_cli_saves_and_reuses_statistics(tiny_checkpoints, calibration_file, tmp_path):
    src = str(tiny_checkpoints["qwen2_moe"])
    npz = tmp_path / "stats.npz"
    first = runner.invoke(app, ["build", "--model", src, "--out", str(tmp_path / "a"), "--keep", "4", "--quiet",
                                "--calibration", str(calibration_file), "--max-tokens", "600",
                                "--save-statistics", str(npz)])  # fmt: skip
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["build", "--model", src, "--out", str(tmp_path / "b"), "--keep", "4", "--quiet",
                                 "--statistics", str(npz)])  # fmt: skip
    assert second.exit_code == 0, second.output
    a = json.loads((tmp_path / "a" / "proxy_report.json").read_text())
    b = json.loads((tmp_path / "b" / "proxy_report.json").read_text())
    assert a["layers"] == b["layers"] and b["calibration"] is None
    bad = runner.invoke(app, ["build", "--model", src, "--out", str(tmp_path / "c"), "--keep", "4",
                              "--statistics", str(tmp_path / "missing.npz")])  # fmt: skip
    assert bad.exit_code == 2 and "cannot read routing statistics" in bad.stderr
    assert not (tmp_path / "c").exists()


def test_the_cli_options_are_the_requests_own():
    """`moeproxy build` states its defaults and method names at import (the CLI must start without
    numpy); this keeps them equal to BuildRequest's fields and the method registry."""
    import dataclasses
    import inspect

    from moeproxy.cli.build import build as build_command
    from moeproxy.proxy_builder.methods import METHODS

    defaults = {f.name: f.default for f in dataclasses.fields(BuildRequest)}
    options = inspect.signature(build_command).parameters
    shared = [name for name in options if name in defaults and name not in ("model_dir", "out_dir")]
    assert len(shared) >= 14
    for name in shared:
        assert options[name].default.default == defaults[name], name
    listed = [m.strip(" .") for m in options["method"].default.help.split(",")]
    assert listed == list(METHODS)
