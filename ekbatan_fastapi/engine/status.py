"""Snapshots of a scheduler instance's own state, for ``/jobs`` and for logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["ExecutionStatus", "SchedulerStatus"]


@dataclass(frozen=True)
class ExecutionStatus:
    """An execution running on this instance."""

    task_name: str
    task_instance: str
    execution_time: datetime
    started: datetime
    version: int
    fraction_dead: float
    failed_heartbeats: int


@dataclass(frozen=True)
class SchedulerStatus:
    """This instance: is it up, does it reach the database, what does it run."""

    name: str
    started_at: datetime | None
    ready: bool
    stopping: bool
    database_reachable: bool | None
    """None until the first round trip was attempted; False while the database does not
    answer (an error that is its answer, such as read-only, leaves it True)."""
    last_error: str | None
    """The last error, kept after recovery: ``condition`` says whether it still holds."""
    last_successful_poll: datetime | None
    polling_strategy: str
    batch_size: int
    loop_restarts: int
    condition: str = "unknown"
    """Now: ``ok``, or what the last error means (``unreachable``, ``timeout``, ``read-only``,
    ``pooler``, ``schema-missing``, ``lock-wait``, ``error``, ``loop-crashed``)."""
    condition_since: datetime | None = None
    last_error_at: datetime | None = None
    loop_lag_events: int = 0
    """How often the event loop was found blocked for longer than the lag threshold."""
    max_loop_lag: float = 0.0
    """The longest blocked stretch seen, in seconds."""
    last_loop_lag_at: datetime | None = None
    running: list[ExecutionStatus] = field(default_factory=list)
