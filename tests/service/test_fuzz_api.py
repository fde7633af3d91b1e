"""Schemathesis against the live app, every operation of the OpenAPI document, on both databases,
with the project's own token and with a foreign project's: no server error, no response outside
the document (status, content type, headers, body schema).

The number of generated cases per operation and token is ``MOEPROXY_FUZZ_EXAMPLES`` (default 20:
about a minute per database on CI; raise it locally for a deeper run). Generation is derandomised so
that a failure on CI reproduces locally.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("MOEPROXY_FUZZ_EXAMPLES", "20"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def test_every_operation_answers_within_its_document(app, client, make_token):
    own, foreign = make_token("fuzz-own"), make_token("fuzz-foreign")
    # Something to find: a run with metrics in the own project (ids 1.. are likely to be drawn).
    headers = {"Authorization": f"Bearer {own}"}
    run_id = client.post("/api/v1/runs", json={"name": "fuzz-run"}, headers=headers).json()["id"]
    client.post(f"/api/v1/runs/{run_id}/metrics", json={"steps": [{"step": 0, "values": {"loss": 1.0}}]}, headers=headers)

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 25
    auth_of = {who: {"Authorization": f"Bearer {token}"} for who, token in (("own", own), ("foreign", foreign))}
    for operation in operations:
        for who in auth_of:

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def call(case):
                case.call_and_validate(headers=auth_of[who], checks=CHECKS)

            try:
                call()
            except Exception as exc:  # collect every operation's failure, not only the first
                failures.append(f"{operation.label} ({who} token): {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
