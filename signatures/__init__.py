"""The signature engine: fingerprints, library format, matching, consistency.

Installed as ``moeproxy.signatures``.  A pure library (numpy, scipy, tslearn,
ruptures, statsmodels): no web framework, no database, no torch, and no import
of ``moeproxy.service``.
"""
