"""Alembic environment: runs migrations on the bind handed over by :func:`moeproxy.migrations.alembic_config`."""

from __future__ import annotations

from alembic import context
from moeproxy.service.db import make_engine
from moeproxy.service.models import Base
from sqlalchemy import Connection, Engine, text

# An arbitrary constant: the advisory lock serialises concurrent upgrades
# (several replicas starting at once) on PostgreSQL.
_PG_MIGRATION_LOCK = 0x6D6F6570  # "moep"

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        context.run_migrations()


def _online() -> None:
    bind = config.attributes.get("bind")
    if isinstance(bind, Connection):
        _run(bind)
        return
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            _run(connection)
            connection.commit()
        return
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        from moeproxy.config import get_settings

        url = get_settings().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported: run `moeproxy db upgrade` against a database")
_online()
