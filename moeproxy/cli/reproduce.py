"""``moeproxy reproduce``: inject a fault into GRPO runs of a model and record its metric signature.

Runs the fault and a healthy twin with the same seeds and writes ``OUT/manifest.json`` plus one
trace per run (``OUT/<fault>-seed<k>.jsonl``, ``OUT/healthy-seed<k>.jsonl``).  ``--manifest``
runs a written manifest again.  torch/transformers are imported inside the command.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import typer


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=code)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"{what} {item!r} is not of the form key=value")
        out[key.strip()] = value.strip()
    return out


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        _fail(f"--seeds {text!r}: expected integers separated by commas, e.g. 0,1")
    if not seeds:
        _fail("--seeds: at least one seed")
    return seeds


def resolve_model(model: str) -> tuple[Path, dict]:
    """The checkpoint directory, and the engine defaults of a reference model named by name."""
    path = Path(model)
    if path.is_dir():
        return path, {}
    from moeproxy.reproduction.reference import (
        CheckpointMissing,
        UnknownReferenceModel,
        reference_model_path,
        rl_engine_defaults,
    )

    try:  # a shipped reference model by name
        return Path(reference_model_path(model)), rl_engine_defaults(model)
    except UnknownReferenceModel:
        _fail(f"--model {model!r}: not a directory and not a known reference model name")
    except CheckpointMissing as exc:
        _fail(str(exc))


def _progress_line(label: str, seed: int, step: int, steps: int, v: dict[str, float]) -> str:
    def f(name: str) -> str:
        x = v.get(name, float("nan"))
        return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.4g}"

    return (
        f"[{label} seed {seed}] step {step + 1}/{steps} score={f('critic/score/mean')} "
        f"ppo_kl={f('actor/ppo_kl')} kl_loss={f('actor/kl_loss')} grad_norm={f('actor/grad_norm')} "
        f"probs_diff={f('training/rollout_probs_diff_mean')} route_agree={f('moe/routing_agreement')} "
        f"({f('timing_s/step')} s)"
    )


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
    def reproduce(
        model: str = typer.Option(None, "--model", help="Checkpoint directory (or a reference model name)."),
        fault: str = typer.Option(None, "--fault", help="Fault class (see docs/faults.md), e.g. rollout_logp_precision."),
        variant: str = typer.Option(None, "--variant", help="Variant of the fault class (default: its first)."),
        param: list[str] = typer.Option([], "--param", help="Fault parameter key=value (repeatable): onset, magnitude, ..."),
        engine: list[str] = typer.Option([], "--engine", help="Engine option key=value (repeatable): lr, group_size, ..."),
        steps: int = typer.Option(20, "--steps", min=1, help="RL steps per run."),
        seeds: str = typer.Option("0", "--seeds", help="Comma-separated seeds; each runs the fault and its healthy twin."),
        out: Path = typer.Option(None, "--out", help="Output directory (manifest.json + traces)."),
        device: str = typer.Option("cpu", "--device", help="cpu, cuda[:N], npu[:N] or auto."),
        no_healthy: bool = typer.Option(False, "--no-healthy", help="Skip the healthy twin."),
        backend: str = typer.Option("local", "--backend", help="Execution backend."),
        manifest: Path = typer.Option(None, "--manifest", help="Run a written manifest.json again."),
        post: str = typer.Option(None, "--post", help="Service URL to stream the metrics to live."),
        token: str = typer.Option(None, "--token", help="Bearer token for --post."),
        view: str = typer.Option("verl", "--view", help="Metric names as this framework logs them: "
                                 "verl, trl, openrlhf, or raw (everything the engine recorded)."),
        as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON on stdout."),
        quiet: bool = typer.Option(False, "--quiet", help="No per-step progress lines."),
    ) -> None:
        """Reproduce a fault on a model: the fault run and a healthy twin per seed, with verl's metrics."""
        from moeproxy.reproduction.backend import ModelSpec, get_backend, load_manifest
        from moeproxy.reproduction.config import EngineConfig
        from moeproxy.reproduction.errors import ReproductionError
        from moeproxy.reproduction.faults import FaultSpec

        if post and not token:
            _fail("--post needs --token (create one with: moeproxy token create --project NAME)")
        try:
            if manifest is not None:
                if model or fault:
                    _fail("--manifest replaces --model/--fault; give one or the other")
                req = load_manifest(manifest)
                model_spec, spec, seed_list, n_steps = req.model, req.fault, list(req.seeds), req.steps
                config, device_s, backend_s, with_healthy = req.config, req.device, req.backend, req.with_healthy
                view = req.view
                out_dir = out or manifest.parent
            else:
                if not model or not fault:
                    _fail("give --model and --fault (or --manifest)")
                if out is None:
                    _fail("--out DIR is required")
                model_dir, defaults = resolve_model(model)
                spec = FaultSpec(fault, variant, _pairs(param, "--param"))
                # The reference model's own RL setting first, then what --engine says.
                config = EngineConfig(**defaults).with_strings(_pairs(engine, "--engine"))
                if defaults:
                    shown = ", ".join(f"{k}={','.join(v) if isinstance(v, tuple) else v}" for k, v in defaults.items())
                    typer.echo(f"{model}: engine defaults {shown} (override with --engine)", err=True)
                model_spec = ModelSpec(str(model_dir))
                seed_list, n_steps, device_s, backend_s = _parse_seeds(seeds), steps, device, backend
                with_healthy, out_dir = not no_healthy, out
            impl = get_backend(backend_s)
            from moeproxy.reproduction.errors import UnknownView
            from moeproxy.reproduction.views import VIEWS

            if view not in VIEWS:
                raise UnknownView(f"--view {view!r}: known views are {', '.join(VIEWS)}")
        except ReproductionError as exc:
            _fail(str(exc))
        project_values, step_offset = VIEWS[view]

        clients: dict[tuple[str, int], object] = {}

        def client_for(label: str, seed: int):
            if not post:
                return None
            if (label, seed) not in clients:
                from moeproxy.client import MetricsClient

                name = f"reproduce/{model_spec.label}/{spec.fault_class}/{spec.variant}/{label}-seed{seed}"
                clients[(label, seed)] = MetricsClient(
                    post, token, name, framework=None if view == "raw" else view, model=model_spec.label,
                    config={"fault": spec.to_dict(), "seed": seed, "role": label},
                )
            return clients[(label, seed)]

        def on_step(label: str, seed: int, step: int, values: dict[str, float]) -> None:
            if not quiet:
                typer.echo(_progress_line(label, seed, step, n_steps, values), err=True)
            client = client_for(label, seed)
            if client is not None:
                client.log(step + step_offset, project_values(values))

        status = "failed"
        try:
            result = impl.run(
                model_spec, spec, seed_list, n_steps, config=config, device=device_s,
                out_dir=out_dir, with_healthy=with_healthy, on_step=on_step, view=view,
            )
            status = "finished"
        except ReproductionError as exc:
            _fail(str(exc))
        finally:
            for c in clients.values():
                c.close(status=status)
        if as_json:
            sys.stdout.write(json.dumps(result.manifest, indent=2, allow_nan=True) + "\n")
        else:
            cost = result.manifest["cost"]
            typer.echo(
                f"wrote {out_dir}/manifest.json and {len(result.traces)} trace(s); "
                f"wall {cost['wall_time_s']:.1f} s, median step {cost['step_time_s_median']:.3f} s, "
                f"peak memory {cost['peak_memory_mb']:.0f} MB"
            )
