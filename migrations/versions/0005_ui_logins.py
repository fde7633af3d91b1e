"""Page logins: browser sessions and one-time login links (issue 16: pages need a login by default).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("revoked_at", _TS, nullable=True),
        _fk("ui_sessions", "project_id", "projects"),
        _fk("ui_sessions", "token_id", "api_tokens"),
        sa.PrimaryKeyConstraint("id", name="pk_ui_sessions"),
        sa.UniqueConstraint("secret_hash", name="uq_ui_sessions_secret_hash"),
    )
    op.create_index("ix_ui_sessions_project_id", "ui_sessions", ["project_id"])
    op.create_index("ix_ui_sessions_token_id", "ui_sessions", ["token_id"])
    op.create_table(
        "ui_login_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("code_hash", sa.String(64), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=True),
        sa.Column("label", sa.String(128), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("used_at", _TS, nullable=True),
        _fk("ui_login_links", "project_id", "projects"),
        sa.PrimaryKeyConstraint("id", name="pk_ui_login_links"),
        sa.UniqueConstraint("code_hash", name="uq_ui_login_links_code_hash"),
    )
    op.create_index("ix_ui_login_links_project_id", "ui_login_links", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_ui_login_links_project_id", table_name="ui_login_links")
    op.drop_table("ui_login_links")
    op.drop_index("ix_ui_sessions_token_id", table_name="ui_sessions")
    op.drop_index("ix_ui_sessions_project_id", table_name="ui_sessions")
    op.drop_table("ui_sessions")
