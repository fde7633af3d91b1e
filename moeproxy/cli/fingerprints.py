"""``moeproxy fingerprints``: the fault-fingerprint library (list, show, validate, build, calibrate,
generate).

``generate`` is a thin wrapper over :func:`moeproxy.reproduction.campaign.run_campaign`: it runs a
campaign — fault entries × onsets × seeds, each job one GRPO run, every seed's healthy twin once —
on a proxy, resumably, then builds one fingerprint per entry from the traces and calibrates the
strong/weak threshold. ``build`` and ``calibrate`` do the last two steps on trace directories that
already exist. Only the signature engine (pure) is imported at the top; the engine is imported by
the command that runs it.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import typer

fingerprints_app = typer.Typer(help="Inspect, validate, build and generate the fault-fingerprint library.",
                               no_args_is_help=True)

LibraryOption = typer.Option(None, "--library", "-l",
                             help="Library file or directory (default: MOEPROXY_FINGERPRINTS, else the shipped one).")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def library_path(path: Path | None) -> Path:
    """``--library``, else ``MOEPROXY_FINGERPRINTS``, else the shipped library (the file itself)."""
    from moeproxy.config import get_settings
    from moeproxy.signatures.fingerprint import resolve_library_path

    return resolve_library_path(path if path is not None else get_settings().fingerprints)


def _load(path: Path | None):
    from moeproxy.signatures.errors import InvalidLibrary
    from moeproxy.signatures.fingerprint import load_library

    try:
        return load_library(library_path(path))
    except InvalidLibrary as exc:
        raise _fail(f"invalid fingerprint library: {exc}") from None


@fingerprints_app.command("list")
def list_(library: Path | None = LibraryOption, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the fingerprints of the library (class, family, variant, parameters, affected metrics)."""
    from moeproxy.signatures.fingerprint import describe

    lib = _load(library)
    rows = [describe(f) for f in lib.fingerprints]
    if as_json:
        typer.echo(json.dumps({"library": str(library_path(library)), "fingerprints": rows,
                               "calibration": lib.to_dict()["calibration"]}, indent=1))
        return
    typer.echo(f"{library_path(library)}: {len(rows)} fingerprints, {len(lib.fault_classes)} classes, "
               f"strong threshold {lib.calibration.strong_threshold}")
    for r in rows:
        aff = ", ".join(f"{m}{'+' if d > 0 else '-' if d < 0 else '~'}" for m, d in r["affected"].items())
        typer.echo(f"  {r['id']:<60} {r['family']:<12} {aff}")


@fingerprints_app.command("show")
def show(fingerprint: str = typer.Argument(..., help="Fingerprint id, or a fault class (shows all of it)."),
         library: Path | None = LibraryOption, as_json: bool = typer.Option(False, "--json"),
         traces: bool = typer.Option(False, "--traces", help="Include the effect traces.")) -> None:
    """Show one fingerprint (or every fingerprint of a class): expectations per metric and provenance."""
    from moeproxy.signatures.errors import UnknownFaultClass

    lib = _load(library)
    try:
        fps = lib.of_class(fingerprint) if fingerprint in lib.fault_classes else (lib.get(fingerprint),)
    except UnknownFaultClass as exc:
        raise _fail(str(exc)) from None
    docs = []
    for f in fps:
        d = f.to_dict()
        if not traces:
            for m in d["metrics"].values():
                m["traces"] = len(m["traces"])
        docs.append(d)
    if as_json:
        typer.echo(json.dumps(docs if len(docs) > 1 else docs[0], indent=1))
        return
    for d in docs:
        typer.echo(f"{d['id']}  ({d['fault_class']}, {d['family']}, variant {d['variant']})")
        typer.echo(f"  params: {json.dumps(d['params'])}")
        prov = d["provenance"]
        typer.echo(f"  provenance: source={prov.get('source')} model={prov.get('model')} seeds={prov.get('seeds')}")
        for m, e in d["metrics"].items():
            if e["role"] != "affected":
                continue
            lag = "" if e["onset_lag"] is None else f" lag {e['onset_lag']:+.0f}"
            ratio = "" if e["log10_ratio"] is None else f" ×{10 ** e['log10_ratio']:.3g}"
            typer.echo(f"  {m:<30} {e['source']:<36} dir {e['direction']:+d} trend {e['trend']:+d}{lag}{ratio}"
                       f" nonfinite {e['nonfinite_rate']:.0%} traces {e['traces'] if not traces else len(e['traces'])}")


@fingerprints_app.command("validate")
def validate(path: Path = typer.Argument(..., help="Library file or directory to check."),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Check a library file against the format (docs/fingerprints.md); names the first bad field."""
    lib = _load(path)
    summary = {"valid": True, "fingerprints": len(lib.fingerprints), "classes": list(lib.fault_classes),
               "format_version": lib.format_version}
    typer.echo(json.dumps(summary) if as_json else
               f"valid: {summary['fingerprints']} fingerprints of {len(summary['classes'])} classes "
               f"(format {lib.format_version})")


@fingerprints_app.command("build")
def build(trace_dirs: list[Path] = typer.Argument(..., help="Reproduction output directories (manifest.json + traces)."),
          out: Path = typer.Option(..., "--out", help="Directory to write fingerprints.json and manifest.json into."),
          heldout: list[Path] = typer.Option([], "--heldout", help="Trace directories for calibrating the threshold."),
          source: str = typer.Option("proxy", "--source", help="Provenance source: proxy, original or synthetic."),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Build a library from existing reproduction traces (one fingerprint per directory)."""
    # A healthy directory among the inputs supplies the twins of fault directories run --no-healthy.
    healthy = next((d for d in trace_dirs if _fault_class_of(d) == "healthy"), None)
    held_healthy = next((d for d in heldout if _fault_class_of(d) == "healthy"), None)
    twins = {k: v for k, v in (("lib", healthy), ("heldout", held_healthy)) if v is not None}
    report = _build_library(trace_dirs, out, heldout, source=source, command=["moeproxy", *sys.argv[1:]],
                            twins=twins)
    typer.echo(json.dumps(report, indent=1) if as_json else
               f"wrote {report['library']}: {report['fingerprints']} fingerprints, "
               f"strong threshold {report['strong_threshold']}")


def _build_library(trace_dirs, out: Path, heldout, *, source: str, command, campaign: dict | None = None,
                   twins: dict[str, Path] | None = None, view: str = "verl") -> dict:
    from rich.progress import track

    from moeproxy.signatures.build import fingerprint_from_trace_set, load_trace_dir
    from moeproxy.signatures.calibrate import LabelledRun, calibrate
    from moeproxy.signatures.errors import SignatureError
    from moeproxy.signatures.fingerprint import FingerprintLibrary, save_library

    fps = []
    try:
        lib_twins = twins.get("lib") if twins else None
        for d in track(list(trace_dirs), description="building fingerprints", transient=True):
            fps.append(fingerprint_from_trace_set(load_trace_dir(d, twins_from=lib_twins, view=view), source=source))
        lib = FingerprintLibrary(tuple(fps), generator={"command": " ".join(map(shlex.quote, command)),
                                                         "created": datetime.now(UTC).isoformat()})
        cal_report = None
        if not heldout:
            from moeproxy.signatures.build import load_trace_dir as _load
            from moeproxy.signatures.calibrate import cross_validated_calibration

            sets = [_load(d, twins_from=lib_twins, view=view) for d in trace_dirs]
            if len({s for ts in sets for s in ts.fault_runs}) >= 2:
                cal, cal_report = cross_validated_calibration(sets)
                lib = lib.with_calibration(cal)
        if heldout:
            runs = []
            held_twins = twins.get("heldout") if twins else None
            seen_healthy: set[int] = set()
            for d in heldout:
                ts = load_trace_dir(d, twins_from=held_twins, view=view)
                runs += [LabelledRun(ts.fault_class, r) for r in ts.fault_runs.values()]
                if ts.fault_class == "healthy":
                    seen_healthy.update(ts.fault_runs)
                for seed, r in ts.healthy_runs.items():
                    if ts.fault_class != "healthy" and seed not in seen_healthy:
                        seen_healthy.add(seed)
                        runs.append(LabelledRun("healthy", r))
            lib, cal_report = calibrate(lib, runs)
    except SignatureError as exc:
        raise _fail(str(exc)) from None
    manifest = {
        "generated": datetime.now(UTC).isoformat(),
        "command": " ".join(map(shlex.quote, command)),
        "source": source,
        "trace_dirs": [str(d) for d in trace_dirs],
        "heldout_dirs": [str(d) for d in heldout],
        "view": view,
        "calibration": None if cal_report is None else {
            "threshold": cal_report["threshold"], "balanced_accuracy": cal_report["balanced_accuracy"],
            "method": lib.calibration.method, "n": lib.calibration.n_heldout},
        "campaign": campaign,
    }
    target = save_library(lib, out, manifest=manifest)
    return {"library": str(target), "fingerprints": len(lib.fingerprints),
            "strong_threshold": lib.calibration.strong_threshold, "calibration": cal_report}


@fingerprints_app.command("calibrate")
def calibrate_cmd(heldout: list[Path] = typer.Argument(..., help="Held-out reproduction trace directories."),
                  library: Path | None = LibraryOption,
                  out: Path | None = typer.Option(None, "--out", help="Where to write (default: in place)."),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Calibrate the strong/weak threshold on held-out traces (docs/signatures.md)."""
    from moeproxy.signatures.build import load_trace_dir
    from moeproxy.signatures.calibrate import LabelledRun, calibrate
    from moeproxy.signatures.fingerprint import save_library

    lib = _load(library)
    runs = []
    for d in heldout:
        ts = load_trace_dir(d)
        runs += [LabelledRun(ts.fault_class, r) for r in ts.fault_runs.values()]
    lib, report = calibrate(lib, runs)
    target = save_library(lib, out or library_path(library))
    typer.echo(json.dumps(report, indent=1) if as_json else
               f"{target}: strong threshold {report['threshold']:.3f} "
               f"(balanced accuracy {report['balanced_accuracy']:.3f} on {len(runs)} runs)")


@fingerprints_app.command("generate")
def generate(
    model: str = typer.Option(..., "--model", help="Proxy checkpoint directory (or a reference model name) to reproduce faults on."),
    out: Path = typer.Option(..., "--out", help="Library directory to write."),
    work: Path = typer.Option(Path("runs/campaign"), "--work",
                              help="Campaign directory: manifest.json and the traces. A stopped campaign resumes here."),
    campaign_file: Path | None = typer.Option(None, "--campaign", help="Campaign JSON (default: every variant, campaign v2)."),
    classes: str | None = typer.Option(None, "--classes", help="Comma-separated subset of fault classes."),
    steps: int | None = typer.Option(None, "--steps", help="RL steps per run (overrides the campaign)."),
    seeds: str | None = typer.Option(None, "--seeds", help="Library seeds, e.g. 0,1 (overrides the campaign)."),
    heldout_seeds: str | None = typer.Option(None, "--heldout-seeds", help="Calibration seeds, e.g. 100,101."),
    engine: list[str] = typer.Option([], "--engine", help="Engine option key=value (repeatable), over the campaign's."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or npu (passed to the engine)."),
    backend: str = typer.Option("local", "--backend", help="Campaign backend (moeproxy.reproduction.campaign)."),
    view: str = typer.Option("verl", "--view", help="Framework view the library is built from: verl, trl, openrlhf."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run a fingerprint campaign (classes × parameters × onsets × seeds) with the reproduction engine
    on a proxy, then build and calibrate the library from its traces. Resumable: finished jobs in
    --work are never run again."""
    from moeproxy.extras import MissingExtra, require

    try:
        require("ml", "fingerprints generate")
    except MissingExtra as exc:
        raise _fail(str(exc)) from None
    from moeproxy.cli.reproduce import resolve_model
    from moeproxy.reproduction.campaign import CampaignError, default_campaign, load_campaign, run_campaign
    from moeproxy.reproduction.config import EngineConfig
    from moeproxy.reproduction.errors import ReproductionError

    try:
        campaign = load_campaign(campaign_file) if campaign_file else default_campaign()
        campaign = campaign.override(
            classes=None if classes is None else [c.strip() for c in classes.split(",") if c.strip()],
            steps=steps, seeds=_ints(seeds), heldout_seeds=_ints(heldout_seeds))
        model_dir, defaults = resolve_model(model)
        # The model's own RL setting, then the campaign's engine options, then --engine.
        config = EngineConfig.from_dict({**EngineConfig(**defaults).to_dict(), **campaign.engine})
        config = config.with_strings(_pairs(engine))
        result = run_campaign(model_dir, campaign.jobs(), config, work, backend=backend, device=device,
                              progress=not quiet)
    except (CampaignError, ReproductionError) as exc:
        raise _fail(str(exc)) from None
    if result.failed:
        for job_id, error in result.failed.items():
            typer.echo(f"failed: {job_id}: {error}", err=True)
        typer.echo(f"error: {len(result.failed)} job(s) failed; {work}/manifest.json has them. "
                   "Run the same command again to retry them (finished jobs are kept).", err=True)
        raise typer.Exit(code=1)
    twins = {"lib": work / "library" / "healthy", "heldout": work / "heldout" / "healthy"}
    manifest_file = work / "manifest.json"
    report = _build_library(
        result.entry_dirs("library"), out, result.entry_dirs("heldout"), source="proxy",
        command=["moeproxy", *sys.argv[1:]], twins={k: v for k, v in twins.items() if v.is_dir()}, view=view,
        campaign={**campaign.to_dict(), "model": str(model_dir), "device": device, "backend": backend,
                  "engine": config.to_dict(), "manifest": str(manifest_file),
                  "manifest_sha256": hashlib.sha256(manifest_file.read_bytes()).hexdigest(),
                  "jobs_run": len(result.ran), "jobs_reused": len(result.skipped)})
    typer.echo(json.dumps(report, indent=1) if as_json else
               f"wrote {report['library']}: {report['fingerprints']} fingerprints, "
               f"strong threshold {report['strong_threshold']} ({len(result.ran)} runs made, "
               f"{len(result.skipped)} reused from {work})")


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _fail(f"--engine {item!r} is not of the form key=value")
        out[key.strip()] = value.strip()
    return out


def _fault_class_of(d: Path) -> str | None:
    try:
        fault = json.loads((d / "manifest.json").read_text()).get("fault")
    except (OSError, ValueError):
        return None
    return fault.get("class") if isinstance(fault, dict) else fault


def _ints(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise _fail(f"expected comma-separated integers, got {text!r}") from None


def register(app: typer.Typer) -> None:
    app.add_typer(fingerprints_app, name="fingerprints")
