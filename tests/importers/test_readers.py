"""Each reader on files the real writers made: the right steps and values, detection, the framework,
and a bad file named with its line or record."""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
import pytest

from moeproxy.importers import FORMATS, InvalidSource, detect_format, detect_framework, read_source
from tests.importers.fixtures import (
    TRL_NAMES,
    trl_history,
    verl_console_line,
    verl_steps,
    write_hf_console,
    write_mlflow_run,
    write_trainer_state,
    write_verl_file_logger,
    write_wandb_offline_run,
)


def _as_dict(run):
    return {step: values for step, values in run.steps}


def _nan_as_none(steps: dict) -> dict:
    """NaN != NaN: compare a NaN point as None, so that a lost or extra NaN still fails."""
    return {s: {k: None if math.isnan(v) else v for k, v in values.items()} for s, values in steps.items()}


def test_trainer_state_reads_log_history_without_the_summary(tmp_path):
    pytest.importorskip("transformers")
    history = trl_history(n_steps=20)
    history.insert(5, {"epoch": 0.25, "step": 5, "eval_loss": 0.7, "eval_runtime": 0.5})
    history[7]["grad_norm"] = float("nan")  # json writes the NaN literal: a point, the fault itself
    path = write_trainer_state(tmp_path / "grpo-out" / "checkpoint-20", history)
    run = read_source(path)
    assert (run.format, run.framework, run.name) == ("trainer_state", "trl", "grpo-out")
    got = _as_dict(run)
    assert sorted(got) == list(range(1, 21))
    assert got[3]["completions/mean_length"] == history[2]["completions/mean_length"]
    assert got[5]["eval_loss"] == 0.7 and got[5]["loss"] == history[4]["loss"]  # train and eval merged
    assert math.isnan(got[7]["grad_norm"])
    assert not {"train_runtime", "total_flos", "train_loss", "step"} & run.metric_names()
    assert run.n_points == 20 * (len(TRL_NAMES) + 2) + 2


def test_verl_file_logger_lines(tmp_path):
    steps = verl_steps(n_steps=12)
    steps[4][1]["actor/grad_norm"] = np.float64("nan")  # orjson writes null: a point not logged
    path = write_verl_file_logger(tmp_path / "exp.jsonl", steps)
    run = read_source(path)
    assert (run.format, run.framework, run.name) == ("verl_file", "verl", "exp")
    got = _as_dict(run)
    assert got[1]["critic/score/mean"] == float(steps[0][1]["critic/score/mean"])
    assert got[1]["timing_s/step"] == 1.5
    assert "actor/grad_norm" not in got[5] and len(run.steps) == 12


def test_verl_console_lines_among_other_output(tmp_path):
    steps = verl_steps(n_steps=6)
    lines = ["Creating file logger at /tmp/x.jsonl", "(TaskRunner pid=4242) Training Progress: 0%"]
    lines += [f"(TaskRunner pid=4242) {verl_console_line(data, step)}" for step, data in steps]
    lines[4] += " - actor/pg_loss:nan"
    path = tmp_path / "console.log"
    path.write_text("\n".join(lines) + "\n")
    run = read_source(path)
    assert run.format == "verl_console" and run.framework == "verl"
    got = _as_dict(run)
    assert got[6]["actor/kl_loss"] == pytest.approx(float(steps[5][1]["actor/kl_loss"]), rel=1e-15)
    assert math.isnan(got[3]["actor/pg_loss"])


@pytest.mark.parametrize("bar", [True, False])
def test_hf_console_dicts_as_the_trainers_callbacks_print_them(tmp_path, bar):
    pytest.importorskip("transformers")
    history = trl_history(n_steps=15)
    history.insert(5, {"epoch": 0.33, "step": 5, "eval_loss": 0.7, "eval_runtime": 0.5})  # not a training step
    history[7]["grad_norm"] = float("nan")
    path = write_hf_console(tmp_path / "grpo.log", history, bar=bar)
    run = read_source(path)
    assert run.format == "hf_console" and run.framework == "trl"
    got = _as_dict(run)
    assert sorted(got) == list(range(1, 16))  # log order: the dicts hold no step; eval and summary skipped
    train = [e for e in history if "loss" in e]
    for step, entry in enumerate(train, start=1):
        for name in TRL_NAMES:
            # Releases since 2024 print each float with 4 significant digits, as a string.
            if not math.isnan(entry[name]):
                assert got[step][name] == float(f"{entry[name]:.4g}"), (step, name)
    assert math.isnan(got[7]["grad_norm"])
    assert not {"train_runtime", "total_flos", "eval_loss", "step"} & run.metric_names()


def test_hf_console_dict_wrapped_by_a_terminal_and_one_that_carries_its_step(tmp_path):
    path = tmp_path / "wrapped.log"
    path.write_text("{'loss': 0.01, 'grad_norm': 1.5, 'learning_rate': 1e-06, 'rewa\nrd': 0.3, 'kl': 0.0\n02, 'epoch': 0.1}\n"
                    "Map: 100%|####| 10/10 [00:00<00:00]\n{'temperature': 0.9, 'top_p': 1.0}\n"
                    "{'loss': 0.02, 'grad_norm': 1.4, 'learning_rate': 1e-06, 'reward': 0.4, 'kl': 0.003, 'step': 40}\n")
    got = _as_dict(read_source(path))
    assert got == {1: {"loss": 0.01, "grad_norm": 1.5, "learning_rate": 1e-06, "reward": 0.3, "kl": 0.002, "epoch": 0.1},
                   40: {"loss": 0.02, "grad_norm": 1.4, "learning_rate": 1e-06, "reward": 0.4, "kl": 0.003}}


def test_csv_and_parquet_from_pandas(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"step": [0, 1, 2, 3], "train/reward": [0.1, 0.2, None, 0.4],
                          "train/kl": [0.0, 0.01, 0.02, float("inf")], "note": ["a", "b", "c", "d"]})
    frame.to_csv(tmp_path / "run.csv")  # with pandas' index column, whose header is empty
    csv_run = read_source(tmp_path / "run.csv")
    assert csv_run.format == "csv" and csv_run.framework == "openrlhf"
    assert _as_dict(csv_run)[2] == {"train/kl": 0.02} and _as_dict(csv_run)[3]["train/kl"] == math.inf
    pytest.importorskip("pyarrow")
    frame.index = frame.index + 10  # not the default index: pandas stores it as __index_level_0__
    frame.to_parquet(tmp_path / "run.parquet")
    parquet_run = read_source(tmp_path / "run.parquet")
    assert parquet_run.format == "parquet" and parquet_run.steps == csv_run.steps


def test_tensorboard_folder_from_summary_writer(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "runs" / "exp1"))
    for step in range(30):
        writer.add_scalar("critic/score/mean", 0.5 + step / 64, step)  # exact in float32
        writer.add_scalar("actor/kl_loss", float("nan") if step == 7 else step / 8, step)
    writer.close()
    run = read_source(tmp_path / "runs")
    assert (run.format, run.framework, len(run.steps)) == ("tensorboard", "verl", 30)
    got = _as_dict(run)
    assert got[29]["critic/score/mean"] == 0.5 + 29 / 64 and math.isnan(got[7]["actor/kl_loss"])
    SummaryWriter(str(tmp_path / "runs" / "exp2")).close()
    with pytest.raises(InvalidSource, match="2 runs"):
        read_source(tmp_path / "runs")


def _accumulated(folder) -> dict:
    """The same folder through tensorboard's EventAccumulator: the reference the reader must equal."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    out: dict = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            out.setdefault(e.step, {})[tag] = e.value
    return out


def test_tensorboard_reader_equals_event_accumulator_across_a_restart(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step in range(50):
        writer.add_scalar("actor/kl_loss", float("nan") if step == 3 else step / 8, step)
        writer.add_scalar("critic/score/mean", -step / 4, step)
        if step % 10 == 0:
            writer.add_histogram("actor/logits", np.array([1.0, 2.0, step]), step)  # not a scalar
    # The job restarted from its step-30 checkpoint: what it wrote at 30-49 before is orphaned.
    writer._get_file_writer().add_event(Event(step=30, session_log=SessionLog(status=SessionLog.START)))
    for step in range(30, 40):
        writer.add_scalar("actor/kl_loss", 100.0 + step, step)
    writer.close()
    got = _as_dict(read_source(tmp_path / "run"))
    assert _nan_as_none(got) == _nan_as_none(_accumulated(tmp_path / "run"))
    assert sorted(got) == list(range(40)) and got[35] == {"actor/kl_loss": 135.0}
    assert got[29]["critic/score/mean"] == -29 / 4


def test_tensorboard_old_file_version_purges_by_tag_when_a_step_goes_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    folder = tmp_path / "old"
    folder.mkdir()
    with (folder / "events.out.tfevents.1.host").open("wb") as fh:
        records = RecordWriter(fh)
        records.write(Event(file_version="brain.Event:1").SerializeToString())
        for step, tag in [(s, t) for s in range(10) for t in ("a", "b")] + [(5, "a"), (6, "a")]:
            value = Summary.Value(tag=tag, simple_value=float(step * 10 + (tag == "b")))
            records.write(Event(step=step, summary=Summary(value=[value])).SerializeToString())
    got = _as_dict(read_source(folder))
    assert got == _accumulated(folder)
    assert sorted(s for s in got if "a" in got[s]) == list(range(7))  # a's 7-9 purged
    assert sorted(s for s in got if "b" in got[s]) == list(range(10))  # b untouched


def test_tensorboard_scalar_tensors_from_tensorboards_own_writer(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.summary import Writer

    writer = Writer(str(tmp_path / "tf2"))
    for step in range(6):
        writer.add_scalar("train/reward", step * 0.25, step)
    writer.close()
    assert _as_dict(read_source(tmp_path / "tf2")) == {s: {"train/reward": s * 0.25} for s in range(6)}


def test_tensorboard_file_being_written_and_a_damaged_file(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "live"))
    for step in range(20):
        writer.add_scalar("loss", step / 2, step)
    writer.close()
    [path] = list((tmp_path / "live").iterdir())
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the last record only partly on disk: a writer mid-flush
    assert sorted(_as_dict(read_source(path))) == list(range(19))
    damaged = bytearray(whole)
    damaged[len(whole) // 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with pytest.raises(InvalidSource, match="damaged event file .*checksum at byte"):
        read_source(path)


def test_tensorboard_checksums_equal_tensorboards_own(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as naive_crc32c
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as naive_masked

    from moeproxy.importers.tensorboard import _crc32c, masked_crc32c

    fast = _crc32c()
    rng = np.random.default_rng(0)
    for n in (0, 1, 8, 13, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert fast(data) == naive_crc32c(data)
        assert masked_crc32c(fast(data)) == naive_masked(data)


def test_mlflow_file_store_run_through_the_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the writer's side; the reader sets it itself
    store = tmp_path / "mlruns"
    steps = verl_steps(n_steps=25)
    steps[3][1]["actor/grad_norm"] = np.float64("nan")  # MLflow keeps a NaN: a point
    run_id = write_mlflow_run(store.as_uri(), steps, run_name="dapo-seed1")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    expected = {step: {k: float(v) for k, v in data.items()} for step, data in steps}
    [run_folder] = [p for p in store.glob("*/*") if p.name == run_id]
    for source in (run_folder, store, f"mlflow:{store.as_uri()}#{run_id}"):
        run = read_source(source)
        assert (run.format, run.framework, run.name) == ("mlflow", "verl", "dapo-seed1")
        got = _as_dict(run)
        assert sorted(got) == list(range(1, 26)) and run.n_points == 25 * 6
        assert math.isnan(got[4]["actor/grad_norm"])
        assert _nan_as_none(got) == _nan_as_none(expected)  # every point, names as logged ("timing_s/step" too)
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
    write_mlflow_run(store.as_uri(), steps[:2], run_name="second")
    with pytest.raises(InvalidSource, match=rf"{store}: 2 MLflow runs"):
        read_source(store)


def test_mlflow_sqlite_store_and_a_step_logged_twice(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = write_mlflow_run(uri, [(0, {"train/reward": 0.1, "train/kl": 0.0}), (1, {"train/reward": 0.2,
                                                                                     "train/kl": 0.01})],
                              run_name="ppo")
    MlflowClient(tracking_uri=uri).log_metric(run_id, "train/reward", 0.25, step=1, timestamp=1_800_000_000_000)
    run = read_source(f"mlflow:{uri}#{run_id}")
    assert (run.format, run.framework, run.name) == ("mlflow", "openrlhf", "ppo")
    assert _as_dict(run) == {0: {"train/reward": 0.1, "train/kl": 0.0}, 1: {"train/reward": 0.25, "train/kl": 0.01}}
    with pytest.raises(InvalidSource, match=rf"mlflow:{uri}#0123abcd: .*0123abcd"):
        read_source(f"mlflow:{uri}#0123abcd")


def test_mlflow_sources_refused_with_what_to_give(tmp_path, monkeypatch):
    with pytest.raises(InvalidSource, match="expected mlflow:<tracking-uri>#<run-id>"):
        read_source("mlflow:http://localhost:5000")
    with pytest.raises(InvalidSource, match="a mlflow source, not 'csv'"):
        read_source("mlflow:#abc", "csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidSource, match="not an MLflow file store"):
        read_source(tmp_path / "empty", "mlflow")
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)  # the light install
    with pytest.raises(InvalidSource, match=r"needs the mlflow client, which the \[dev\] extra brings"):
        read_source("mlflow:#abc")


def test_wandb_offline_run_through_wandbs_reader(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    steps = [(step, {name: float(v) for name, v in data.items()}) for step, data in verl_steps(n_steps=30)]
    steps[6][1]["actor/grad_norm"] = math.nan
    steps[7][1]["actor/kl_loss"] = math.inf
    logged = [(step, {**data, "rollout": {"mean_len": float(step)}, "note": "text", "ok": True})
              for step, data in steps]
    run_dir = write_wandb_offline_run(tmp_path, logged, name="verl-wb")
    expected = {step: {**data, "rollout.mean_len": float(step)} for step, data in steps}
    for source in (run_dir, next(run_dir.glob("run-*.wandb")), tmp_path / "wandb"):
        run = read_source(source)
        assert (run.format, run.framework, run.name) == ("wandb", "verl", "verl-wb")
        got = _as_dict(run)
        assert _nan_as_none(got) == _nan_as_none(expected)  # _step, _runtime, _timestamp are W&B's own
        assert got[8]["actor/kl_loss"] == math.inf and math.isnan(got[7]["actor/grad_norm"])
    write_wandb_offline_run(tmp_path, logged[:2], name="second")
    with pytest.raises(InvalidSource, match=r"2 W&B runs"):
        read_source(tmp_path / "wandb")
    bad = tmp_path / "broken" / "run-x.wandb"
    bad.parent.mkdir()
    bad.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(InvalidSource, match=rf"{bad}: not a readable W&B run file"):
        read_source(bad.parent)
    monkeypatch.setitem(sys.modules, "wandb", None)  # the light install
    with pytest.raises(InvalidSource, match=r"needs the wandb package, which the \[dev\] extra brings"):
        read_source(run_dir)


def test_wandb_csv_exports(tmp_path):
    pd = pytest.importorskip("pandas")
    # The run history as W&B's exports lay it out (the export itself needs the W&B server).
    history = pd.DataFrame({"_step": [0, 1, 2], "_runtime": [1.0, 2.0, 3.0], "_timestamp": [1.7e9] * 3,
                            "train/reward": [0.1, None, 0.3], "train/kl": [0.0, 0.01, 0.02]})
    history.to_csv(tmp_path / "history.csv", index=False)
    run = read_source(tmp_path / "history.csv")
    assert (run.format, run.framework, run.name) == ("wandb_csv", "openrlhf", "history")
    assert _as_dict(run) == {0: {"train/reward": 0.1, "train/kl": 0.0}, 1: {"train/kl": 0.01},
                             2: {"train/reward": 0.3, "train/kl": 0.02}}
    panel = pd.DataFrame({"Step": [10, 20], "dapo-3 - actor/entropy": [1.2, 1.1],
                          "dapo-3 - actor/entropy__MIN": [1.19, 1.05], "dapo-3 - actor/entropy__MAX": [1.3, 1.2]})
    panel.to_csv(tmp_path / "wandb_export_2026-01-05.csv", index=False)
    run = read_source(tmp_path / "wandb_export_2026-01-05.csv")
    assert (run.format, run.name) == ("wandb_csv", "dapo-3")
    assert _as_dict(run) == {10: {"actor/entropy": 1.2}, 20: {"actor/entropy": 1.1}}
    panel["dapo-4 - actor/entropy"] = [1.0, 0.9]
    panel["dapo-4 - actor/entropy__MIN"] = [1.0, 0.9]
    panel.to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(InvalidSource, match=r"two.csv: a panel export of 2 runs \(dapo-3, dapo-4\)"):
        read_source(tmp_path / "two.csv")


def test_detection_and_the_registry(tmp_path):
    (tmp_path / "own.jsonl").write_text(json.dumps({"step": 0, "values": {"kl": 0.1}}) + "\n")
    assert detect_format(tmp_path / "own.jsonl") is None  # the project's own format: triage reads it as before
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(InvalidSource, match="give --format"):
        read_source(tmp_path / "notes.txt")
    with pytest.raises(InvalidSource, match="unknown format 'nope'"):
        read_source(tmp_path / "notes.txt", "nope")
    assert set(FORMATS) >= {"trainer_state", "verl_file", "verl_console", "hf_console", "csv", "parquet",
                            "tensorboard", "mlflow", "wandb", "wandb_csv"}


@pytest.mark.parametrize(("names", "framework"), [
    (["critic/score/mean", "actor/kl_loss", "loss"], "verl"),
    (["completions/mean_length", "reward", "kl"], "trl"),
    (["train/completions/mean_length", "train/loss"], "trl"),  # transformers' train/ prefix
    (["train/reward", "train/kl", "train/policy_loss"], "openrlhf"),
    (["critic/score/mean", "completions/mean_length"], None),  # two frameworks: unknown
    (["loss", "reward", "kl"], None),  # what any loop logs
])
def test_framework_from_names_only_one_framework_logs(names, framework):
    assert detect_framework(names) == framework


def test_bad_files_name_the_file_and_the_line(tmp_path):
    lines = [json.dumps({"step": 1, "data": {"actor/kl_loss": 0.1}}), json.dumps({"step": 2, "data": {}}),
             "{not json", ""]
    bad = tmp_path / "verl.jsonl"
    bad.write_text("\n".join(lines))
    with pytest.raises(InvalidSource, match=rf"{bad}: line 3: not JSON"):
        read_source(bad)
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": [{"step": 1, "loss": 1.0}, {"step": "two", "loss": 0.5}]}))
    with pytest.raises(InvalidSource, match=rf"{state}: log_history\[1\]: step must be an integer"):
        read_source(state)
    table = tmp_path / "run.csv"
    table.write_text("step,loss\n0,1.0\n1.5,0.9\n")
    with pytest.raises(InvalidSource, match=rf"{table}: line 3: step must be an integer"):
        read_source(table)
    # A step the service cannot store (64-bit) is the file's error, named there, not a failed send.
    table.write_text(f"step,loss\n0,1.0\n{2**63},0.9\n")
    with pytest.raises(InvalidSource, match=rf"{table}: line 3: step {2**63} is above 2\*\*63 - 1"):
        read_source(table)
    (tmp_path / "nostep.csv").write_text("iteration,loss\n0,1.0\n")
    with pytest.raises(InvalidSource, match="no step column"):
        read_source(tmp_path / "nostep.csv")
    console = tmp_path / "console.log"
    console.write_text("step:1 - actor/kl_loss:0.1\nstep:2 - actor/kl_loss:oops\n")
    with pytest.raises(InvalidSource, match=rf"{console}: line 2: actor/kl_loss: not a number"):
        read_source(console)
