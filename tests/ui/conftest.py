"""Fixtures for the triage, page and browser tests.

``fingerprint_library`` is a small library built once per session with the signature engine
from synthetic fault traces (seeds 1-3); tests post *held-out* traces (other seeds, onsets,
magnitudes, lengths) and expect their class ranked first.
"""

from __future__ import annotations

import pytest

from ui_helpers import ingest_body

LIBRARY_CLASSES = (
    "healthy",
    "rollout_logp_precision",
    "gradient_overflow",
    "lr_misconfiguration",
    "stale_weight_sync",
    "reward_fault",
)
LIBRARY_SEEDS = (1, 2, 3)


@pytest.fixture(scope="session")
def fingerprint_library(tmp_path_factory):
    from moeproxy.signatures.api import FingerprintLibrary, save_library
    from moeproxy.signatures.build import build_fingerprint
    from moeproxy.signatures.synthetic import synthetic_run

    fingerprints = []
    for fault_class in LIBRARY_CLASSES:
        runs = [synthetic_run(fault_class, steps=60, onset=20, seed=s) for s in LIBRARY_SEEDS]
        twins = (
            []
            if fault_class == "healthy"
            else [synthetic_run("healthy", steps=60, onset=20, seed=s) for s in LIBRARY_SEEDS]
        )
        fingerprints.append(build_fingerprint(fault_class, runs, twins))
    return save_library(FingerprintLibrary(tuple(fingerprints)), tmp_path_factory.mktemp("library"))


OPERATOR_TOKEN = "operator-login-for-tests"


@pytest.fixture
def ui_app(database, fingerprint_library):
    from moeproxy.service.app import create_app

    from moeproxy.config import Settings

    return create_app(
        Settings(database_url="sqlite://", fingerprints=fingerprint_library, ui_token=OPERATOR_TOKEN),
        database=database,
    )


@pytest.fixture
def ui_client(ui_app):
    """A client logged into the pages as the operator (every project), as the pages need a login."""
    from fastapi.testclient import TestClient

    with TestClient(ui_app) as c:
        login = c.post("/login", data={"token": OPERATOR_TOKEN}, follow_redirects=False)
        assert login.status_code == 303 and c.cookies.get("moeproxy_ui"), login.text
        yield c


@pytest.fixture
def shipped_client(database):
    """A client logged in to a service that triages with the shipped library (every fault class;
    ``fingerprint_library`` has six)."""
    from fastapi.testclient import TestClient
    from moeproxy.service.app import create_app

    from moeproxy.config import Settings

    app = create_app(Settings(database_url="sqlite://", fingerprints=None, ui_token=OPERATOR_TOKEN), database=database)
    with TestClient(app) as c:
        assert c.post("/login", data={"token": OPERATOR_TOKEN}, follow_redirects=False).status_code == 303
        yield c


@pytest.fixture
def post_run(ui_client, auth):
    """``post_run(run_metrics, name, project=...) -> run id``: create the run and ingest its steps."""

    def post(run, name: str, *, project: str = "test-project", framework: str = "verl") -> int:
        headers = auth(project)
        created = ui_client.post("/api/v1/runs", json={"name": name, "framework": framework}, headers=headers)
        assert created.status_code in (200, 201), created.text
        run_id = created.json()["id"]
        response = ui_client.post(f"/api/v1/runs/{run_id}/metrics", json=ingest_body(run), headers=headers)
        assert response.status_code == 200, response.text
        return run_id

    return post
