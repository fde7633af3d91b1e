"""The command line as a user runs it: token create | tail -1, token list/revoke, db upgrade, serve --demo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from uvicorn_process import UvicornProcess, free_port

MOEPROXY = [str(Path(sys.executable).parent / "moeproxy")]  # the console script, as a user runs it


def _run(args: list[str], env_url: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "MOEPROXY_DATABASE_URL": env_url}
    return subprocess.run([*MOEPROXY, *args], env=env, capture_output=True, text=True, timeout=120, check=False, **kw)


def test_token_create_prints_the_token_on_the_last_line(fresh_database_url):
    env = {**os.environ, "MOEPROXY_DATABASE_URL": fresh_database_url}
    shell = subprocess.run(
        f"{MOEPROXY[0]} token create --project cli-proj --label ci | tail -1",
        shell=True, env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    token = shell.stdout.strip()
    assert token.startswith("mpx_") and " " not in token
    with UvicornProcess(fresh_database_url) as server:
        who = httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert who.json()["project"] == "cli-proj"
        listed = json.loads(_run(["token", "list", "--json"], fresh_database_url).stdout)
        assert [(t["project"], t["label"], t["revoked_at"]) for t in listed] == [("cli-proj", "ci", None)]
        assert token.startswith(listed[0]["prefix"])
        revoked = _run(["token", "revoke", str(listed[0]["id"])], fresh_database_url)
        assert revoked.returncode == 0, revoked.stderr
        assert httpx.get(f"{server.url}/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert json.loads(_run(["token", "list", "--json"], fresh_database_url).stdout) == []
    assert len(json.loads(_run(["token", "list", "--json", "--all"], fresh_database_url).stdout)) == 1


def test_token_login_link_opens_its_project_pages_once(fresh_database_url):
    token = _run(["token", "create", "--project", "linked"], fresh_database_url).stdout.strip().splitlines()[-1]
    with UvicornProcess(fresh_database_url) as server:
        headers = {"Authorization": f"Bearer {token}"}
        httpx.post(f"{server.url}/api/v1/runs", json={"name": "linked-run"}, headers=headers).raise_for_status()
        made = _run(["token", "login-link", "--project", "linked", "--base-url", server.url], fresh_database_url)
        assert made.returncode == 0, made.stderr
        link = made.stdout.strip().splitlines()[-1]
        assert link.startswith(f"{server.url}/login#code=mpl_")
        code = link.split("#code=", 1)[1]
        with httpx.Client(base_url=server.url, follow_redirects=True) as browser:
            assert browser.post("/login", data={"token": code}).status_code == 200
            assert "linked-run" in browser.get("/").text
        assert httpx.post(f"{server.url}/login", data={"token": code}).status_code == 401


@pytest.mark.parametrize(
    "args, message",
    [
        (["token", "create", "--project", "bad name!"], "invalid project name"),
        (["token", "revoke", "987654"], "no token matches"),
        (["token", "login-link", "--project", "nobody"], "no project 'nobody'"),
    ],
)
def test_cli_user_errors_exit_2_with_a_message(tmp_path, args, message):
    result = _run(args, f"sqlite:///{tmp_path / 'x.db'}")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_unreachable_database_is_a_clear_error(tmp_path):
    result = _run(["db", "upgrade"], "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2")
    assert result.returncode == 2
    assert "cannot reach the database" in result.stderr and "Traceback" not in result.stderr


def test_db_upgrade_on_an_empty_database(backend, scratch_databases, request, tmp_path):
    from moeproxy.migrations import current_revision, head_revision

    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        import psycopg
        from sqlalchemy.engine import make_url

        base = request.getfixturevalue("postgres_url")
        schema = f"cli_{os.getpid()}_{time.time_ns() % 10**9}"
        u = make_url(base)
        with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{schema}"')
        scratch_databases._schemas.append((base, schema))  # dropped at session end
        url = u.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    assert current_revision(url) is None
    result = _run(["db", "upgrade"], url)
    assert result.returncode == 0, result.stderr
    assert current_revision(url) == head_revision()
    current = json.loads(_run(["db", "current", "--json"], url).stdout)
    assert current["current"] == current["head"] == head_revision()
    again = _run(["db", "upgrade", "--url", url], "sqlite:///unused.db")  # idempotent; --url wins
    assert again.returncode == 0


def test_models_and_migrations_agree(engine):
    """`alembic upgrade head` produces exactly the tables the models declare (both backends)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from moeproxy.service.models import Base

    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_serve_demo_posts_the_recorded_runs_through_the_api(tmp_path):
    """README's first command, minus the install: `moeproxy serve --demo` on the SQLite default."""
    port = free_port()
    data = tmp_path / "data"
    env = {**os.environ, "XDG_DATA_HOME": str(data), "HOME": str(tmp_path)}
    env.pop("MOEPROXY_DATABASE_URL", None)
    proc = subprocess.Popen(
        [*MOEPROXY, "serve", "--demo", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Open http://"):
                break
        output = "".join(lines)
        link = re.search(rf"Open (http://127\.0\.0\.1:{port}/login#code=(mpl_[\w-]+))", output)
        assert link, output
        # What the login page's script does with the fragment: post the code once; it opens the
        # demo project's pages, and a second use is refused.
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=True) as browser:
            assert browser.get("/", follow_redirects=False).status_code == 303  # a login is needed
            assert browser.post("/login", data={"token": link.group(2)}).status_code == 200
            assert "demo-grpo-qwen3-moe-64e-rl-bf16-rollout" in browser.get("/").text
        again = httpx.post(f"http://127.0.0.1:{port}/login", data={"token": link.group(2)})
        assert again.status_code == 401
        token = next(line.split(": ")[-1].strip() for line in lines if "token for project 'demo'" in line)
        h = {"Authorization": f"Bearer {token}"}
        listed = httpx.get(f"http://127.0.0.1:{port}/api/v1/runs", headers=h).json()["runs"]
        runs = [httpx.get(f"http://127.0.0.1:{port}/api/v1/runs/{r['id']}", headers=h).json() for r in listed]
        assert {r["name"] for r in runs} == {"demo-grpo-qwen3-moe-64e-rl-healthy", "demo-grpo-qwen3-moe-64e-rl-bf16-rollout"}
        assert all("demo" in r["tags"] and r["config"]["demo"] is True for r in runs)
        faulty = next(r for r in runs if r["config"]["injected_fault"] == "rollout_logp_precision")
        series = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/runs/{faulty['id']}/metrics?names=training/rollout_probs_diff_mean",
            headers=h,
        ).json()["metrics"]["training/rollout_probs_diff_mean"]
        assert series["steps"] == list(range(100))
        onset = faulty["config"]["onset_step"]
        before, after = series["values"][:onset], series["values"][onset + 1 :]
        assert min(after) > 2 * max(before)  # the visible fault
        assert list(data.rglob("moeproxy.db")), "the default database lives in the user data dir"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_migrations_run_from_a_built_wheel(tmp_path):
    """script_location is the installed package folder, so `db upgrade` works from a wheel too."""
    import zipfile

    from moeproxy.migrations import head_revision

    root = Path(__file__).resolve().parents[2]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"), str(root)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "w").glob("moeproxy-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "moeproxy" / "migrations" / "script.py.mako").exists()
    db = tmp_path / "wheel.db"
    code = (
        "import moeproxy.migrations as m; "
        f"assert m.__file__.startswith({str(site)!r}), m.__file__; "
        f"m.upgrade('sqlite:///{db}'); print(m.current_revision('sqlite:///{db}'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
        timeout=120, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == head_revision()


@pytest.mark.parametrize("preset", [None, "4"])
def test_serve_caps_the_malloc_arenas_of_its_workers_unless_told_otherwise(tmp_path, monkeypatch, preset):
    """Worker processes start with MALLOC_ARENA_MAX=2 (fewer glibc arenas, less RSS growth under the
    request threads; docs/reliability.md), and a value already in the environment is kept."""
    import uvicorn
    from moeproxy.cli import app
    from typer.testing import CliRunner

    from moeproxy.config import get_settings

    # Every variable serve sets goes through monkeypatch first, so this process gets it back.
    monkeypatch.setenv("MOEPROXY_DATABASE_URL", f"sqlite:///{tmp_path / 'm.db'}")
    monkeypatch.setenv("MALLOC_ARENA_MAX", preset or "unset")
    if preset is None:
        monkeypatch.delenv("MALLOC_ARENA_MAX")
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(kw, arenas=os.environ.get("MALLOC_ARENA_MAX")))
    try:
        res = CliRunner().invoke(app, ["serve", "--no-upgrade", "--workers", "2", "--port", str(free_port())])
    finally:
        get_settings.cache_clear()
    assert res.exit_code == 0, res.output
    assert seen["workers"] == 2 and seen["arenas"] == (preset or "2")
