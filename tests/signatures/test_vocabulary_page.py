"""docs/vocabulary.md is generated from the vocabulary and must not drift from it."""

from __future__ import annotations

from pathlib import Path

from moeproxy.signatures.vocabulary import CANONICAL_METRICS, DEFAULT_ALIASES, vocabulary_markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "vocabulary.md"


def test_the_vocabulary_page_is_the_vocabulary():
    assert PAGE.read_text() == vocabulary_markdown(), (
        "docs/vocabulary.md is stale: python -m moeproxy.signatures.vocabulary > docs/vocabulary.md"
    )
    text = PAGE.read_text()
    assert all(f"`{name}`" in text for name in CANONICAL_METRICS)
    assert all(f"`{alias.name}`" in text for alias in DEFAULT_ALIASES)
