"""The service: REST API, storage, live triage, the triage pages, alerts and MLflow-compatible ingestion.

Installed as ``moeproxy.service``.  It is the top stage: it may import
``moeproxy.signatures`` and the torch-free parts of ``moeproxy.reproduction``
(the fault catalogue), but no stage below may import it (``.importlinter``).
One sub-package per domain (runs, metrics, tokens, triage, alerts, ...), each
with ``models.py``, ``schemas.py``, ``repository.py`` and ``router.py``;
handlers hold no SQL, repositories never commit (the request scope does).
"""
