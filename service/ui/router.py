"""The pages (not part of the REST API: excluded from the OpenAPI schema)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qsl, urlencode

import plotly
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from moeproxy.reproduction.catalogue import FAMILIES, FAULT_CLASSES
from moeproxy.service.aliases import repository as aliases
from moeproxy.service.auth import SessionDep
from moeproxy.service.metrics import repository as metrics
from moeproxy.service.runs.models import RunStatus
from moeproxy.service.triage import repository as triage_repo
from moeproxy.service.triage.errors import LibraryUnavailable
from moeproxy.service.triage.live import get_engine
from moeproxy.service.triage.service import evaluate_run
from moeproxy.service.ui import auth, plots, queries
from moeproxy.service.ui.reproduction import reproduction_overlay
from moeproxy.signatures.levels import SOURCES

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

# Static files by name: the app's own, and plotly.js from the installed plotly package (no CDN).
STATIC_FILES: dict[str, tuple[Path, str]] = {
    "plotly.min.js": (
        Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js",
        "text/javascript",
    ),
    "ui.js": (HERE / "static" / "ui.js", "text/javascript"),
    "login.js": (HERE / "static" / "login.js", "text/javascript"),
    "ui.css": (HERE / "static" / "ui.css", "text/css"),
}

LIVE_POLL_S = 5
PER_PAGE_MAX = 1000


router = APIRouter(include_in_schema=False)


def _viewer(request: Request, session) -> auth.Viewer | None:
    """Who is looking, or None when nobody is logged in (a read: it never writes)."""
    if auth.is_public(request):
        return auth.PUBLIC
    return auth.viewer_of(session, request.cookies.get(auth.COOKIE))


def _to_login(request: Request) -> Response:
    # A ``token`` parameter is dropped, not carried into ``next``: pages take no secrets in URLs
    # (they would be written to every access log on the way).
    query = [(k, v) for k, v in parse_qsl(request.url.query, keep_blank_values=True) if k != "token"]
    here = request.url.path + (f"?{urlencode(query)}" if query else "")
    return RedirectResponse("/login?" + urlencode({"next": here}), status_code=303)


def _set_cookie(response: Response, request: Request, secret: str) -> None:
    response.set_cookie(
        auth.COOKIE,
        secret,
        max_age=int(auth.SESSION_MAX_AGE.total_seconds()),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def _same_origin(request: Request) -> bool:
    # A form POST from another site carries its own Origin; the Lax cookie already stays behind,
    # this refuses such a POST even from a browser that sends it.
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


def _fmt_time(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: datetime | None) -> str:
    if value is None:
        return "never"
    seconds = (datetime.now(UTC) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{max(0, int(seconds))} s ago"


templates.env.filters["time"] = _fmt_time
templates.env.filters["ago"] = _ago
templates.env.globals["FAMILIES"] = FAMILIES
templates.env.globals["SOURCES"] = SOURCES  # each whole-run finding's source, in the page's tooltip


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC_FILES:
        return Response("not found", status_code=404)
    path, media_type = STATIC_FILES[name]
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


def _login_page(request: Request, target: str, error: str | None, status_code: int = 200, headers=None):
    return templates.TemplateResponse(
        request,
        "login.html",
        {"next": target, "error": error, "viewer": None, "operator_login": auth.operator_token(request) is not None},
        status_code=status_code,
        headers=headers,
    )


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> Response:
    if auth.is_public(request):
        return RedirectResponse(auth.safe_next(next), status_code=303)
    return _login_page(request, auth.safe_next(next), None)


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    token: Annotated[str, Form(max_length=512)],
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> Response:
    target = auth.safe_next(next)
    if auth.is_public(request):
        return RedirectResponse(target, status_code=303)
    failures = request.app.state.login_failures
    key = auth.client_key(request)
    if wait := failures.retry_after(key):
        return _login_page(
            request, target, f"too many failed logins from this address: try again in {wait} s",
            status_code=429, headers={"Retry-After": str(wait)},
        )
    secret = auth.log_in(request, session, token)
    if secret is None:
        # Not cleared by a later success: a valid token of one project must not reset the count
        # of guesses at another's.
        failures.record(key)
        return _login_page(request, target, "wrong, revoked or used token", status_code=401)
    response = RedirectResponse(target, status_code=303)
    _set_cookie(response, request, secret)
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep) -> Response:
    if not _same_origin(request):
        return JSONResponse({"detail": "cross-site request refused"}, status_code=403)
    auth.end_session(session, request.cookies.get(auth.COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(auth.COOKIE, httponly=True, samesite="lax", secure=request.url.scheme == "https")
    return response


@router.get("/", response_class=HTMLResponse)
def runs_page(
    request: Request,
    session: SessionDep,
    project: str | None = None,
    status: str | None = None,
    verdict: str | None = None,
    page: Annotated[int, Query(ge=1)] = 1,
    per_page: Annotated[int, Query(ge=1, le=PER_PAGE_MAX)] = 50,
) -> Response:
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    listing = queries.list_runs(
        session,
        project_id=viewer.project_id,
        project=project or None,
        status=status or None,
        verdict=verdict or None,
        page=page,
        per_page=per_page,
    )
    return templates.TemplateResponse(
        request,
        "runs.html",
        {
            "listing": listing,
            "projects": queries.project_names(session, project_id=viewer.project_id),
            "statuses": [s.value for s in RunStatus],
            "verdicts": queries.verdict_classes(session, project_id=viewer.project_id),
            "filters": {"project": project or "", "status": status or "", "verdict": verdict or ""},
            "viewer": viewer,
        },
    )


def _stored_evaluation(session, run):
    """The run's latest stored evaluation. A page never evaluates: live triage does after each
    ingest, and the page's "Evaluate now" button (a POST) when asked."""
    row = triage_repo.latest(session, run.id)
    return (None, None) if row is None else (triage_repo.to_response(session, row), row)


def _is_live(run) -> bool:
    # A job marks its run finished/failed (client close(), MLflow end_run, PATCH); until then
    # the page keeps polling, which costs one small query every few seconds.
    return run.status == RunStatus.running.value


def _figures(session, run, result, jobs=(), data_dir=None) -> tuple[list[plots.MetricFigure], list[plots.MetricFigure]]:
    # Binned on triage's grid (at most canonical.MAX_GRID_POINTS points per metric, each bin's
    # lowest and highest value drawn): a page of a 70,000-step run reads what triage reads.
    binned = metrics.read_binned(session, run.id)
    series = binned.series
    canonical_of = aliases.canonical_names(session, run.project_id, run.framework, list(series))
    overlay = None
    if jobs and data_dir is not None:
        overlay = reproduction_overlay(
            jobs, canonical_of, framework=run.framework, data_dir=data_dir,
            canonical_of=lambda names: aliases.canonical_names(session, run.project_id, run.framework, names),
        )
    details = result.details if result is not None else {}
    change_points = details.get("change_points", {})
    top = result.candidates[0].fault_class if result is not None and result.candidates else None
    # The top class's expected shape, plus those of other classes only when they are strong too:
    # weak runners-up aligned on their own onsets clutter the plot without telling anything.
    shown = {top} | {
        c.fault_class for c in (result.candidates[1:] if result else []) if c.strength == "strong"
    }
    overlays = {cls: shapes for cls, shapes in details.get("overlays", {}).items() if cls in shown}
    top_metrics = (details.get("candidates", {}).get(top) or {}).get("metrics", [])
    evidence_metrics = [m["source"] for m in top_metrics if m.get("affected") and m.get("source") in series]
    overlay_metrics = list(overlays.get(top, {}))
    ordered = plots.order_metrics(
        list(series), canonical_of, overlay_metrics=overlay_metrics, evidence_metrics=evidence_metrics
    )
    figures = []
    for name in ordered:
        steps, values, nonfinite = plots.binned_points(binned.grid, series[name])
        expected = {cls: shapes[name] for cls, shapes in overlays.items() if name in shapes}
        figures.append(
            plots.metric_figure(
                name,
                steps,
                values,
                canonical=canonical_of.get(name, name),
                expected=expected,
                change_point=change_points.get(name),
                reproduction=(overlay.label, *overlay.series[name]) if overlay and name in overlay.series else None,
                nonfinite=nonfinite,
            )
        )
    n_key = max(plots.KEY_METRICS, len(overlay_metrics))
    return figures[:n_key], figures[n_key:]


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: int, session: SessionDep) -> Response:
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    found = queries.get_run(session, run_id, project_id=viewer.project_id)
    if found is None:
        return _not_found(request, viewer, f"Run {run_id}")
    return _render_run(request, session, viewer, *found)


def _render_run(request: Request, session, viewer: auth.Viewer, run, project: str, problem: str | None = None):
    result, row = _stored_evaluation(session, run)
    last_step = metrics.last_step(session, run.id)
    history = {h.fault_class: h for h in (result.history if result is not None else [])}
    jobs = queries.list_jobs(session, project_id=viewer.project_id, run_id=run.id, limit=5)
    key_figures, other_figures = _figures(session, run, result, jobs, request.app.state.settings.data_dir)
    plot_data = {
        "key": [f.to_json() for f in key_figures],
        "other": [f.to_json() for f in other_figures],
    }
    return templates.TemplateResponse(
        request,
        "run.html",
        {
            "run": run,
            "project": project,
            "result": result,
            "problem": problem,
            "history": history,
            "changes": triage_repo.evaluations(session, run.id, 20) if row is not None else [],
            "key_figures": key_figures,
            "other_figures": other_figures,
            # JSON with every "<" escaped cannot close the <script> element it sits in.
            "plot_json": Markup(json.dumps(plot_data, allow_nan=False).replace("<", "\\u003c")),  # nosec B704
            "live": _is_live(run),
            "poll_s": LIVE_POLL_S,
            "state_version": _state_version(row, last_step),
            "has_metrics": last_step is not None,
            "strong_threshold": (result.details or {}).get("strong_threshold") if result else None,
            "jobs": jobs,
            "viewer": viewer,
        },
        status_code=200 if problem is None else 503,
    )


def _not_found(request: Request, viewer: auth.Viewer, what: str) -> Response:
    # Another project's run or job is "not found" too: the page does not tell it exists.
    return templates.TemplateResponse(request, "not_found.html", {"what": what, "viewer": viewer}, status_code=404)


@router.post("/runs/{run_id}/evaluate")
def evaluate_page(request: Request, run_id: int, session: SessionDep) -> Response:
    """The page's "Evaluate now": triage the run with its metrics so far, store it, show it."""
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    if not _same_origin(request):
        return JSONResponse({"detail": "cross-site request refused"}, status_code=403)
    found = queries.get_run(session, run_id, project_id=viewer.project_id)
    if found is None:
        return _not_found(request, viewer, f"Run {run_id}")
    try:
        evaluate_run(session, found[0], get_engine(request.app), request.app.state.settings)
    except LibraryUnavailable as exc:
        return _render_run(request, session, viewer, *found, problem=exc.detail)
    return RedirectResponse(f"/runs/{run_id}", status_code=303)


def _state_version(row, last_step: int | None) -> str:
    if row is None:
        return f"none:{last_step}"
    return f"{row.id}:{row.evaluations}:{last_step}"


@router.get("/runs/{run_id}/state")
def run_state(request: Request, run_id: int, session: SessionDep) -> Response:
    """What the page polls while the run is live: it reloads when the version changes."""
    if (viewer := _viewer(request, session)) is None:
        return JSONResponse({"detail": "login required"}, status_code=401)
    found = queries.get_run(session, run_id, project_id=viewer.project_id)
    if found is None:
        return JSONResponse({"detail": f"run {run_id} not found"}, status_code=404)
    run, _project = found
    row = triage_repo.latest(session, run.id)
    return JSONResponse(
        {"version": _state_version(row, metrics.last_step(session, run.id)), "live": _is_live(run)}
    )


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep) -> Response:
    """Every reproduction job the viewer may see, newest first."""
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    return templates.TemplateResponse(
        request, "jobs.html", {"jobs": queries.list_jobs(session, project_id=viewer.project_id), "viewer": viewer}
    )


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: int, session: SessionDep) -> Response:
    """One job: its spec, state and attempts, what it found, what it cost."""
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    job = queries.get_job(session, job_id, project_id=viewer.project_id)
    if job is None:
        return _not_found(request, viewer, f"Job {job_id}")
    return templates.TemplateResponse(request, "job.html", {"job": job, "j": job.row, "viewer": viewer})


@router.get("/faults", response_class=HTMLResponse)
def faults_page(request: Request, session: SessionDep) -> Response:
    if (viewer := _viewer(request, session)) is None:
        return _to_login(request)
    by_family: dict[str, list] = {}
    for fault in FAULT_CLASSES.values():
        by_family.setdefault(fault.family, []).append(fault)
    return templates.TemplateResponse(
        request, "faults.html", {"by_family": by_family, "viewer": viewer}
    )


def _score_pct(score: float) -> int:
    return round(100 * score) if math.isfinite(score) else 0


templates.env.filters["pct"] = _score_pct
