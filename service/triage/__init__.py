"""Live triage: re-running the signature engine on a run as its metrics arrive (SPEC section 5).

Owns the stored evaluations (``triage_evaluations``), the per-class history (when a class first
became likely / first ranked first), the debounced background scheduler that the post-ingest
event wakes, and ``GET /api/v1/runs/{id}/triage``.  It calls :mod:`moeproxy.signatures` (a pure
library) and hands strong classes to :mod:`moeproxy.service.alerts`; nothing below the service
imports it.
"""
