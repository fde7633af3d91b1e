"""The metric aliases for what ``MoeproxyCallback`` measures of the policy's weights around each
optimizer step (moeproxy/integrations/weight_probe.py), for any framework:
``moeproxy/update_ratio`` -> ``update_ratio``, ``moeproxy/update_ratio_min`` -> ``update_ratio_min``,
``moeproxy/outside_change`` -> ``outside_change``, ``moeproxy/router_outside_change`` ->
``router_outside_change``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07

A frozen copy, as in 0002: the entries added to ``moeproxy.signatures.vocabulary`` on this date.
A pair already present (a user's own global alias of the same name) is left as it is.
"""

from __future__ import annotations

import importlib

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# The helper of 0002 (a module name that starts with a digit is imported by path).
_seed = importlib.import_module("moeproxy.migrations.versions.0002_seed_metric_aliases")

ALIASES_0011: tuple[tuple[str, str, str], ...] = (
    ("*", "moeproxy/update_ratio", "update_ratio"),
    ("*", "moeproxy/update_ratio_min", "update_ratio_min"),
    ("*", "moeproxy/outside_change", "outside_change"),
    ("*", "moeproxy/router_outside_change", "router_outside_change"),
)


def upgrade() -> None:
    _seed.insert_global_aliases(ALIASES_0011)


def downgrade() -> None:
    _seed.delete_global_aliases(ALIASES_0011)
