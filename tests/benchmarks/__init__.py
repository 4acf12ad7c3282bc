"""Benchmarks that print figures (not tests: nothing here is collected)."""
