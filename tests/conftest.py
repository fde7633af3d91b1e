"""Shared database fixtures: every database test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``MOEPROXY_TEST_POSTGRES_URL``.  When that variable is set
and the server does not answer, the PostgreSQL tests FAIL (CI must not go green
by skipping them).  When it is unset, the local default
``postgresql+psycopg://postgres@127.0.0.1:5432/test`` is tried and the
PostgreSQL variants are skipped only if it does not answer.

Isolation:

* ``database`` (most tests): the schema is built once per test session by
  ``alembic upgrade head`` (SQLite: a temp file; PostgreSQL: a schema of its own,
  so concurrent test sessions on one server do not collide); each test then runs
  inside a transaction on one connection that is rolled back at the end
  (sessions join it through SAVEPOINTs).
* ``fresh_database_url``: an empty, upgraded database (a file or a schema) for
  tests that need committed data visible to other processes, e.g. a real uvicorn.

Fixtures for API tests: ``app``, ``client`` (FastAPI TestClient over real HTTP
semantics), ``make_token(project) -> token``, ``auth(project) -> headers``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


def _postgres_reachable(url: str) -> str | None:
    """None when the server answers, else the error."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    try:
        with psycopg.connect(
            host=u.host or "127.0.0.1",
            port=u.port or 5432,
            user=u.username,
            password=u.password,
            dbname=u.database,
            connect_timeout=3,
        ):
            return None
    except Exception as exc:  # any connection failure
        return str(exc)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL test server (see the module docstring for fail-versus-skip)."""
    configured = os.environ.get("MOEPROXY_TEST_POSTGRES_URL")
    url = configured or DEFAULT_TEST_POSTGRES_URL
    problem = _postgres_reachable(url)
    if problem is not None:
        if configured:
            pytest.fail(f"MOEPROXY_TEST_POSTGRES_URL={configured} is set but the server does not answer: {problem}")
        pytest.skip(f"PostgreSQL not reachable at {url} (set MOEPROXY_TEST_POSTGRES_URL to require it): {problem}")
    return url


def _with_search_path(url: str, schema: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return u.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)


class _ScratchDatabases:
    """Creates upgraded scratch databases (SQLite files or PostgreSQL schemas) and drops them."""

    def __init__(self, tmp_factory: pytest.TempPathFactory):
        self._tmp = tmp_factory
        self._schemas: list[tuple[str, str]] = []

    def create(self, backend: str, base_pg_url: str | None = None) -> str:
        from moeproxy import migrations

        if backend == "sqlite":
            url = f"sqlite:///{self._tmp.mktemp('db') / 'moeproxy.db'}"
        else:
            import psycopg
            from sqlalchemy.engine import make_url

            assert base_pg_url is not None
            schema = f"test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
            u = make_url(base_pg_url)
            with psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database, autocommit=True) as c:
                c.execute(f'CREATE SCHEMA "{schema}"')
            self._schemas.append((base_pg_url, schema))
            url = _with_search_path(base_pg_url, schema)
        migrations.upgrade(url)
        return url

    def drop_all(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        for base, schema in self._schemas:
            u = make_url(base)
            try:
                with psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database, autocommit=True) as c:
                    c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            except psycopg.Error as exc:  # best effort at teardown; say what was left behind
                print(f"could not drop test schema {schema}: {exc}")
        self._schemas.clear()


@pytest.fixture(scope="session")
def scratch_databases(tmp_path_factory) -> Iterator[_ScratchDatabases]:
    scratch = _ScratchDatabases(tmp_path_factory)
    yield scratch
    scratch.drop_all()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def database_url(backend, scratch_databases, request) -> str:
    """A database upgraded to head once per test session and backend."""
    pg = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    return scratch_databases.create(backend, pg)


@pytest.fixture(scope="session")
def engine(database_url):
    from moeproxy.service.db import make_engine

    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def database(engine):
    """A :class:`~moeproxy.service.db.Database` whose every session joins one rolled-back transaction."""
    from moeproxy.service.db import Database

    connection = engine.connect()
    transaction = connection.begin()
    db = Database(bind=connection)
    try:
        yield db
    finally:
        from moeproxy.service import events

        events.drain()
        if transaction.is_active:
            transaction.rollback()
        connection.close()


@pytest.fixture
def session(database):
    """A plain session inside the rolled-back test transaction."""
    s = database.session()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fresh_database_url(backend, scratch_databases, request) -> str:
    """An empty database upgraded to head, committed for real (other processes can use it)."""
    pg = request.getfixturevalue("postgres_url") if backend == "postgres" else None
    return scratch_databases.create(backend, pg)


@pytest.fixture
def app(database):
    from moeproxy.service.app import create_app

    from moeproxy.config import Settings

    return create_app(Settings(database_url="sqlite://"), database=database)


@pytest.fixture
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as c:
        yield c


@pytest.fixture
def make_token(database) -> Callable[..., str]:
    """``make_token(project="p")`` -> a bearer token of that project (created if new)."""
    from moeproxy.service.tokens import repository

    def make(project: str = "test-project", label: str | None = None) -> str:
        with database.scope() as s:
            _, secret = repository.create_token(s, project, label=label)
        return secret

    return make


@pytest.fixture
def auth(make_token) -> Callable[..., dict[str, str]]:
    """``auth(project="p")`` -> ``{"Authorization": "Bearer ..."}`` for that project."""
    cache: dict[str, dict[str, str]] = {}

    def headers(project: str = "test-project") -> dict[str, str]:
        if project not in cache:
            cache[project] = {"Authorization": f"Bearer {make_token(project)}"}
        return cache[project]

    return headers
