"""``moeproxy reference``: train and list the small reference MoE models (issue 5)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

# The registry of trainable architectures; importing it needs no torch.
from moeproxy.reproduction.reference import ARCH_CONFIGS


def _one_of(names) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


reference_app = typer.Typer(
    help="Reference MoE models trained on the synthetic task suite: list the shipped checkpoints "
    "or retrain one (reproducible from its seed).",
    no_args_is_help=True,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@reference_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON.")) -> None:
    """List the shipped reference models, their checkpoint paths and held-out accuracy."""
    from moeproxy.reproduction.reference import list_reference_models

    rows = list_reference_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        acc = row["heldout_accuracy"] or {}
        mean = acc.get("mean")
        state = "present" if row["present"] else "missing"
        mean_txt = f"mean held-out accuracy {mean:.3f}" if mean is not None else "not evaluated"
        typer.echo(f"{row['name']:18} {row['arch']:12} {state:8} {mean_txt}  {row['path']}")


@reference_app.command("train")
def train(
    arch: str = typer.Option(None, "--arch", help=f"Architecture to train: {_one_of(ARCH_CONFIGS)}."),
    name: str = typer.Option(None, "--name", help="A registered reference model: use its arch and recipe."),
    out: Path = typer.Option(..., "--out", help="Checkpoint directory to write."),
    seed: int = typer.Option(None, "--seed", help="Seed (default: the registered recipe's)."),
    steps: int = typer.Option(None, "--steps", min=1, help="Optimizer steps (default: the recipe's)."),
    lr: float = typer.Option(None, "--lr", help="Peak learning rate (default: the recipe's)."),
    batch_size: int = typer.Option(None, "--batch-size", min=1, help="Examples per step."),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads (1 on a shared machine)."),
    eval_prompts: int = typer.Option(500, "--eval-prompts", min=0,
                                     help="Held-out prompts per task to score after training (0 = skip)."),
    snapshot_every: int = typer.Option(0, "--snapshot-every", min=0,
                                       help="Also keep the weights every N steps in OUT/snapshots/step-N, "
                                            "each with its quick held-out figures (0 = only the last)."),
    as_json: bool = typer.Option(False, "--json", help="Print the training summary as JSON."),
) -> None:
    """Train a reference model on the task suite's train split and save an HF checkpoint
    (safetensors + config + tokenizer + training.json with the recipe and loss curve)."""
    from dataclasses import replace

    from moeproxy.reproduction.reference import REFERENCE_MODELS, TrainingRecipe

    if name is not None:
        if name not in REFERENCE_MODELS:
            _fail(f"unknown reference model {name!r}; known: {', '.join(REFERENCE_MODELS)}")
        entry = REFERENCE_MODELS[name]
        if arch is not None and arch != entry.arch:
            _fail(f"{name} is a {entry.arch} model, not {arch}")
        arch, recipe, overrides = entry.arch, entry.recipe, entry.config_overrides
    else:
        if arch is None:
            _fail(f"give --arch ({_one_of(ARCH_CONFIGS)}) or --name")
        if arch not in ARCH_CONFIGS:
            _fail(f"unknown architecture {arch!r}; known: {', '.join(ARCH_CONFIGS)}")
        recipe = next((m.recipe for m in REFERENCE_MODELS.values() if m.arch == arch), TrainingRecipe())
        overrides = {}
    changes = {k: v for k, v in {"seed": seed, "steps": steps, "lr": lr, "batch_size": batch_size}.items()
               if v is not None}
    try:
        recipe = replace(recipe, **changes)
    except ValueError as exc:
        _fail(str(exc))
    summary = _train_and_save(arch, recipe, overrides, out, threads, eval_prompts, snapshot_every)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))


def _train_and_save(arch, recipe, overrides, out: Path, threads: int, eval_prompts: int,
                    snapshot_every: int = 0) -> dict:
    from dataclasses import asdict, replace

    import torch
    from tqdm import tqdm

    from moeproxy.reproduction.reference import heldout_accuracy, save_checkpoint, train_model

    torch.set_num_threads(threads)
    bar = tqdm(total=recipe.steps, desc=f"train {arch}", unit="step")

    def progress(step: int, values: dict[str, float]) -> None:
        bar.n = step + 1
        bar.set_postfix(loss=f"{values['loss']:.3f}", aux=f"{values['aux']:.3f}", lr=f"{values['lr']:.1e}")
        bar.refresh()

    def checkpoint(step: int, model, tokenizer) -> None:
        # A quick held-out look while training runs (50 prompts per task); the final figure is below.
        # The weights so far go to OUT/partial so a stopped run leaves a usable checkpoint.
        import copy

        partial = copy.deepcopy(model).to(getattr(torch, recipe.save_dtype))
        partial.save_pretrained(out / "partial")
        tokenizer.save_pretrained(out / "partial")
        acc = heldout_accuracy(model, tokenizer, 50, save_dtype=recipe.save_dtype, seed=1)
        if snapshot_every and step % snapshot_every == 0:
            # With a constant LR after warm-up (min_lr_ratio 1) a snapshot at step N is the model a
            # run of N steps would save, so one run can pick an RL starting point by its accuracy.
            snap = out / "snapshots" / f"step-{step + 1}"  # step is 0-based: step + 1 updates done
            partial.save_pretrained(snap)
            tokenizer.save_pretrained(snap)
            (snap / "training.json").write_text(json.dumps(
                {"recipe": asdict(replace(recipe, steps=step + 1)), "heldout_accuracy_quick": acc}, indent=2) + "\n")
        shown = {k: v for k, v in acc.items() if isinstance(v, float)} | acc.get("components", {})
        bar.write(f"step {step}: held-out accuracy " + " ".join(f"{k}={v:.2f}" for k, v in shown.items()))

    result = train_model(arch, recipe, overrides, progress=progress, log_every=10,
                         checkpoint=checkpoint if eval_prompts else None,
                         checkpoint_every=min(500, snapshot_every or 500))
    bar.close()
    extra = {"arch": arch, "config_overrides": overrides}
    if eval_prompts:
        extra["heldout_accuracy"] = heldout_accuracy(result.model, result.tokenizer, eval_prompts,
                                                     save_dtype=recipe.save_dtype)
    import shutil

    shutil.rmtree(out / "partial", ignore_errors=True)
    save_checkpoint(result, out, recipe, extra)
    size_mb = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    summary = {"out": str(out), "arch": arch, "train_time_s": round(result.train_time_s, 1),
               "final_loss": sum(result.losses[-50:]) / len(result.losses[-50:]),
               "checkpoint_mb": round(size_mb, 2), **{k: v for k, v in extra.items() if k == "heldout_accuracy"}}
    typer.echo(f"saved {out} ({size_mb:.1f} MB) after {result.train_time_s:.0f} s", err=True)
    return summary


def register(app: typer.Typer) -> None:
    app.add_typer(reference_app, name="reference")
