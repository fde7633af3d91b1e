"""Alias storage and resolution.

Global aliases (``project_id`` NULL) are seeded by migrations from
:data:`moeproxy.signatures.vocabulary.DEFAULT_ALIASES`; a project adds its own
over the API, and a project alias overrides a global one for the same
(framework, name).  Resolution follows the vocabulary's rules
(:func:`~moeproxy.signatures.vocabulary.alias_index`: a known framework uses
only its own and ``"*"`` entries) and its ``canonical_name`` fallbacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from moeproxy.service.aliases.models import MetricAliasRow
from moeproxy.signatures.vocabulary import DEFAULT_ALIASES, MetricAlias, alias_index, canonical_name
from sqlalchemy import or_, select
from sqlalchemy.orm import Session


def list_aliases(session: Session, project_id: int, *, framework: str | None = None) -> list[MetricAliasRow]:
    """Global and the project's own aliases (global first), optionally for one framework."""
    query = select(MetricAliasRow).where(
        or_(MetricAliasRow.project_id.is_(None), MetricAliasRow.project_id == project_id)
    )
    if framework is not None:
        query = query.where(MetricAliasRow.framework.in_([framework, "*"]))
    query = query.order_by(
        MetricAliasRow.project_id.is_not(None), MetricAliasRow.framework, MetricAliasRow.name
    )
    return list(session.scalars(query).all())


def add_alias(session: Session, project_id: int, framework: str, name: str, canonical: str) -> tuple[MetricAliasRow, bool]:
    """Create or replace the project's alias for (framework, name); ``(row, created)``."""
    row = session.scalar(
        select(MetricAliasRow).where(
            MetricAliasRow.project_id == project_id,
            MetricAliasRow.framework == framework,
            MetricAliasRow.name == name,
        )
    )
    if row is not None:
        row.canonical = canonical
        session.flush()
        return row, False
    row = MetricAliasRow(project_id=project_id, framework=framework, name=name, canonical=canonical)
    session.add(row)
    session.flush()
    return row, True


def effective_aliases(session: Session, project_id: int, framework: str | None = None) -> list[MetricAlias]:
    """Aliases as vocabulary dataclasses, project entries after global ones so they win in an index.

    Global entries come in the vocabulary's own order (``DEFAULT_ALIASES``), not the table's: where
    a run logs two names of one canonical metric (verl's ``training/rollout_probs_diff_mean`` and
    ``rollout_corr/log_ppl_diff``), canonicalisation keeps the one listed first, and the service
    must keep the same one as the library's own triage, or a fingerprint built on one meaning is
    compared with the other."""
    rank = _vocabulary_rank()
    rows = sorted(list_aliases(session, project_id, framework=framework),
                  key=lambda r: (r.project_id is not None, rank.get((r.framework, r.name), len(rank)),
                                 r.framework, r.name))
    return [MetricAlias(framework=row.framework, name=row.name, canonical=row.canonical) for row in rows]


@lru_cache(maxsize=1)
def _vocabulary_rank() -> dict[tuple[str, str], int]:
    return {(a.framework, a.name): i for i, a in enumerate(DEFAULT_ALIASES)}


def alias_map(session: Session, project_id: int, framework: str | None) -> dict[str, str]:
    """name -> canonical for a run of ``framework`` (None: every framework's names)."""
    return alias_index(effective_aliases(session, project_id, framework), framework)


def canonical_names(
    session: Session, project_id: int, framework: str | None, names: Iterable[str]
) -> dict[str, str]:
    """Each logged name -> its canonical name (unknown names map to themselves)."""
    index = alias_map(session, project_id, framework)
    return {name: canonical_name(name, index) for name in names}
