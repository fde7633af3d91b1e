"""Alembic migrations of the service database, installed as ``moeproxy.migrations``.

Alembic is configured in code (no alembic.ini): ``script_location`` is this
package's folder, so upgrades work the same from a checkout, an editable
install or a wheel.  ``moeproxy db upgrade`` and ``moeproxy serve`` call
:func:`upgrade`; tests call it on their scratch databases.

Data migrations: ``0002`` seeds the global metric aliases by importing
``moeproxy.signatures.vocabulary.DEFAULT_ALIASES`` (the tuple as it is when
the migration runs on a new database).  Databases upgraded before an entry was
added do not re-run 0002, so additions to the vocabulary come with their own
migration that calls ``insert_global_aliases`` from 0002 (existing
(framework, name) pairs are left alone); never edit an applied migration.

Must not import the web layer; it imports the service's models for
``target_metadata`` only.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine

SCRIPT_LOCATION = Path(__file__).resolve().parent


def alembic_config(bind: Engine | Connection | str | None = None) -> Config:
    """A Config whose env.py uses ``bind`` (an engine, an open connection or a URL; None: settings)."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("version_path_separator", "os")
    if isinstance(bind, str):
        config.attributes["url"] = bind
    elif bind is not None:
        config.attributes["bind"] = bind
    return config


def upgrade(bind: Engine | Connection | str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(bind), revision)


def downgrade(bind: Engine | Connection | str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(bind), revision)


def current_revision(bind: Engine | Connection | str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from moeproxy.service.db import make_engine

    engine = make_engine(bind) if isinstance(bind, str) else bind
    try:
        if isinstance(engine, Connection):
            return MigrationContext.configure(engine).get_current_revision()
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        if isinstance(bind, str):
            engine.dispose()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()
