"""Seed the global metric aliases (SPEC section 4) from the signature engine's vocabulary.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Inserts the vocabulary as it was at this revision (a frozen copy: a migration
must do the same thing whenever it runs, so it does not import the live
``DEFAULT_ALIASES``), skipping any (framework, name) already present. Entries
added to the vocabulary later ship in their own migration (same helper), so an
existing database gets them on ``moeproxy db upgrade``;
``tests/service/test_service_aliases.py`` fails when the vocabulary and the
migrations disagree.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_aliases = sa.table(
    "metric_aliases",
    sa.column("project_id", sa.Integer()),
    sa.column("framework", sa.String()),
    sa.column("name", sa.String()),
    sa.column("canonical", sa.String()),
    sa.column("created_at", sa.DateTime(timezone=True)),
)


def insert_global_aliases(aliases) -> None:
    """Insert global (framework, name, canonical) aliases, leaving existing (framework, name) pairs as they are."""
    bind = op.get_bind()
    existing = set(
        bind.execute(sa.select(_aliases.c.framework, _aliases.c.name).where(_aliases.c.project_id.is_(None))).all()
    )
    now = datetime.now(UTC)
    rows = [
        {"project_id": None, "framework": framework, "name": name, "canonical": canonical, "created_at": now}
        for framework, name, canonical in aliases
        if (framework, name) not in existing
    ]
    # Deduplicate within the tuple itself (last entry wins), then insert.
    unique = {(r["framework"], r["name"]): r for r in rows}
    if unique:
        op.bulk_insert(_aliases, list(unique.values()))


def delete_global_aliases(aliases) -> None:
    """Delete the global aliases of these (framework, name, canonical) entries: a later revision's
    downgrade (0002's own removes every global alias)."""
    for framework, name, _ in aliases:
        op.execute(_aliases.delete().where(_aliases.c.project_id.is_(None), _aliases.c.framework == framework,
                                           _aliases.c.name == name))


#: (framework, name, canonical) of ``moeproxy.signatures.vocabulary.DEFAULT_ALIASES`` on 2026-12-02.
ALIASES_0002: tuple[tuple[str, str, str], ...] = (
    ('verl', 'critic/score/mean', 'reward_mean'),
    ('verl', 'critic/rewards/mean', 'reward_mean'),
    ('trl', 'reward', 'reward_mean'),
    ('openrlhf', 'train/reward', 'reward_mean'),
    ('mindspeed_rl', 'grpo/score/mean', 'reward_mean'),
    ('trl', 'reward_std', 'reward_std'),
    ('verl', 'critic/score/std', 'reward_std'),
    ('verl', 'critic/rewards/std', 'reward_std'),
    ('openrlhf', 'train/reward_std', 'reward_std'),
    ('verl', 'actor/kl_loss', 'kl'),
    ('trl', 'kl', 'kl'),
    ('openrlhf', 'train/kl', 'kl'),
    ('mindspeed_rl', 'actor/kl_loss', 'kl'),
    ('verl', 'actor/ppo_kl', 'ppo_kl'),
    ('openrlhf', 'train/ppo_kl', 'ppo_kl'),
    ('mindspeed_rl', 'actor/ppo_kl', 'ppo_kl'),
    ('verl', 'training/rollout_probs_diff_mean', 'rollout_train_logp_diff'),
    ('verl', 'rollout_corr/log_ppl_diff', 'rollout_train_logp_diff'),
    ('trl', 'sampling/sampling_logp_difference/mean', 'rollout_train_logp_diff'),
    ('verl', 'rollout_corr/kl', 'rollout_kl'),
    ('verl', 'rollout_corr/k3_kl', 'rollout_kl'),
    ('openrlhf', 'train/vllm_kl', 'rollout_kl'),
    ('verl', 'training/rollout_probs_diff_std', 'rollout_train_logp_diff_std'),
    ('verl', 'training/rollout_probs_diff_max', 'rollout_train_logp_diff_max'),
    ('trl', 'sampling/sampling_logp_difference/max', 'rollout_train_logp_diff_max'),
    ('verl', 'rollout_corr/rollout_is_mean', 'importance_ratio'),
    ('verl', 'rollout_corr/is_mean', 'importance_ratio'),
    ('trl', 'sampling/importance_sampling_ratio/mean', 'importance_ratio'),
    ('verl', 'actor/entropy', 'entropy'),
    ('trl', 'entropy', 'entropy'),
    ('openrlhf', 'train/entropy_loss', 'entropy'),
    ('mindspeed_rl', 'actor/entropy', 'entropy'),
    ('verl', 'actor/grad_norm', 'grad_norm'),
    ('trl', 'grad_norm', 'grad_norm'),
    ('openrlhf', 'train/actor_grad_norm', 'grad_norm'),
    ('mindspeed_rl', 'grad_norm', 'grad_norm'),
    ('verl', 'actor/pg_loss', 'pg_loss'),
    ('trl', 'loss', 'pg_loss'),
    ('openrlhf', 'train/policy_loss', 'pg_loss'),
    ('mindspeed_rl', 'actor/pg_loss', 'pg_loss'),
    ('verl', 'actor/pg_clipfrac', 'clip_frac'),
    ('trl', 'clip_ratio/region_mean', 'clip_frac'),
    ('openrlhf', 'train/ppo_clip_ratio', 'clip_frac'),
    ('mindspeed_rl', 'actor/pg_clipfrac', 'clip_frac'),
    ('verl', 'response_length/mean', 'response_length'),
    ('trl', 'completions/mean_length', 'response_length'),
    ('openrlhf', 'train/response_length', 'response_length'),
    ('verl', 'actor/lr', 'lr'),
    ('trl', 'learning_rate', 'lr'),
    ('openrlhf', 'train/actor_lr', 'lr'),
    ('mindspeed_rl', 'actor/lr', 'lr'),
    ('verl', 'critic/advantages/mean', 'advantage_mean'),
    ('openrlhf', 'train/advantages_mean', 'advantage_mean'),
    ('verl', 'moe/routing_agreement', 'routing_agreement'),
    ('verl', 'moe/expert_entropy', 'expert_entropy'),
    ('verl', 'critic/vf_loss', 'value_loss'),
    ('openrlhf', 'train/critic_loss', 'value_loss'),
    ('verl', 'critic/score/zero_std_frac', 'zero_std_frac'),
    ('trl', 'frac_reward_zero_std', 'zero_std_frac'),
    ('verl', 'timing_s/step', 'step_time_s'),
    ('verl', 'perf/peak_memory_mb', 'peak_memory_mb'),
)


def upgrade() -> None:
    insert_global_aliases(ALIASES_0002)


def downgrade() -> None:
    op.execute(_aliases.delete().where(_aliases.c.project_id.is_(None)))
