"""Triage evaluations: the top class as its own column (the runs page filters on it); longer verdicts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("triage_evaluations") as batch:
        batch.add_column(sa.Column("top_class", sa.String(128), nullable=True))
        batch.alter_column(
            "verdict", type_=sa.String(512), existing_type=sa.String(128), existing_nullable=False
        )
        batch.create_index("ix_triage_evaluations_top_class", ["top_class"])
    # Existing rows: the top class is the first stored candidate.
    evaluations = sa.table(
        "triage_evaluations",
        sa.column("id", sa.Integer()),
        sa.column("candidates", sa.JSON()),
        sa.column("top_class", sa.String()),
    )
    bind = op.get_bind()
    for row_id, candidates in bind.execute(sa.select(evaluations.c.id, evaluations.c.candidates)).all():
        if candidates:
            bind.execute(
                evaluations.update()
                .where(evaluations.c.id == row_id)
                .values(top_class=candidates[0]["fault_class"])
            )


def downgrade() -> None:
    with op.batch_alter_table("triage_evaluations") as batch:
        batch.drop_index("ix_triage_evaluations_top_class")
        batch.alter_column(
            "verdict", type_=sa.String(128), existing_type=sa.String(512), existing_nullable=False
        )
        batch.drop_column("top_class")
