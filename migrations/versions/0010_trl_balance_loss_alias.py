"""The metric alias for the MoE load-balancing loss TRL logs: ``aux_loss`` (GRPOTrainer, when the
model's ``router_aux_loss_coef`` is not 0) -> ``balance_loss``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07

A frozen copy, as in 0002: the entry added to ``moeproxy.signatures.vocabulary`` on this date.
A pair already present (a user's own global alias of the same name) is left as it is.
"""

from __future__ import annotations

import importlib

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The helper of 0002 (a module name that starts with a digit is imported by path).
_seed = importlib.import_module("moeproxy.migrations.versions.0002_seed_metric_aliases")

ALIASES_0010: tuple[tuple[str, str, str], ...] = (
    ("trl", "aux_loss", "balance_loss"),
)


def upgrade() -> None:
    _seed.insert_global_aliases(ALIASES_0010)


def downgrade() -> None:
    _seed.delete_global_aliases(ALIASES_0010)
