"""Metric aliases: framework metric name -> canonical name (SPEC section 4), seeded and user-extended."""
