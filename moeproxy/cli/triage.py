"""``moeproxy triage``: rank the likely fault classes of a run against the fingerprint library.

The run is a file (JSONL of ``{"step", "values"}`` lines as the reproduction traces, NaN/Infinity
literals allowed; or a JSON object with ``steps`` — the REST ingest body — and optional
``framework``), a past run in any format ``moeproxy import`` reads (:mod:`moeproxy.importers`:
trainer_state.json, verl's logs, CSV, Parquet, TensorBoard, MLflow, W&B), read the same way, or a run of
the service (``--run ID --url --token``), whose metrics are read over
HTTP (``GET /api/v1/runs/{id}/metrics``). ``--json`` prints the triage object of SPEC section 5.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from moeproxy.cli.fingerprints import LibraryOption, _fail, _load
from moeproxy.cli.imports import FORMAT_HELP


def read_run(file: str | Path | None, run_id: str | None, url: str | None, token: str | None,
             framework: str | None, format: str | None = None):
    """A RunMetrics from a file or from the service; user errors become a clean exit."""
    return read_run_and_settings(file, run_id, url, token, framework, format)[0]


def read_run_and_settings(file: str | Path | None, run_id: str | None, url: str | None, token: str | None,
                          framework: str | None, format: str | None = None):
    """``read_run``'s run, and the settings its config states (a run of the service: the config it
    was created with; a JSON run file: its ``config``, if it has one; otherwise the defaults)."""
    from moeproxy.signatures.canonical import RunMetrics, load_config, load_run
    from moeproxy.signatures.errors import InvalidRun
    from moeproxy.signatures.settings import DEFAULT_SETTINGS, settings_from_config

    if (file is None) == (run_id is None):
        raise _fail("give either a FILE or --run ID")
    if file is not None:
        from moeproxy.importers import is_uri

        if is_uri(file):
            return _read_imported(file, framework, format), DEFAULT_SETTINGS
        if not Path(file).exists():
            raise _fail(f"{file}: no such file")
        if format is not None or _imported_format(Path(file)):
            return _read_imported(file, framework, format), DEFAULT_SETTINGS
        try:
            run = load_run(Path(file), framework=framework)
        except InvalidRun as exc:
            raise _fail(str(exc)) from None
        return run, settings_from_config(load_config(Path(file)))
    import httpx

    from moeproxy.client import service_endpoint

    url, tok = service_endpoint(url, token)
    base = (url or _public_url()).rstrip("/")
    if not tok:
        raise _fail("--run needs --token (or MOEPROXY_TOKEN)")
    headers = {"Authorization": f"Bearer {tok}"}
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            meta = client.get(f"/api/v1/runs/{run_id}")
            if meta.status_code != 200:
                raise _fail(f"GET /api/v1/runs/{run_id}: {meta.status_code} {meta.text[:200]}")
            r = client.get(f"/api/v1/runs/{run_id}/metrics")
            if r.status_code != 200:
                raise _fail(f"GET /api/v1/runs/{run_id}/metrics: {r.status_code} {r.text[:200]}")
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach {base}: {exc}") from None
    info = meta.json()
    try:
        run = RunMetrics.from_columns(r.json()["metrics"], framework=framework or info.get("framework"),
                                      name=info.get("name"))
        return run, settings_from_config(info.get("config"))
    except (InvalidRun, KeyError) as exc:
        raise _fail(f"unexpected metrics answer: {exc}") from None


def _imported_format(file: Path) -> str | None:
    from moeproxy.importers import InvalidSource, detect_format

    try:
        return detect_format(file)
    except InvalidSource as exc:
        raise _fail(str(exc)) from None


def _read_imported(file: str | Path, framework: str | None, format: str | None):
    """A past run through the importers, as ``moeproxy import`` would store it."""
    from moeproxy.cli.imports import read_imported
    from moeproxy.signatures.canonical import RunMetrics

    run = read_imported(file, format)
    steps = [{"step": step, "values": values} for step, values in run.steps]
    return RunMetrics.from_steps(steps, framework=framework or run.framework, name=run.name)


def _public_url() -> str:
    from moeproxy.config import get_settings

    return get_settings().public_url


def triage_command(
    file: str | None = typer.Argument(
        None, help="Run file: JSONL of {step, values}, a JSON {steps: [...]}, or any `moeproxy import` source."),
    run_id: str | None = typer.Option(None, "--run", help="A run id of the service instead of a file."),
    url: str | None = typer.Option(None, "--url", help="Service URL (default MOEPROXY_URL or MOEPROXY_PUBLIC_URL)."),
    token: str | None = typer.Option(None, "--token", help="Bearer token (default MOEPROXY_TOKEN)."),
    framework: str | None = typer.Option(None, "--framework", help="verl, trl, openrlhf or mindspeed_rl."),
    format: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    library: Path | None = LibraryOption,
    top: int = typer.Option(5, "--top", help="Candidates to print (all with --json)."),
    details: bool = typer.Option(False, "--details", help="With --json: per-metric scores and change points."),
    as_json: bool = typer.Option(False, "--json", help="Print the SPEC section 5 triage object."),
    lora: bool = typer.Option(False, "--lora", help=(
        "The policy trains LoRA adapters: its learning rate is read against LoRA's range, 10-128x full "
        "fine-tuning's (a run of the service says so in its config).")),
    kl_coef: float | None = typer.Option(None, "--kl-coef", help=(
        "The run's KL-to-reference coefficient (TRL's beta, verl's kl_loss_coef, OpenRLHF's init_kl_coef) "
        "when the file does not log it; below 0, or at 1.0 and above, is a kl_misconfiguration (a run of the "
        "service says so in its config).")),
    learning_rate: float | None = typer.Option(None, "--learning-rate", min=0.0, help=(
        "The policy's learning rate as configured (the value after the warm-up) when the file carries no "
        "config: a logged LR that never reaches a tenth of it is an update omission.")),
) -> None:
    """Rank the likely fault classes of a run (healthy included) with evidence in plain words."""
    from dataclasses import replace

    from moeproxy.signatures.matching import triage

    run, settings = read_run_and_settings(file, run_id, url, token, framework, format)
    if lora:
        settings = replace(settings, lora=True)
    if kl_coef is not None:
        settings = replace(settings, kl_coef=kl_coef, kl_coef_max=kl_coef)
    if learning_rate is not None:
        settings = replace(settings, learning_rate=learning_rate)
    lib = _load(library)
    if not run.series:
        raise _fail("the run has no metrics")
    rid = (int(run_id) if run_id.isdigit() else run_id) if run_id is not None else run.name
    result = triage(run, lib, framework=framework, run_id=rid, settings=settings)
    if as_json:
        typer.echo(json.dumps(result.to_dict(details=details), indent=1))
        return
    typer.echo(f"run {result.run_id}: {result.verdict}")
    for i, c in enumerate(result.candidates[:top], start=1):
        typer.echo(f"{i}. {c.fault_class:<24} {c.family:<12} score {c.score:.2f}  {c.strength}")
        for line in c.evidence if i <= 3 else c.evidence[:1]:
            typer.echo(f"     - {line}")


def register(app: typer.Typer) -> None:
    app.command("triage", help="Rank the likely fault classes of a run against the fingerprint library.")(
        triage_command)
