"""Metric aliases for the names TRL logs beside the mean (length extremes, length clipping, per-side
clip ratios, importance-ratio extremes) and verl's counterparts.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

A frozen copy, as in 0002: the entries added to ``moeproxy.signatures.vocabulary`` on this date.
Pairs already present (a user's own global alias of the same name) are left as they are.
"""

from __future__ import annotations

import importlib

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The helper of 0002 (a module name that starts with a digit is imported by path).
_seed = importlib.import_module("moeproxy.migrations.versions.0002_seed_metric_aliases")

ALIASES_0006: tuple[tuple[str, str, str], ...] = (
    ("verl", "response_length/min", "response_length_min"),
    ("trl", "completions/min_length", "response_length_min"),
    ("verl", "response_length/max", "response_length_max"),
    ("trl", "completions/max_length", "response_length_max"),
    ("verl", "response_length/clip_ratio", "length_clip_ratio"),
    ("trl", "completions/clipped_ratio", "length_clip_ratio"),
    ("trl", "clip_ratio/low_mean", "clip_frac_low"),
    ("trl", "clip_ratio/high_mean", "clip_frac_high"),
    ("verl", "rollout_corr/rollout_is_min", "importance_ratio_min"),
    ("trl", "sampling/importance_sampling_ratio/min", "importance_ratio_min"),
    ("verl", "rollout_corr/rollout_is_max", "importance_ratio_max"),
    ("trl", "sampling/importance_sampling_ratio/max", "importance_ratio_max"),
)


def upgrade() -> None:
    _seed.insert_global_aliases(ALIASES_0006)


def downgrade() -> None:
    _seed.delete_global_aliases(ALIASES_0006)
