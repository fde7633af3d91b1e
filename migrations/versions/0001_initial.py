"""Initial schema: projects, tokens, runs, metric names and points, metric aliases.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("name", name="uq_projects_name"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("label", sa.String(128), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_api_tokens_project_id_projects", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.create_index("ix_api_tokens_project_id", "api_tokens", ["project_id"])
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("framework", sa.String(64), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name="fk_runs_project_id_projects", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.UniqueConstraint("project_id", "name", name="uq_runs_project_id_name"),
    )
    op.create_index("ix_runs_project_id_created_at", "runs", ["project_id", "created_at"])
    op.create_table(
        "metric_names",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_metric_names_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_metric_names"),
        sa.UniqueConstraint("run_id", "name", name="uq_metric_names_run_id_name"),
    )
    # No foreign key on metric_id: see service/metrics/models.py (ingest throughput).
    op.create_table(
        "metric_points",
        sa.Column("metric_id", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("step", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("metric_id", "step", name="pk_metric_points"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "metric_aliases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("framework", sa.String(64), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("canonical", sa.String(128), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_metric_aliases_project_id_projects", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_metric_aliases"),
    )
    op.create_index(
        "uq_metric_aliases_global",
        "metric_aliases",
        ["framework", "name"],
        unique=True,
        sqlite_where=sa.text("project_id IS NULL"),
        postgresql_where=sa.text("project_id IS NULL"),
    )
    op.create_index(
        "uq_metric_aliases_project",
        "metric_aliases",
        ["project_id", "framework", "name"],
        unique=True,
        sqlite_where=sa.text("project_id IS NOT NULL"),
        postgresql_where=sa.text("project_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_table("metric_aliases")
    op.drop_table("metric_points")
    op.drop_table("metric_names")
    op.drop_index("ix_runs_project_id_created_at", table_name="runs")
    op.drop_table("runs")
    op.drop_index("ix_api_tokens_project_id", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("projects")
