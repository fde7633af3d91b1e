"""Page logins (issue 16, defect 3): a login by default, per project; sessions that end; one-time
links; a lockout on guessing; page reads that never evaluate nor write."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from moeproxy.config import Settings
from moeproxy.service.app import create_app
from moeproxy.service.triage.models import TriageEvaluation
from moeproxy.service.ui import auth as ui_auth
from moeproxy.signatures.synthetic import synthetic_run
from ui_helpers import ingest_body

OPERATOR = "operator-s3cret"
RUN_LINK = re.compile(r'<a href="/runs/(\d+)">([^<]+)</a>')


@pytest.fixture
def make_client(database, fingerprint_library):
    clients = []

    def make(**settings) -> TestClient:
        app = create_app(
            Settings(database_url="sqlite://", fingerprints=fingerprint_library, **settings), database=database
        )
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def runs(make_client, make_token):
    """Two projects' runs with metrics, posted over the API; returns (alpha token, {name: id})."""
    api = make_client()
    tokens = {p: make_token(p) for p in ("alpha", "beta")}
    ids = {}
    for project, name in (("alpha", "a-run"), ("beta", "b-run")):
        headers = {"Authorization": f"Bearer {tokens[project]}"}
        run_id = api.post("/api/v1/runs", json={"name": name}, headers=headers).json()["id"]
        body = ingest_body(synthetic_run("healthy", steps=30, seed=5))
        assert api.post(f"/api/v1/runs/{run_id}/metrics", json=body, headers=headers).status_code == 200
        ids[name] = run_id
    return tokens, ids


def log_in(client: TestClient, credential: str, next_: str = "/"):
    return client.post("/login", data={"token": credential, "next": next_}, follow_redirects=False)


def listed(client: TestClient) -> list[str]:
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 200, page.status_code
    return [name for _id, name in RUN_LINK.findall(page.text)]


def test_pages_need_a_login_by_default(make_client, runs):
    _tokens, ids = runs
    client = make_client()  # no MOEPROXY_UI_TOKEN, no --public-ui: still gated
    for path in ("/", f"/runs/{ids['a-run']}", "/faults", "/?project=alpha"):
        reply = client.get(path, follow_redirects=False)
        assert reply.status_code == 303 and reply.headers["location"].startswith("/login?next=")
    assert client.get(f"/runs/{ids['a-run']}/state").status_code == 401
    assert client.post(f"/runs/{ids['a-run']}/evaluate", follow_redirects=False).headers["location"].startswith(
        "/login"
    )
    assert client.get("/static/ui.css").status_code == 200  # assets are not secret
    assert client.get("/login").status_code == 200


def test_a_project_token_sees_its_own_project_only(make_client, runs):
    tokens, ids = runs
    client = make_client(ui_token=OPERATOR)
    reply = log_in(client, tokens["alpha"], f"/runs/{ids['a-run']}")
    assert reply.status_code == 303 and reply.headers["location"] == f"/runs/{ids['a-run']}"
    cookie = client.cookies.get(ui_auth.COOKIE)
    assert cookie and tokens["alpha"] not in cookie

    assert listed(client) == ["a-run"]
    home = client.get("/").text
    assert "project alpha" in home and "beta" not in home  # the project filter lists alpha only
    assert client.get("/?project=beta").text.count('href="/runs/') == 0
    assert client.get(f"/runs/{ids['a-run']}").status_code == 200
    # Another project's run does not exist for this viewer: page, live state and evaluate alike.
    assert client.get(f"/runs/{ids['b-run']}").status_code == 404
    assert client.get(f"/runs/{ids['b-run']}/state").status_code == 404
    assert client.post(f"/runs/{ids['b-run']}/evaluate").status_code == 404


def test_the_operator_token_sees_every_project(make_client, runs):
    _tokens, ids = runs
    client = make_client(ui_token=OPERATOR)
    assert log_in(client, OPERATOR).status_code == 303
    assert sorted(listed(client)) == ["a-run", "b-run"]
    assert "all projects" in client.get("/").text
    assert client.get(f"/runs/{ids['b-run']}").status_code == 200


def test_wrong_tokens_are_refused_and_next_cannot_leave_the_site(make_client, runs):
    tokens, _ids = runs
    client = make_client(ui_token=OPERATOR)
    wrong = log_in(client, "nope", "/faults")
    assert wrong.status_code == 401 and "wrong" in wrong.text and OPERATOR not in wrong.text
    assert not client.cookies.get(ui_auth.COOKIE)
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        reply = log_in(client, tokens["alpha"], target)
        assert reply.status_code == 303 and reply.headers["location"] == "/"


def test_logout_ends_the_session_for_good(make_client, runs):
    """The old cookie was an HMAC of the UI token: it stayed valid after logout, forever."""
    tokens, _ids = runs
    client = make_client()
    log_in(client, tokens["alpha"])
    cookie = client.cookies.get(ui_auth.COOKIE)
    assert client.post("/logout", follow_redirects=False).headers["location"] == "/login"
    assert not client.cookies.get(ui_auth.COOKIE)
    replay = make_client()
    replay.cookies.set(ui_auth.COOKIE, cookie)
    assert replay.get("/", follow_redirects=False).status_code == 303


def test_revoking_the_api_token_ends_its_page_sessions(make_client, runs, database):
    from moeproxy.service.tokens import repository as token_repo

    tokens, _ids = runs
    client = make_client()
    log_in(client, tokens["alpha"])
    assert listed(client) == ["a-run"]
    with database.scope() as s:
        token_repo.revoke_token(s, tokens["alpha"])
    assert client.get("/", follow_redirects=False).status_code == 303
    assert log_in(client, tokens["alpha"]).status_code == 401


def test_a_login_link_works_once_and_only_for_its_project(make_client, runs, database):
    tokens, ids = runs
    with database.scope() as s:
        code = ui_auth.create_login_link(s, "beta")
        operator_code = ui_auth.create_login_link(s, None)
        expired = ui_auth.create_login_link(s, "beta", max_age=timedelta(seconds=-1))
    client = make_client()
    # The login page carries the script that posts a #code= fragment; the code never reaches a URL.
    page = client.get("/login")
    assert '<script src="/static/login.js">' in page.text
    assert "code=" in client.get("/static/login.js").text

    assert log_in(client, code).status_code == 303
    assert listed(client) == ["b-run"]
    assert log_in(make_client(), code).status_code == 401  # used
    assert log_in(make_client(), expired).status_code == 401
    everyone = make_client()
    assert log_in(everyone, operator_code).status_code == 303
    assert sorted(listed(everyone)) == ["a-run", "b-run"]
    with database.scope() as s, pytest.raises(Exception, match="no project 'gamma'"):
        ui_auth.create_login_link(s, "gamma")


def test_a_token_in_the_query_is_neither_taken_nor_carried_on(make_client, runs):
    tokens, _ids = runs
    client = make_client(ui_token=OPERATOR)
    for secret in (OPERATOR, tokens["alpha"]):
        reply = client.get(f"/faults?token={secret}&x=1", follow_redirects=False)
        assert reply.status_code == 303 and reply.headers["location"] == "/login?next=%2Ffaults%3Fx%3D1"
        assert not client.cookies.get(ui_auth.COOKIE)


def test_repeated_failed_logins_lock_the_address_out(make_client, runs):
    tokens, _ids = runs
    client = make_client(login_max_failures=3, login_lockout_s=600)
    for _ in range(3):
        assert log_in(client, "guess").status_code == 401
    locked = log_in(client, tokens["alpha"])  # even the right token waits
    assert locked.status_code == 429 and 0 < int(locked.headers["retry-after"]) <= 600
    assert "too many failed logins" in locked.text
    assert not client.cookies.get(ui_auth.COOKIE)


def test_page_reads_never_evaluate_nor_write(make_client, runs, database):
    tokens, ids = runs
    client = make_client()
    log_in(client, tokens["alpha"])
    run_id = ids["a-run"]

    def evaluations() -> int:
        with database.scope() as s:
            return s.scalar(select(func.count()).select_from(TriageEvaluation))

    for _ in range(3):
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200 and "Not evaluated yet" in page.text
        client.get("/")
        client.get(f"/runs/{run_id}/state")
    assert evaluations() == 0

    # "Evaluate now" is a POST, refused from another site.
    foreign = client.post(f"/runs/{run_id}/evaluate", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and evaluations() == 0
    done = client.post(f"/runs/{run_id}/evaluate", follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run_id}"
    assert evaluations() == 1
    page = client.get(f"/runs/{run_id}").text
    assert 'id="verdict"' in page and "Not evaluated yet" not in page


def test_public_ui_opts_out_for_a_laptop(make_client, runs):
    _tokens, ids = runs
    client = make_client(public_ui=True)
    assert sorted(listed(client)) == ["a-run", "b-run"]
    assert client.get(f"/runs/{ids['b-run']}").status_code == 200
    assert client.get("/login", follow_redirects=False).status_code == 303
    assert "Log out" not in client.get("/").text
