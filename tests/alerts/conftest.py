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


@pytest.fixture
def run_id(alerts_db):
    """A run of project "rl-team" named "qwen3-grpo" in the alerts database."""
    from moeproxy.service.runs.models import Run
    from moeproxy.service.tokens.models import Project

    with alerts_db.scope() as s:
        project = Project(name="rl-team")
        s.add(project)
        s.flush()
        run = Run(project_id=project.id, name="qwen3-grpo", framework="verl")
        s.add(run)
        s.flush()
        return run.id
