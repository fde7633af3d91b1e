from __future__ import annotations

import pytest
from http_receiver import Receiver


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def alerts_db(tmp_path):
    from moeproxy.service.db import Database

    from moeproxy import migrations

    url = f"sqlite:///{tmp_path / 'alerts.db'}"
    migrations.upgrade(url)
    db = Database(url)
    yield db
    db.dispose()
