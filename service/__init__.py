"""The service: REST API, storage, triage page, alerts, jobs and dispatch.

Installed as ``moeproxy.service``.  It is the top stage: it may import
``moeproxy.signatures`` (and, for dispatch, ``moeproxy.reproduction``), but no
stage below may import it.  One sub-package per domain (runs, metrics, tokens,
triage, alerts, ...), each with ``models.py``, ``schemas.py``,
``repository.py`` and ``router.py``; handlers hold no SQL, repositories never
commit (the request scope does).
"""
