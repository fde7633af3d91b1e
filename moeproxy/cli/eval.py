"""``moeproxy eval``: how faithful a proxy is to its original (issue 5)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _summary_lines(report: dict) -> list[str]:
    o, p = report["original"], report["proxy"]
    lines = [f"{'task':16}{'original':>10}{'proxy':>10}"]
    for task, acc in o["accuracy"].items():
        lines.append(f"{task:16}{acc:10.3f}{p['accuracy'][task]:10.3f}")
    lines.append(f"{'mean':16}{o['mean_accuracy']:10.3f}{p['mean_accuracy']:10.3f}")
    lines.append(f"retention {report['retention']:.3f}  KL {report['kl']:.4f}  KL(answer) "
                 f"{report['kl_answer']:.4f}  coverage {report['routing_coverage']:.3f}  "
                 f"agreement {report['routing_agreement']:.3f}  hidden cosine {report['hidden_cosine_mean']:.3f}")
    ratios = [f"parameters x{report['parameter_ratio']:.3f}"]
    if report.get("memory_ratio") is not None:
        ratios.append(f"peak memory x{report['memory_ratio']:.3f}")
    if report.get("throughput_ratio") is not None:
        ratios.append(f"generation throughput x{report['throughput_ratio']:.3f}")
    lines.append("proxy/original: " + ", ".join(ratios))
    return lines


def eval_command(
    original: Path = typer.Option(..., "--original", help="Original checkpoint directory."),
    proxy: Path = typer.Option(..., "--proxy", help="Proxy checkpoint directory (with proxy_report.json)."),
    prompts_per_task: int = typer.Option(500, "--prompts-per-task", min=1,
                                         help="Held-out prompts per task for exact-match accuracy."),
    kl_texts_per_task: int = typer.Option(100, "--kl-texts-per-task", min=1,
                                          help="Held-out texts per task for KL, routing and hidden states."),
    tasks: str = typer.Option(None, "--tasks", help="Comma-separated task names (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the held-out sample."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Generation batch size."),
    no_cost: bool = typer.Option(False, "--no-cost", help="Skip the memory and throughput measurements."),
    threads: int = typer.Option(1, "--threads", min=1, help="torch threads."),
    out: Path = typer.Option(None, "--out", help="Write the report JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the report JSON to stdout."),
) -> None:
    """Compare a proxy with its original on held-out tasks: per-task accuracy (Wilson 95% CI) and
    retention, KL(original||proxy) overall and on answer tokens, routing coverage and agreement,
    expert-utilisation entropy, hidden-state cosine per layer, parameter / memory / throughput ratios."""
    for label, path in (("--original", original), ("--proxy", proxy)):
        if not (path / "config.json").exists():
            _fail(f"{label} {path}: not a checkpoint directory (no config.json)")
    import torch
    from tqdm import tqdm

    from moeproxy.reproduction.fidelity import EvalSettings, FidelityError, evaluate_pair
    from moeproxy.reproduction.tasks import TASKS

    torch.set_num_threads(threads)
    task_names = tuple(t.strip() for t in tasks.split(",")) if tasks else tuple(TASKS)
    try:
        settings = EvalSettings(prompts_per_task=prompts_per_task, kl_texts_per_task=kl_texts_per_task,
                                seed=seed, batch_size=batch_size, tasks=task_names, measure_cost=not no_cost)
    except ValueError as exc:
        _fail(str(exc))
    bars: dict[str, tqdm] = {}

    def progress(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None or bar.n > done:
            if bar is not None:
                bar.close()
            bar = bars[stage] = tqdm(total=total, desc=stage, leave=False)
        bar.n = done
        bar.refresh()

    try:
        report = evaluate_pair(original, proxy, settings, progress)
    except FidelityError as exc:
        _fail(str(exc))
    for bar in bars.values():
        bar.close()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo("\n".join(_summary_lines(report)))


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
