"""Database engine, sessions and the unit-of-work scope.

One :class:`Database` per process (the app factory makes it from
``MOEPROXY_DATABASE_URL``).  Repositories take a :class:`~sqlalchemy.orm.Session`
and never commit; :meth:`Database.scope` (and the request dependency
:func:`get_session`, built on it) commits on success, rolls back on error and
only then hands deferred post-commit events to :mod:`moeproxy.service.events`.

SQLite notes (the embedded default): WAL journal so readers do not block the
writer, a 30 s busy timeout, foreign keys on, and ``BEGIN IMMEDIATE`` so that a
transaction takes the write lock up front instead of failing with
SQLITE_BUSY_SNAPSHOT when it upgrades a read snapshot under concurrent writers.
pysqlite's own implicit transactions are switched off (SQLAlchemy's documented
recipe) so that SAVEPOINTs, which the tests' rolled-back transactions use, work.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, DateTime, Engine, MetaData, TypeDecorator, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

# Stable constraint names, so migrations can refer to them on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC timestamp on both backends (SQLite stores no zone and returns naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


def add_unless_taken(session: Session, row: object) -> bool:
    """Add ``row`` in a savepoint; False, and the caller's transaction going on, when a unique key
    says another writer added its twin first (two jobs registering one run name, two evaluators
    enqueuing one alert). The caller reads the twin if it needs it."""
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        return False
    return True


def is_sqlite(bind: Engine | Connection | Session) -> bool:
    if isinstance(bind, Session):
        bind = bind.get_bind()
    return bind.dialect.name == "sqlite"


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # pragma: no cover - driver hook
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:  # pragma: no cover - driver hook
        conn.exec_driver_sql("BEGIN IMMEDIATE")


_SQLITE_LOCK_TIMEOUT_S = 30.0  # same as the busy timeout below


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for ``url`` with the per-backend settings above."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database not in (None, "", ":memory:"):
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30}, pool_pre_ping=False
        )
        _configure_sqlite(engine)
        return engine
    # Sized for uvicorn's thread pool: handlers are sync and each holds one
    # connection for the length of a request.
    return create_engine(url, echo=echo, pool_size=10, max_overflow=30, pool_pre_ping=True)


class Database:
    """The engine plus a session factory.

    ``bind`` may be an open :class:`Connection` inside a transaction: every
    session then joins it through SAVEPOINTs, so a test can roll everything
    back at the end (this is how ``tests/conftest.py`` isolates tests).
    """

    def __init__(self, url: str | None = None, *, bind: Engine | Connection | None = None, echo: bool = False):
        if bind is None:
            if url is None:
                raise ValueError("Database needs a url or a bind")
            bind = make_engine(url, echo=echo)
        self.bind = bind
        self.engine: Engine = bind if isinstance(bind, Engine) else bind.engine
        self._owns_engine = url is not None
        options = {"join_transaction_mode": "create_savepoint"} if isinstance(bind, Connection) else {}
        # SQLite takes one writer at a time, and its busy handler waits by sleeping in growing steps
        # (up to 100 ms), which gave multi-second p99 latencies under 8 concurrent writers.  Within
        # a process, units of work queue on a lock instead and the next one starts as soon as the
        # previous commits.  (Across processes the busy timeout still applies.)  A plain Lock, not
        # an RLock: FastAPI may enter and leave a request's scope on different threads.
        self._write_lock = threading.Lock() if is_sqlite(bind) and isinstance(bind, Engine) else None
        self._sessions = sessionmaker(bind=bind, expire_on_commit=False, **options)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    def session(self) -> Session:
        return self._sessions()

    @contextmanager
    def scope(self) -> Iterator[Session]:
        """Unit of work: commit on success, roll back on error, then fire post-commit events."""
        from moeproxy.service import events  # local: events must not import the db layer at load time

        # A scope nested in another on one thread would wait on itself: past the busy timeout go
        # on without the lock, and SQLite's own locking decides (it reports "database is locked").
        lock = self._write_lock
        if lock is not None and not lock.acquire(timeout=_SQLITE_LOCK_TIMEOUT_S):
            lock = None
        session = self._sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            events.discard_pending(session)
            raise
        finally:
            session.close()
            if lock is not None:
                lock.release()
        events.dispatch_pending(session)

    def ping(self) -> None:
        """Raise if the database does not answer.  A raw DBAPI round trip: going through a
        Connection would run the SQLite begin hook and queue behind any writer's lock."""
        raw = self.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            cursor.close()
        finally:
            raw.close()

    def dispose(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
