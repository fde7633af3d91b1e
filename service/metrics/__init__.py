"""Metric points: bulk idempotent ingestion and reads (SPEC section 5)."""
