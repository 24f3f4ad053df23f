"""Benchmarks for ekbatan-fastapi (not part of the test suite's pass/fail; see README.md)."""
