"""The 30-second soak of benchmarks/soak.py in CI (issue 16): counts only, never times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_a_short_soak_loses_nothing_and_answers_no_5xx(postgres_url):
    import soak

    result = soak.run(duration_s=30, writers=8, workers=2, steps_per_s=5, slow_bodies=2, base_url=postgres_url)
    assert result["points_sent"] > 0 and not result["runs_missing"]
    assert result["points_lost"] == 0 and result["points_duplicated"] == 0
    assert result["server_errors"] == 0, result["statuses"]
    assert set(result["statuses"]) <= {"200", "201", "303", "429"}, result["statuses"]
