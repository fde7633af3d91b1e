"""Recorded demo traces (JSONL) posted by ``moeproxy serve --demo``; see moeproxy.demo."""
