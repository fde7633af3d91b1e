"""Live triage evaluations and class history, the alert outbox, MLflow experiments and runs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=f"fk_{table}_run_id_runs", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "triage_evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("first_evaluated_at", _TS, nullable=False),
        sa.Column("evaluated_at", _TS, nullable=False),
        sa.Column("evaluations", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(128), nullable=False),
        sa.Column("top_score", sa.Float(), nullable=False),
        sa.Column("top_strength", sa.String(16), nullable=False),
        sa.Column("outcome_key", sa.String(64), nullable=False),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        _run_fk("triage_evaluations"),
        sa.PrimaryKeyConstraint("id", name="pk_triage_evaluations"),
    )
    op.create_index("ix_triage_evaluations_run_id_id", "triage_evaluations", ["run_id", "id"])
    op.create_table(
        "triage_class_history",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("fault_class", sa.String(128), nullable=False),
        sa.Column("first_likely_at", _TS, nullable=True),
        sa.Column("first_likely_step", sa.Integer(), nullable=True),
        sa.Column("first_top_at", _TS, nullable=True),
        sa.Column("first_top_step", sa.Integer(), nullable=True),
        sa.Column("last_score", sa.Float(), nullable=False),
        sa.Column("last_strength", sa.String(16), nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        _run_fk("triage_class_history"),
        sa.PrimaryKeyConstraint("run_id", "fault_class", name="pk_triage_class_history"),
    )
    op.create_table(
        "alert_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("fault_class", sa.String(128), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", _TS, nullable=False),
        sa.Column("lease_until", _TS, nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("sent_at", _TS, nullable=True),
        _run_fk("alert_outbox"),
        sa.PrimaryKeyConstraint("id", name="pk_alert_outbox"),
        sa.UniqueConstraint(
            "run_id",
            "fault_class",
            "level",
            "channel",
            name="uq_alert_outbox_run_id_fault_class_level_channel",
        ),
    )
    op.create_index("ix_alert_outbox_status_next_attempt_at", "alert_outbox", ["status", "next_attempt_at"])
    op.create_table(
        "mlflow_experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("artifact_location", sa.String(512), nullable=False),
        sa.Column("lifecycle_stage", sa.String(16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name="fk_mlflow_experiments_project_id_projects",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_mlflow_experiments"),
        sa.UniqueConstraint("project_id", "name", name="uq_mlflow_experiments_project_id_name"),
    )
    op.create_table(
        "mlflow_runs",
        sa.Column("run_uuid", sa.String(32), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("run_name", sa.String(256), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("start_time", sa.BigInteger(), nullable=False),
        sa.Column("end_time", sa.BigInteger(), nullable=True),
        sa.Column("lifecycle_stage", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        _run_fk("mlflow_runs"),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["mlflow_experiments.id"],
            name="fk_mlflow_runs_experiment_id_mlflow_experiments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_uuid", name="pk_mlflow_runs"),
    )
    op.create_index("ix_mlflow_runs_run_id", "mlflow_runs", ["run_id"])
    op.create_index("ix_mlflow_runs_experiment_id", "mlflow_runs", ["experiment_id"])


def downgrade() -> None:
    op.drop_index("ix_mlflow_runs_experiment_id", table_name="mlflow_runs")
    op.drop_index("ix_mlflow_runs_run_id", table_name="mlflow_runs")
    op.drop_table("mlflow_runs")
    op.drop_table("mlflow_experiments")
    op.drop_index("ix_alert_outbox_status_next_attempt_at", table_name="alert_outbox")
    op.drop_table("alert_outbox")
    op.drop_table("triage_class_history")
    op.drop_index("ix_triage_evaluations_run_id_id", table_name="triage_evaluations")
    op.drop_table("triage_evaluations")
