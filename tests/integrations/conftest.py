from __future__ import annotations

import pytest

from live_server import start_live_server


@pytest.fixture
def live_server(fresh_database_url):
    """A real uvicorn over a fresh database, on SQLite and on PostgreSQL."""
    server = start_live_server(fresh_database_url, triage_interval_s=0.2)
    yield server
    server.stop()


@pytest.fixture
def sqlite_live_server(tmp_path):
    """The same on SQLite only (for the slow tests whose SQL is the same as above)."""
    server = start_live_server(f"sqlite:///{tmp_path / 'service.db'}", triage_interval_s=0.2)
    yield server
    server.stop()
