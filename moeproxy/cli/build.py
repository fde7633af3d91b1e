"""``moeproxy build``: build a proxy model of a MoE checkpoint (SPEC section 2, issue 4).

A thin wrapper over :func:`moeproxy.proxy_builder.build.build_proxy`; torch and
transformers are imported inside the command.  Also registers the ``synthetic``
calibration source (the reproduction task corpus) lazily, so the proxy builder
itself never imports the reproduction stage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

_HELP = (
    "Build a proxy of a MoE checkpoint: keep K representative routed experts per MoE layer "
    "(three-view clustering by default), copy everything else unchanged, and write the proxy "
    "checkpoint with proxy_report.json. Nothing is written if the request is invalid."
)


def _register_lazy_sources() -> None:
    from moeproxy.reproduction.tasks import register_synthetic_calibration

    register_synthetic_calibration()


def build(
    model: Path = typer.Option(..., "--model", help="Directory of the original checkpoint (config.json + safetensors)."),  # noqa: B008
    out: Path = typer.Option(..., "--out", help="Directory to write the proxy into (must not exist or be empty)."),  # noqa: B008
    keep: int | None = typer.Option(None, "--keep", help="Routed experts to keep in every MoE layer."),
    keep_ratio: float | None = typer.Option(None, "--keep-ratio", help="Fraction of routed experts to keep, in (0, 1]."),
    method: str = typer.Option(
        "three_view",
        "--method",
        help="three_view, three_view_unweighted, router_coact, router_proto, coact_proto, router, coact, proto, "
        "frequency, random, first_k.",
    ),
    calibration: str | None = typer.Option(
        None,
        "--calibration",
        help="Calibration data: a .txt (one document per line) or .jsonl file, a tokenized directory "
        "(input_ids.npy), synthetic:tasks (the reproduction task corpus) or random:SEED.",
    ),
    max_tokens: int = typer.Option(16384, "--max-tokens", help="Calibration tokens to route (padding excluded)."),
    seq_len: int = typer.Option(512, "--seq-len", help="Longest calibration sequence."),
    batch_size: int = typer.Option(8, "--batch-size", help="Calibration sequences per forward pass."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or npu (for the calibration forward passes)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (the checkpoint's), float32, bfloat16 or float16."),
    view_weights: str | None = typer.Option(
        None,
        "--view-weights",
        help="Fusion weights router,coact,proto (e.g. 1,1,1), or auto: pick by next-token KL on held-out "
        "calibration data over a simplex grid (steps 0.25).",
    ),
    representative: str = typer.Option(
        "most_frequent", "--representative", help="Expert kept per cluster: most_frequent (paper) or medoid."
    ),
    group_policy: str = typer.Option(
        "per_group",
        "--group-policy",
        help="DeepSeek group routing: per_group (keep K/n_group per group) or flatten (n_group=topk_group=1).",
    ),
    weighted_prototypes: bool = typer.Option(
        True,
        "--weighted-prototypes/--plain-prototypes",
        help="Weight each token's router input by its routing weight in the expert prototypes.",
    ),
    statistics: Path | None = typer.Option(  # noqa: B008
        None,
        "--statistics",
        help="Routing statistics saved by an earlier build (--save-statistics): skip calibration.",
    ),
    save_statistics: Path | None = typer.Option(  # noqa: B008
        None, "--save-statistics", help="Also save the routing statistics to this .npz file."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for random selection and FasterPAM."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty output directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the build report as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Build a proxy model with fewer routed experts per MoE layer."""
    from moeproxy.proxy_builder.errors import ProxyBuildError

    _register_lazy_sources()
    try:
        from moeproxy.proxy_builder.build import BuildRequest, build_proxy
        from moeproxy.proxy_builder.layer_stats import load_statistics
        from moeproxy.proxy_builder.layer_stats import save_statistics as save_stats

        precomputed = _load_statistics(statistics, load_statistics) if statistics is not None else None

        result = build_proxy(
            BuildRequest(
                model,
                out,
                keep=keep,
                keep_ratio=keep_ratio,
                method=method,
                calibration=calibration,
                max_tokens=max_tokens,
                seq_len=seq_len,
                batch_size=batch_size,
                device=device,
                dtype=dtype,
                view_weights=view_weights,
                representative=representative,
                group_policy=group_policy,
                seed=seed,
                weighted_prototypes=weighted_prototypes,
                overwrite=overwrite,
            ),
            statistics=precomputed,
            progress=not quiet,
        )  # fmt: skip
        if save_statistics is not None and result.statistics:
            save_stats(result.statistics, save_statistics)
    except ProxyBuildError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    report = result.report
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
        return
    params = report["parameters"] or {}
    mem = report["memory"]
    typer.echo(
        f"proxy written to {result.out_dir}: {report['architecture']}, method {report['method']}, "
        f"{report['keep']} of {report['num_experts']} experts in {len(report['moe_layers'])} MoE layers"
    )
    if params:
        typer.echo(f"parameters {params['original']:,} -> {params['proxy']:,} ({params['ratio']:.3f}x)")
    if mem.get("accelerator_memory_ratio") is not None:
        typer.echo(
            f"estimated accelerator memory ratio {mem['accelerator_memory_ratio']:.3f}, "
            f"devices {mem['devices']['original']} -> {mem['devices']['proxy']}"
        )
    typer.echo(f"report: {Path(result.out_dir) / 'proxy_report.json'}")


def _load_statistics(path: Path, load):
    from moeproxy.proxy_builder.errors import CalibrationError

    try:
        return load(path)
    except (OSError, ValueError, KeyError) as exc:
        raise CalibrationError(f"cannot read routing statistics from {path}: {exc}") from None


def register(app: typer.Typer) -> None:
    app.command("build", help=_HELP)(build)
