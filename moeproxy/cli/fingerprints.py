"""``moeproxy fingerprints``: the fault-fingerprint library (list, show, validate, build, calibrate,
generate).

``generate`` runs a campaign — fault classes × parameter sets × seeds — with the reproduction
engine on a reference proxy (each job is one ``moeproxy reproduce`` run: the fault and its healthy
twin with the same seeds), then builds one fingerprint per (class, parameters) from the traces and
calibrates the strong/weak threshold on held-out seeds. ``build`` and ``calibrate`` do the last two
steps on trace directories that already exist. Only the signature engine (pure) is imported at the
top; the engine runs in its own process.
"""

from __future__ import annotations

import json
import shlex
import subprocess
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
                   twins: dict[str, Path] | None = None) -> dict:
    from rich.progress import track

    from moeproxy.signatures.build import fingerprint_from_trace_set, load_trace_dir
    from moeproxy.signatures.calibrate import LabelledRun, calibrate
    from moeproxy.signatures.errors import SignatureError
    from moeproxy.signatures.fingerprint import FingerprintLibrary, save_library

    fps = []
    try:
        lib_twins = twins.get("lib") if twins else None
        for d in track(list(trace_dirs), description="building fingerprints", transient=True):
            fps.append(fingerprint_from_trace_set(load_trace_dir(d, twins_from=lib_twins), source=source))
        lib = FingerprintLibrary(tuple(fps), generator={"command": " ".join(map(shlex.quote, command)),
                                                         "created": datetime.now(UTC).isoformat()})
        cal_report = None
        if not heldout:
            from moeproxy.signatures.build import load_trace_dir as _load
            from moeproxy.signatures.calibrate import cross_validated_calibration

            sets = [_load(d, twins_from=lib_twins) for d in trace_dirs]
            if len({s for ts in sets for s in ts.fault_runs}) >= 2:
                cal, cal_report = cross_validated_calibration(sets)
                lib = lib.with_calibration(cal)
        if heldout:
            runs = []
            held_twins = twins.get("heldout") if twins else None
            seen_healthy: set[int] = set()
            for d in heldout:
                ts = load_trace_dir(d, twins_from=held_twins)
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
    model: Path = typer.Option(..., "--model", help="Reference proxy checkpoint to reproduce faults on."),
    out: Path = typer.Option(..., "--out", help="Library directory to write."),
    work: Path = typer.Option(Path("runs/campaign"), "--work", help="Where the reproduction traces go."),
    campaign_file: Path | None = typer.Option(None, "--campaign", help="Campaign JSON (default: the built-in one)."),
    classes: str | None = typer.Option(None, "--classes", help="Comma-separated subset of fault classes."),
    steps: int | None = typer.Option(None, "--steps", help="RL steps per run (overrides the campaign)."),
    seeds: str | None = typer.Option(None, "--seeds", help="Library seeds, e.g. 0,1,2 (overrides the campaign)."),
    heldout_seeds: str | None = typer.Option(None, "--heldout-seeds", help="Calibration seeds, e.g. 100,101."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or npu (passed to the engine)."),
    extra: list[str] = typer.Option([], "--reproduce-arg", help="Extra argument for `moeproxy reproduce`."),
    skip_existing: bool = typer.Option(True, "--skip-existing/--rerun", help="Reuse trace dirs that are complete."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run a fingerprint campaign (classes × parameters × seeds) with the reproduction engine on a
    proxy, then build and calibrate the library from the traces."""
    from moeproxy.extras import MissingExtra, require
    from moeproxy.signatures.campaign import CampaignError, default_campaign, load_campaign

    try:
        # Each job is a `moeproxy reproduce` process: without torch every one of them would fail.
        require("ml", "fingerprints generate")
    except MissingExtra as exc:
        raise _fail(str(exc)) from None
    try:
        campaign = load_campaign(campaign_file) if campaign_file else default_campaign()
        campaign = campaign.override(
            classes=None if classes is None else [c.strip() for c in classes.split(",") if c.strip()],
            steps=steps, seeds=_ints(seeds), heldout_seeds=_ints(heldout_seeds))
    except CampaignError as exc:
        raise _fail(str(exc)) from None
    # The healthy twin of a seed is the same run for every fault (the engine is deterministic on
    # CPU for a seed), so the campaign runs it once per seed and the fault jobs skip theirs.
    jobs = [j for j in campaign.jobs() if j.fault_class != "healthy"]
    from moeproxy.signatures.campaign import CampaignJob

    healthy = CampaignJob("healthy")
    lib_dirs, held_dirs = [], []
    twins: dict[str, Path] = {}
    plan = [(healthy, "lib", campaign.seeds), (healthy, "heldout", campaign.heldout_seeds)]
    plan += [(j, tag, seeds_) for j in jobs for tag, seeds_ in (("lib", campaign.seeds),
                                                                 ("heldout", campaign.heldout_seeds))]
    for i, (job, tag, seeds_) in enumerate(plan, start=1):
        if not seeds_:
            continue
        d = work / tag / job.slug
        if job.fault_class == "healthy":
            twins[tag] = d
        (lib_dirs if tag == "lib" else held_dirs).append(d)
        if skip_existing and _complete(d, job.fault_class, seeds_):
            continue
        params = dict(job.params)
        variant = params.pop("variant", None)
        cmd = [sys.executable, "-c", "from moeproxy.cli import main; main()", "reproduce", "--model", str(model),
               "--fault", job.fault_class, *(["--variant", str(variant)] if variant else []),
               *[a for k, v in params.items() for a in ("--param", f"{k}={v}")],
               "--steps", str(campaign.steps), "--seeds", ",".join(map(str, seeds_)), "--device", device,
               "--no-healthy", "--quiet", "--out", str(d), *extra]
        typer.echo(f"[{i}/{len(plan)}] {tag} {job.slug}: {' '.join(map(shlex.quote, cmd[3:]))}", err=True)
        rc = subprocess.call(cmd)
        if rc != 0:
            raise _fail(f"`moeproxy reproduce` failed (exit {rc}) for {job.slug}")
    report = _build_library(lib_dirs, out, held_dirs, source="proxy", command=["moeproxy", *sys.argv[1:]], twins=twins,
                            campaign={**campaign.to_dict(), "model": str(model), "device": device})
    typer.echo(json.dumps(report, indent=1) if as_json else
               f"wrote {report['library']}: {report['fingerprints']} fingerprints, "
               f"strong threshold {report['strong_threshold']}")


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


def _complete(d: Path, fault_class: str, seeds: list[int]) -> bool:
    if not (d / "manifest.json").exists():
        return False
    name = fault_class if fault_class != "healthy" else "healthy"
    return all((d / f"{name}-seed{s}.jsonl").exists() for s in seeds)


def register(app: typer.Typer) -> None:
    app.add_typer(fingerprints_app, name="fingerprints")
