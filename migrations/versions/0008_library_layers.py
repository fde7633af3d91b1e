"""Library layers (issue 18): ``library_layers``, one row per per-model layer a job wrote.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "library_layers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("model_uri", sa.Text(), nullable=False),
        sa.Column("model_key", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("fingerprints", sa.Integer(), nullable=False),
        sa.Column("strong_threshold", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_library_layers_project_id_projects",
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["reproduction_jobs.id"],
                                name="fk_library_layers_job_id_reproduction_jobs", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_library_layers"),
        sa.UniqueConstraint("model_key", "version", name="uq_library_layers_model_key_version"),
    )
    op.create_index("ix_library_layers_project_id_model_uri", "library_layers", ["project_id", "model_uri"])


def downgrade() -> None:
    op.drop_index("ix_library_layers_project_id_model_uri", table_name="library_layers")
    op.drop_table("library_layers")
