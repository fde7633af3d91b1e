"""Shipped model configs for the planner, typed from public config.json files (see each file's ``_source``)."""
