"""Fixtures of the signature-engine tests: DTW compiled once per session, and a library built from
synthetic traces with known answers (moeproxy.signatures.synthetic)."""

from __future__ import annotations

import pytest
from moeproxy.signatures import dtw
from moeproxy.signatures.build import build_fingerprint
from moeproxy.signatures.fingerprint import FingerprintLibrary
from moeproxy.signatures.synthetic import INJECTORS, synthetic_run

CLASSES = ("healthy", *INJECTORS)
LIBRARY_SEEDS = (0, 1, 2)
STEPS = 50
ONSET = 15


@pytest.fixture(scope="session", autouse=True)
def warm_dtw() -> None:
    dtw.warm()


@pytest.fixture(scope="session")
def synthetic_library() -> FingerprintLibrary:
    fps = []
    for c in CLASSES:
        runs = [synthetic_run(c, steps=STEPS, onset=ONSET, seed=s) for s in LIBRARY_SEEDS]
        twins = [] if c == "healthy" else [synthetic_run("healthy", steps=STEPS, seed=s) for s in LIBRARY_SEEDS]
        fps.append(build_fingerprint(c, runs, twins, params={"onset": ONSET},
                                     provenance={"source": "synthetic", "seeds": list(LIBRARY_SEEDS)}))
    return FingerprintLibrary(tuple(fps))


#: The fault class and length of the twin-gated fixtures (test_twin_score, test_flat_in_view).
GATED_CLASS = "stale_weight_sync"
GATED_STEPS = 60


@pytest.fixture(scope="module")
def gated_parts():
    """A stale-sync fingerprint built from 3 runs (onset 25) and their 3 healthy twins, the healthy
    fingerprint of those twins, and the runs: (fingerprint, healthy, faults, twins)."""
    twins = [synthetic_run("healthy", steps=GATED_STEPS, seed=s) for s in range(3)]
    faults = [synthetic_run(GATED_CLASS, steps=GATED_STEPS, onset=25, seed=s) for s in range(3)]
    fp = build_fingerprint(GATED_CLASS, faults, twins, params={"onset": 25},
                           fingerprint_id=f"{GATED_CLASS}/onset=25")
    return fp, build_fingerprint("healthy", twins), faults, twins


def class_part(result, fault_class: str) -> float:
    """A class's score before the whole-run findings (``Candidate.before_findings``)."""
    return {c.fault_class: c for c in result.candidates}[fault_class].before_findings
