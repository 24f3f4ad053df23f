"""Testing jobs without a running scheduler (docs/testing.md).

* ``run_job(job, ...)``: one execution with a real ``ExecutionContext`` (slot, data, heartbeat
  state, shutdown flag), with or without a database;
* ``build_jobs(app)``: the application's jobs built with ``app.dependency_overrides``, no
  scheduler started;
* ``TimeMachine``: the real scheduler on a real database under a clock that moves only when
  told: ``advance(to=...)``, ``run_due()``;
* ``ekbatan_fastapi.testing.pytest_plugin``: an embedded PostgreSQL and a fresh database per
  test as pytest fixtures.

Importing this module does not import FastAPI (``build_jobs`` does, when called).
"""

from __future__ import annotations

from ..domain.clock import ManualClock
from ..domain.context import ExecutionContext, HeartbeatState
from .apps import build_jobs
from .run import run_job
from .time_machine import Ran, TimeMachine

__all__ = [
    "ExecutionContext",
    "HeartbeatState",
    "ManualClock",
    "Ran",
    "TimeMachine",
    "build_jobs",
    "run_job",
]
