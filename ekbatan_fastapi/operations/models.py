"""Values of the operations tables, as the client and the routes show them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["ExecutionRecord", "InstanceInfo", "Outcome", "PauseInfo"]


class Outcome(StrEnum):
    """How an execution ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    """Its row was revived elsewhere meanwhile: its result was not recorded."""
    CANCELLED = "cancelled"
    """Cancelled at shutdown; its slot was released to run again."""


@dataclass(frozen=True)
class ExecutionRecord:
    """One execution in the history."""

    id: int
    task_name: str
    task_instance: str
    execution_time: datetime
    picked_by: str | None
    started_at: datetime
    finished_at: datetime
    outcome: str
    error_class: str | None
    error_message: str | None

    @property
    def duration_seconds(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class PauseInfo:
    """A paused task: who paused it, when and why."""

    task_name: str
    paused_by: str | None
    paused_at: datetime
    reason: str | None


@dataclass(frozen=True)
class InstanceInfo:
    """A scheduler instance as it last reported itself."""

    name: str
    host: str
    pid: int
    started_at: datetime
    last_seen: datetime
    library_version: str
    alive: bool
    """Seen within the dead window (``heartbeat_interval x missed_heartbeats_limit``)."""
