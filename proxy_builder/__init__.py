"""Proxy construction (SPEC section 2): routing statistics, the three distance
views and their fusion, frequency-weighted K-Medoids, representative selection,
checkpoint surgery, and the resource planner.

Installed as ``moeproxy.proxy_builder``.  The first stage: it imports no other
stage.  torch/transformers are imported only by the modules that need them
(the planner and the distance/clustering code are torch-free).
"""
