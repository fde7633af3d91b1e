"""The signature engine's public API, the functions the service and the CLI call.

::

    from moeproxy.signatures.api import RunMetrics, load_library, triage, consistency, warm

    library = load_library()                 # MOEPROXY_FINGERPRINTS or the shipped library
    warm()                                   # compile DTW once at start-up (~6-9 s)
    run = RunMetrics.from_columns(metrics, framework="verl")   # {name: {"steps", "values"}}
    result = triage(run, library, run_id=42)
    result.to_dict()                         # the SPEC section 5 triage object
    result.to_dict(details=True)             # + fingerprint id, per-metric scores, change points
    consistency(run_a, run_b).to_dict()      # POST /api/v1/consistency body
    expected_traces(sig, library.get(candidate.fingerprint_id))   # plot overlays in run units

Everything here is pure (numpy/scipy/tslearn/ruptures/statsmodels).
"""

from moeproxy.signatures.canonical import CanonicalRun, RunMetrics, canonicalise, load_run
from moeproxy.signatures.consistency import ConsistencyReport, consistency
from moeproxy.signatures.dtw import warm
from moeproxy.signatures.errors import InvalidLibrary, InvalidRun, SignatureError, UnknownFaultClass
from moeproxy.signatures.features import RunSignature, run_signature
from moeproxy.signatures.fingerprint import (
    Fingerprint,
    FingerprintLibrary,
    describe,
    library_from_dict,
    load_library,
    resolve_library_path,
    save_library,
)
from moeproxy.signatures.matching import Candidate, TriageResult, class_onset, expected_traces, triage
from moeproxy.signatures.settings import RunSettings, settings_from_config

__all__ = [
    "Candidate",
    "CanonicalRun",
    "ConsistencyReport",
    "Fingerprint",
    "FingerprintLibrary",
    "InvalidLibrary",
    "InvalidRun",
    "RunMetrics",
    "RunSettings",
    "RunSignature",
    "SignatureError",
    "TriageResult",
    "UnknownFaultClass",
    "canonicalise",
    "class_onset",
    "consistency",
    "describe",
    "expected_traces",
    "library_from_dict",
    "load_library",
    "load_run",
    "resolve_library_path",
    "run_signature",
    "save_library",
    "settings_from_config",
    "triage",
    "warm",
]
