"""Reproduction jobs (issue 18): the ``reproduction_jobs`` queue table and ``runs.model_uri``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_OPEN = sa.text("state IN ('queued', 'running')")


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.add_column("runs", sa.Column("model_uri", sa.Text(), nullable=True))
    op.create_table(
        "reproduction_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("model_uri", sa.Text(), nullable=False),
        sa.Column("method", sa.String(64), nullable=False),
        sa.Column("keep_ratio", sa.Float(), nullable=False),
        sa.Column("classes", sa.JSON(), nullable=False),
        sa.Column("grid", sa.JSON(), nullable=False),
        sa.Column("seeds", sa.JSON(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("cancel_requested_at", _TS, nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("finished_at", _TS, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("worker_id", sa.String(256), nullable=True),
        sa.Column("lease_expires_at", _TS, nullable=True),
        sa.Column("heartbeat_at", _TS, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("device_hours", sa.Float(), nullable=True),
        sa.Column("planner_estimate", sa.JSON(), nullable=True),
        _fk("reproduction_jobs", "project_id", "projects"),
        _fk("reproduction_jobs", "run_id", "runs"),
        sa.PrimaryKeyConstraint("id", name="pk_reproduction_jobs"),
    )
    op.create_index(
        "ix_reproduction_jobs_project_id_created_at", "reproduction_jobs", ["project_id", "created_at"]
    )
    op.create_index("ix_reproduction_jobs_run_id", "reproduction_jobs", ["run_id"])
    op.create_index("ix_reproduction_jobs_state_created_at", "reproduction_jobs", ["state", "created_at"])
    op.create_index(
        "uq_reproduction_jobs_open_run_model",
        "reproduction_jobs",
        ["run_id", "model_uri"],
        unique=True,
        postgresql_where=_OPEN,
        sqlite_where=_OPEN,
    )


def downgrade() -> None:
    op.drop_index("uq_reproduction_jobs_open_run_model", table_name="reproduction_jobs")
    op.drop_index("ix_reproduction_jobs_state_created_at", table_name="reproduction_jobs")
    op.drop_index("ix_reproduction_jobs_run_id", table_name="reproduction_jobs")
    op.drop_index("ix_reproduction_jobs_project_id_created_at", table_name="reproduction_jobs")
    op.drop_table("reproduction_jobs")
    if op.get_bind().dialect.name == "sqlite":
        # SQLite's own DROP COLUMN (3.35+): batch mode would copy runs into a new table and drop the
        # old one, and with foreign keys on that drop cascades into every table referencing runs.
        op.execute("ALTER TABLE runs DROP COLUMN model_uri")
    else:
        op.drop_column("runs", "model_uri")
