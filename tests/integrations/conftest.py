from __future__ import annotations

import pytest
from live_server import start_live_server


@pytest.fixture
def live_server(tmp_path):
    server = start_live_server(tmp_path, triage_interval_s=0.2)
    yield server
    server.stop()
