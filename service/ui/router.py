"""The pages (not part of the REST API: excluded from the OpenAPI schema)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

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

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))

# Static files by name: the app's own, and plotly.js from the installed plotly package (no CDN).
STATIC_FILES: dict[str, tuple[Path, str]] = {
    "plotly.min.js": (
        Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js",
        "text/javascript",
    ),
    "ui.js": (HERE / "static" / "ui.js", "text/javascript"),
    "ui.css": (HERE / "static" / "ui.css", "text/css"),
}

LIVE_POLL_S = 5
PER_PAGE_MAX = 1000


router = APIRouter(include_in_schema=False)


def _gate(request: Request) -> Response | None:
    """None when the request may see pages; otherwise the redirect to answer with.

    A valid ``?token=`` sets the cookie and redirects to the same URL without the token, so the
    token does not stay in the address bar or the history.
    """
    expected = auth.ui_token(request)
    if expected is None or auth.is_authorised(request):
        return None
    given = request.query_params.get("token")
    if auth.token_matches(given, expected):
        response = RedirectResponse(auth.without_token(request.url), status_code=303)
        _set_cookie(response, request, expected)
        return response
    return RedirectResponse(auth.login_url(request), status_code=303)


def _set_cookie(response: Response, request: Request, expected: str) -> None:
    response.set_cookie(
        auth.COOKIE,
        auth.cookie_value(expected),
        max_age=auth.COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


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


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC_FILES:
        return Response("not found", status_code=404)
    path, media_type = STATIC_FILES[name]
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/", error: str | None = None) -> Response:
    return templates.TemplateResponse(
        request,
        "login.html",
        {"next": auth.safe_next(next), "error": error, "gated": auth.ui_token(request) is not None},
    )


@router.post("/login")
def login(request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/") -> Response:
    expected = auth.ui_token(request)
    target = auth.safe_next(next)
    if expected is None:
        return RedirectResponse(target, status_code=303)
    if not auth.token_matches(token, expected):
        return templates.TemplateResponse(
            request, "login.html", {"next": target, "error": "wrong token", "gated": True}, status_code=401
        )
    response = RedirectResponse(target, status_code=303)
    _set_cookie(response, request, expected)
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(auth.COOKIE)
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
    if (redirect := _gate(request)) is not None:
        return redirect
    listing = queries.list_runs(
        session,
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
            "projects": queries.project_names(session),
            "statuses": [s.value for s in RunStatus],
            "verdicts": queries.verdict_classes(session),
            "filters": {"project": project or "", "status": status or "", "verdict": verdict or ""},
            "gated": auth.ui_token(request) is not None,
        },
    )


def _evaluation(request: Request, session, run):
    row = triage_repo.latest(session, run.id)
    if row is not None:
        return triage_repo.to_response(session, row), row
    if metrics.last_step(session, run.id) is None:
        return None, None
    try:
        result, _alerts = evaluate_run(session, run, get_engine(request.app), request.app.state.settings)
    except LibraryUnavailable as exc:
        return exc.detail, None
    return result, triage_repo.latest(session, run.id)


def _is_live(run) -> bool:
    # A job marks its run finished/failed (client close(), MLflow end_run, PATCH); until then
    # the page keeps polling, which costs one small query every few seconds.
    return run.status == RunStatus.running.value


def _figures(session, run, result) -> tuple[list[plots.MetricFigure], list[plots.MetricFigure]]:
    series = queries.read_series(session, run.id)
    canonical_of = aliases.canonical_names(session, run.project_id, run.framework, list(series))
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
        steps, values = series[name]
        expected = {cls: shapes[name] for cls, shapes in overlays.items() if name in shapes}
        figures.append(
            plots.metric_figure(
                name,
                steps,
                values,
                canonical=canonical_of.get(name, name),
                expected=expected,
                change_point=change_points.get(name),
            )
        )
    n_key = max(plots.KEY_METRICS, len(overlay_metrics))
    return figures[:n_key], figures[n_key:]


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: int, session: SessionDep) -> Response:
    if (redirect := _gate(request)) is not None:
        return redirect
    found = queries.get_run(session, run_id)
    if found is None:
        return templates.TemplateResponse(request, "not_found.html", {"run_id": run_id}, status_code=404)
    run, project = found
    result, row = _evaluation(request, session, run)
    problem = result if isinstance(result, str) else None
    result = None if problem else result
    history = {h.fault_class: h for h in (result.history if result is not None else [])}
    key_figures, other_figures = _figures(session, run, result)
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
            # </script> cannot appear in JSON numbers/strings we make, but escape "<" anyway.
            "plot_json": Markup(json.dumps(plot_data, allow_nan=False).replace("<", "\\u003c")),
            "live": _is_live(run),
            "poll_s": LIVE_POLL_S,
            "state_version": _state_version(row, metrics.last_step(session, run.id)),
            "strong_threshold": (result.details or {}).get("strong_threshold") if result else None,
            "gated": auth.ui_token(request) is not None,
        },
    )


def _state_version(row, last_step: int | None) -> str:
    if row is None:
        return f"none:{last_step}"
    return f"{row.id}:{row.evaluations}:{last_step}"


@router.get("/runs/{run_id}/state")
def run_state(request: Request, run_id: int, session: SessionDep) -> Response:
    """What the page polls while the run is live: it reloads when the version changes."""
    if not auth.is_authorised(request):
        return JSONResponse({"detail": "login required"}, status_code=401)
    found = queries.get_run(session, run_id)
    if found is None:
        return JSONResponse({"detail": f"run {run_id} not found"}, status_code=404)
    run, _project = found
    row = triage_repo.latest(session, run.id)
    return JSONResponse(
        {"version": _state_version(row, metrics.last_step(session, run.id)), "live": _is_live(run)}
    )


@router.get("/faults", response_class=HTMLResponse)
def faults_page(request: Request) -> Response:
    if (redirect := _gate(request)) is not None:
        return redirect
    by_family: dict[str, list] = {}
    for fault in FAULT_CLASSES.values():
        by_family.setdefault(fault.family, []).append(fault)
    return templates.TemplateResponse(
        request, "faults.html", {"by_family": by_family, "gated": auth.ui_token(request) is not None}
    )


def _score_pct(score: float) -> int:
    return round(100 * score) if math.isfinite(score) else 0


templates.env.filters["pct"] = _score_pct
