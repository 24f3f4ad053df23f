"""The chaos harness: fault injection on real scheduler processes, and an audit of what they did.

A test harness, not a benchmark: ``tests/test_chaos.py`` runs its scenarios in their short
versions (marker ``chaos``), and ``python -m tests.chaos SCENARIO`` runs one by hand (the long
versions and their results: docs/RELIABILITY.md).

- ``run.py``: the command line, one scenario's run and its report (``python -m tests.chaos``);
- ``cluster.py``: the processes (plain registries, ``worker.py``, and uvicorn processes of the
  example app), each behind its own loopback proxy, and the faults done to them;
- ``scenarios.py``, ``effects.py``, ``deploy.py``: the scenarios (faults on a timetable);
- ``jobs.py``: the jobs the processes run, each writing a ledger line per execution;
- ``audit.py``: the checks on the ledger and the rows left in ``scheduled_tasks``.
"""
