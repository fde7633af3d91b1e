"""Seed the global metric aliases (SPEC section 4) from the signature engine's vocabulary.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Inserts ``DEFAULT_ALIASES`` as global rows, skipping any (framework, name)
already present.  Entries added to the vocabulary later ship in their own
migration (same helper, ON CONFLICT DO NOTHING), so an existing database gets
them on ``moeproxy db upgrade``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_aliases = sa.table(
    "metric_aliases",
    sa.column("project_id", sa.Integer()),
    sa.column("framework", sa.String()),
    sa.column("name", sa.String()),
    sa.column("canonical", sa.String()),
    sa.column("created_at", sa.DateTime(timezone=True)),
)


def insert_global_aliases(aliases) -> None:
    """Insert global aliases, leaving existing (framework, name) pairs as they are."""
    bind = op.get_bind()
    existing = set(
        bind.execute(sa.select(_aliases.c.framework, _aliases.c.name).where(_aliases.c.project_id.is_(None))).all()
    )
    now = datetime.now(UTC)
    rows = [
        {"project_id": None, "framework": a.framework, "name": a.name, "canonical": a.canonical, "created_at": now}
        for a in aliases
        if (a.framework, a.name) not in existing
    ]
    # Deduplicate within the tuple itself (last entry wins), then insert.
    unique = {(r["framework"], r["name"]): r for r in rows}
    if unique:
        op.bulk_insert(_aliases, list(unique.values()))


def upgrade() -> None:
    from moeproxy.signatures.vocabulary import DEFAULT_ALIASES

    insert_global_aliases(DEFAULT_ALIASES)


def downgrade() -> None:
    op.execute(_aliases.delete().where(_aliases.c.project_id.is_(None)))
