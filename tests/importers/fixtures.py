"""Past runs written by the real libraries: transformers' TrainerState, pandas, torch's SummaryWriter,
the mlflow client, and verl's two loggers (verl itself does not install here: its writers are copied
line for line)."""

from __future__ import annotations

import numbers
import pprint
from pathlib import Path

import numpy as np
import orjson

TRL_NAMES = ("reward", "reward_std", "kl", "entropy", "grad_norm", "loss", "completions/mean_length")
VERL_NAMES = ("critic/score/mean", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "response_length/mean")


def trl_history(n_steps: int = 60, seed: int = 0) -> list[dict]:
    """A GRPO-like log history: TRL's names, one entry a step, the summary entry at the end."""
    rng = np.random.default_rng(seed)
    history = []
    for step in range(1, n_steps + 1):
        entry = {"epoch": step / n_steps, "step": step, "learning_rate": 1e-6}
        for i, name in enumerate(TRL_NAMES):
            entry[name] = float(0.1 * (i + 1) + 0.01 * step + 0.02 * rng.standard_normal())
        history.append(entry)
    history.append({"epoch": 1.0, "step": n_steps, "total_flos": 0.0, "train_loss": 0.3, "train_runtime": 12.5,
                    "train_samples_per_second": 4.0, "train_steps_per_second": 1.0})
    return history


def write_trainer_state(folder: Path, history: list[dict]) -> Path:
    from transformers import TrainerState

    state = TrainerState(global_step=history[-1]["step"], max_steps=history[-1]["step"])
    state.log_history = history
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    state.save_to_json(str(path))
    return path


def write_hf_console(path: Path, history: list[dict], *, bar: bool = True) -> Path:
    """What a Trainer prints to a terminal (or ``nohup``'s file): transformers' own ProgressCallback
    (the progress bar on standard error, each log dict written through it on standard output) or,
    without a bar, its PrinterCallback; ``history`` as ``Trainer.log`` passes it (with ``step``
    removed: the console dict holds none)."""
    import contextlib

    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    state = TrainerState(max_steps=history[-1]["step"])
    control = TrainerControl()
    callback = ProgressCallback() if bar else PrinterCallback()
    with path.open("w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        print("Loading checkpoint shards: 100%|##########| 2/2 [00:01<00:00,  1.40it/s]")
        callback.on_train_begin(None, state, control)
        for entry in history:
            state.global_step = entry["step"]
            if bar:
                callback.on_step_end(None, state, control)
            callback.on_log(None, state, control, logs={k: v for k, v in entry.items() if k != "step"})
        callback.on_train_end(None, state, control)
    return path


def verl_steps(n_steps: int = 40, seed: int = 1) -> list[tuple[int, dict]]:
    rng = np.random.default_rng(seed)
    return [(step, {name: np.float64(0.5 * i + 0.01 * step + 0.01 * rng.standard_normal())
                    for i, name in enumerate(VERL_NAMES)} | {"timing_s/step": np.float32(1.5)})
            for step in range(1, n_steps + 1)]


def write_verl_file_logger(path: Path, steps: list[tuple[int, dict]]) -> Path:
    # verl/utils/tracking.py FileLogger.log (volcengine/verl b178a3cd): the file is opened "wb" and
    # each call writes orjson.dumps({"step": step, "data": data}, option=OPT_SERIALIZE_NUMPY) + b"\n".
    with path.open("wb", buffering=0) as fp:
        for step, data in steps:
            fp.write(orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return path


def verl_console_line(data: dict, step: int) -> str:
    # verl/utils/logger/aggregate_logger.py concat_dict_to_str (volcengine/verl b178a3cd).
    output = [f"step:{step}"]
    for k, v in data.items():
        if isinstance(v, numbers.Number):
            output.append(f"{k}:{pprint.pformat(v)}")
    return " - ".join(output)


def write_mlflow_run(tracking_uri: str, steps: list[tuple[int, dict]], *, run_name: str,
                     experiment: str = "grpo") -> str:
    """One run logged as a training loop would: the first metric of each step with ``log_metric``,
    the rest with ``log_batch``; returns the run id."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    for step, data in steps:
        (first, value), *rest = data.items()
        client.log_metric(run_id, first, float(value), step=step)
        stamp = 1_700_000_000_000 + step
        client.log_batch(run_id, metrics=[Metric(k, float(v), stamp, step) for k, v in rest])
    client.set_terminated(run_id)
    return run_id


def write_wandb_offline_run(root: Path, steps: list[tuple[int, dict]], *, name: str) -> Path:
    """One run logged by the real wandb library in offline mode (nothing leaves the machine);
    returns the run's directory (``<root>/wandb/offline-run-<date>-<id>``)."""
    import wandb

    settings = wandb.Settings(mode="offline", console="off", x_disable_stats=True, silent=True)
    run = wandb.init(project="grpo", name=name, dir=str(root), settings=settings)
    try:
        for step, data in steps:
            run.log(dict(data), step=step)
    finally:
        run.finish()
    return Path(run.dir).parent
