"""The domain: jobs, schedules, execution contexts, rows and records, and the rules that judge
them. Pure Python (no I/O, no SQL, no FastAPI); every other layer builds on it."""
