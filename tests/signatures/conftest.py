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
