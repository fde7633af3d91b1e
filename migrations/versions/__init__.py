"""Alembic revision scripts (a package so that wheels include them)."""
