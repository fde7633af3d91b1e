"""Metric aliases for names earlier framework releases logged: verl up to 0.2 (``critic/kl``, the
in-reward KL to the reference, and ``actor/entropy_loss``, the entropy), verl's later name for the
in-reward KL (``actor/reward_kl_penalty``), TRL up to 0.15 (``completion_length``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

A frozen copy, as in 0002: the entries added to ``moeproxy.signatures.vocabulary`` on this date.
Pairs already present (a user's own global alias of the same name) are left as they are.
"""

from __future__ import annotations

import importlib

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The helper of 0002 (a module name that starts with a digit is imported by path).
_seed = importlib.import_module("moeproxy.migrations.versions.0002_seed_metric_aliases")

ALIASES_0009: tuple[tuple[str, str, str], ...] = (
    ("verl", "actor/reward_kl_penalty", "kl"),
    ("verl", "critic/kl", "kl"),
    ("verl", "actor/entropy_loss", "entropy"),
    ("trl", "completion_length", "response_length"),
)


def upgrade() -> None:
    _seed.insert_global_aliases(ALIASES_0009)


def downgrade() -> None:
    _seed.delete_global_aliases(ALIASES_0009)
