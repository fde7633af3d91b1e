"""moeproxy: tells RL post-training teams what went wrong in a MoE run.

The top-level package holds the command line (:mod:`moeproxy.cli`), the
client for training loops (:mod:`moeproxy.client`) and framework
integrations (:mod:`moeproxy.integrations`).  The stages are installed as
sub-packages: ``moeproxy.proxy_builder`` -> ``moeproxy.reproduction`` ->
``moeproxy.signatures`` -> ``moeproxy.service`` (data flows that way only).
The client and integrations talk to the service over HTTP only.
"""

__version__ = "0.1.0"
