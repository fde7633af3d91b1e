"""Fault reproduction: the synthetic task suite, reference models, the GRPO
engine with fault injection, the device abstraction and campaigns.

Installed as ``moeproxy.reproduction``.  It may import
``moeproxy.proxy_builder``; it never imports ``moeproxy.signatures`` or
``moeproxy.service``.
"""
