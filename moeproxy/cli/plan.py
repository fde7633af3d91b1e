"""``moeproxy plan``: accelerators an RL step needs for a model and for its proxy (issue 9).

Torch-free: the planner reads config.json only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

_HELP = (
    "Count parameters and plan memory and devices for one colocated RL step of a MoE model "
    "and of its proxy with fewer routed experts. Give one of --model/--config/--preset and one "
    "of --keep/--keep-ratio (or --all-presets with --keep-ratio)."
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def _load(model: Path | None, config: Path | None, preset: str | None) -> tuple[str, dict[str, Any]]:
    from moeproxy.proxy_builder.plan import load_config_file, load_preset

    given = [x for x in (model, config, preset) if x is not None]
    if len(given) != 1:
        _fail("give exactly one of --model DIR, --config FILE or --preset NAME (see --list-presets)")
    try:
        if preset is not None:
            return preset, load_preset(preset)
        path = model if model is not None else config
        return str(path), load_config_file(path)
    except FileNotFoundError as exc:
        _fail(f"no config.json at {exc.filename}")
    except json.JSONDecodeError as exc:
        _fail(f"config is not valid JSON: {exc}")
    raise AssertionError("unreachable")


def _gb(x: float) -> str:
    return f"{x:,.1f}"


def _print_table(name: str, result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    o, p, s = result["original"], result["proxy"], result["saving"]
    console = Console()
    title = (
        f"{name} ({result['model_type']}): keep {p['experts_per_layer']} of "
        f"{o['experts_per_layer']} routed experts per MoE layer, top-{result['top_k']}"
    )
    params = Table(title=title + " — parameters")
    params.add_column("component")
    params.add_column("original", justify="right")
    params.add_column("proxy", justify="right")
    for key, value in o["parameters"].items():
        params.add_row(key, f"{value:,}", f"{p['parameters'][key]:,}")
    console.print(params)

    mem = Table(title="memory of one RL step (GB)")
    mem.add_column("component")
    mem.add_column("original", justify="right")
    mem.add_column("proxy", justify="right")
    for key, value in o["memory_gb"].items():
        mem.add_row(key, _gb(value), _gb(p["memory_gb"][key]))
    mem.add_row("devices (before rounding)", f"{o['devices_raw']:.2f}", f"{p['devices_raw']:.2f}")
    mem.add_row("devices", str(o["devices"]), str(p["devices"]), style="bold")
    mem.add_row("expert-parallel degree", str(o["expert_parallel"]), str(p["expert_parallel"]))
    console.print(mem)
    a = result["assumptions"]
    console.print(
        f"saving: {s['devices_ratio']}x fewer devices ({s['devices_saved_fraction']:.1%}), "
        f"memory {s['memory_ratio']}x, parameters {s['parameter_ratio']}x  "
        f"[{a['device_memory_gb']:g} GB devices, {a['usable_memory_fraction']:.0%} usable, "
        f"seq_len {a['seq_len']}, rollout batch {a['rollout_batch']}]"
    )


def markdown_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """The docs/planner.md table: one row per (preset, plan dict)."""
    lines = [
        (
            "| preset | experts kept | params original (B) | params proxy (B) | memory original (GB) "
            "| memory proxy (GB) | devices original | devices proxy | device saving |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        o, p, s = r["original"], r["proxy"], r["saving"]
        lines.append(
            f"| {name} | {p['experts_per_layer']} / {o['experts_per_layer']} "
            f"| {o['parameters_billion']:.2f} | {p['parameters_billion']:.2f} "
            f"| {o['memory_gb']['total']:,.0f} | {p['memory_gb']['total']:,.0f} "
            f"| {o['devices']} ({o['devices_raw']:.1f}) | {p['devices']} ({p['devices_raw']:.1f}) "
            f"| {s['devices_ratio']:g}x ({s['devices_saved_fraction']:.1%}) |"
        )
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("plan", help=_HELP)
    def plan_command(
        model: Annotated[
            Path | None, typer.Option("--model", help="Checkpoint directory with a config.json.")
        ] = None,
        config: Annotated[Path | None, typer.Option("--config", help="A config.json file.")] = None,
        preset: Annotated[
            str | None, typer.Option("--preset", help="A shipped preset (see --list-presets).")
        ] = None,
        keep: Annotated[int | None, typer.Option("--keep", help="Routed experts kept per MoE layer.")] = None,
        keep_ratio: Annotated[
            float | None, typer.Option("--keep-ratio", help="Fraction of routed experts kept, (0, 1].")
        ] = None,
        device_memory_gb: Annotated[
            float | None, typer.Option("--device-memory-gb", help="Memory of one device [64].")
        ] = None,
        seq_len: Annotated[
            int | None, typer.Option("--seq-len", help="Prompt + response tokens per sequence [4096].")
        ] = None,
        batch: Annotated[
            int | None,
            typer.Option("--batch", help="Sequences in the rollout engine's KV cache at once [256]."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
        list_presets: Annotated[
            bool, typer.Option("--list-presets", help="List the shipped presets and exit.")
        ] = False,
        all_presets: Annotated[
            bool, typer.Option("--all-presets", help="Plan every preset (with --keep-ratio).")
        ] = False,
        markdown: Annotated[
            bool, typer.Option("--markdown", help="With --all-presets: print a Markdown table.")
        ] = False,
    ) -> None:
        from moeproxy.proxy_builder.plan import PlanAssumptions, load_preset, plan, preset_names
        from moeproxy.proxy_builder.plan_errors import PlanError

        if list_presets:
            for name in preset_names():
                source = load_preset(name).get("_source", "")
                typer.echo(f"{name}\t{source}")
            return
        overrides = {
            k: v
            for k, v in {
                "device_memory_gb": device_memory_gb,
                "seq_len": seq_len,
                "rollout_batch": batch,
            }.items()
            if v is not None
        }
        try:
            assumptions = replace(PlanAssumptions(), **overrides)
            if all_presets:
                if keep_ratio is None or keep is not None:
                    _fail("--all-presets needs --keep-ratio (expert counts differ between presets)")
                rows = [
                    (n, plan(load_preset(n), keep_ratio=keep_ratio, assumptions=assumptions).to_dict())
                    for n in preset_names()
                ]
                if as_json:
                    typer.echo(json.dumps(dict(rows), indent=2))
                elif markdown:
                    typer.echo(markdown_table(rows))
                else:
                    for name, r in rows:
                        _print_table(name, r)
                return
            name, cfg = _load(model, config, preset)
            result = plan(cfg, keep=keep, keep_ratio=keep_ratio, assumptions=assumptions).to_dict()
        except PlanError as exc:
            _fail(str(exc))
        except KeyError as exc:
            _fail(f"config lacks the field {exc.args[0]!r} the planner needs for this architecture")
        if as_json:
            typer.echo(json.dumps(result, indent=2))
        elif markdown:
            typer.echo(markdown_table([(name, result)]))
        else:
            _print_table(name, result)
