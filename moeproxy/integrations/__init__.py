"""Drop-in integrations for training frameworks (verl, TRL/transformers, MLflow users).

They use :mod:`moeproxy.client` and talk to the service over HTTP only.
"""
