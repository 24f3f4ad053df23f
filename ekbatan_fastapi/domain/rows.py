"""Plain values that cross the store boundary: rows of ``scheduled_tasks`` and the results to
write into them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from typing import NamedTuple

__all__ = [
    "PARKED_TIME",
    "RECURRING_INSTANCE",
    "Finish",
    "FinishKind",
    "NewTask",
    "Owned",
    "PollResult",
    "PollingStrategy",
    "Revival",
    "TaskKey",
    "TaskRow",
]

RECURRING_INSTANCE = "recurring"
"""The ``task_instance`` of a recurring job's single row (db-scheduler's convention)."""

PARKED_TIME = datetime(9999, 1, 1, tzinfo=UTC)
"""The ``execution_time`` of a parked row (a typed job's data that no longer fits its model):
no poll reaches it; ``reschedule`` (with fixed data) moves it back, ``cancel`` drops it. A
year short of the column types' end, so that adding to it cannot overflow."""

TaskKey = tuple[str, str]
"""``(task_name, task_instance)``: the primary key."""


class TaskRow(NamedTuple):
    """One row of ``scheduled_tasks`` as read (timestamps aware, in UTC). A named tuple, as
    ``Owned`` and ``Finish``: made once per execution on the hot path, where a frozen
    dataclass costs several times as much to build."""

    task_name: str
    task_instance: str
    task_data: bytes | None
    execution_time: datetime
    picked: bool
    picked_by: str | None
    last_success: datetime | None
    last_failure: datetime | None
    consecutive_failures: int | None
    last_heartbeat: datetime | None
    version: int
    priority: int | None

    @property
    def key(self) -> TaskKey:
        return (self.task_name, self.task_instance)


@dataclass(frozen=True, slots=True)
class NewTask:
    """A row to insert (unpicked, version 1)."""

    task_name: str
    task_instance: str
    execution_time: datetime | None
    """None: the database's now (only where the repository method says so)."""
    task_data: bytes | None = None
    priority: int = 0


class Owned(NamedTuple):
    """An execution this instance holds: the row's key and the version our claim wrote."""

    task_name: str
    task_instance: str
    version: int

    @property
    def key(self) -> TaskKey:
        return (self.task_name, self.task_instance)


class FinishKind(IntEnum):
    """How an owned row is released (the SQL uses the numbers)."""

    SUCCEEDED = 0
    """Reschedule to ``next_time``; ``last_success=now``, ``consecutive_failures=0``."""
    FAILED = 1
    """Reschedule to ``next_time``; ``last_failure=now``, ``consecutive_failures+1``."""
    RELEASED = 2
    """Unpick, keep ``execution_time`` and counters (an execution cancelled at shutdown)."""
    DELETED = 3
    """Delete the row (a one-time instance that succeeded or was given up)."""
    SKIPPED = 4
    """Reschedule to ``next_time``, counters unchanged: the catch-up policy ran nothing."""


class Finish(NamedTuple):
    """The result of one execution, to be recorded if the row is still ours."""

    owned: Owned
    kind: FinishKind
    next_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class PollResult:
    """Rows this instance claimed, the database's clock, and the earliest due time of a row
    left unpicked: in the future, or at most ``db_now`` when a due row was left to a peer's lock
    (see ``TaskStore.poll``)."""

    claimed: list[TaskRow]
    db_now: datetime
    next_due: datetime | None
    more_due: bool = False
    """The poll saw a full batch of due rows (claimed or lost to a peer): poll again now."""


@dataclass(frozen=True, slots=True)
class Revival:
    """What a dead-execution check found: the rows it revived (as they were before: ``picked_by``
    names the instance presumed dead) and when the next picked row would be dead if its
    heartbeats stopped now (None: no picked row, or the dialect cannot tell)."""

    revived: list[TaskRow]
    next_death: datetime | None


class PollingStrategy(StrEnum):
    """How due rows are claimed."""

    FETCH = "fetch"
    """Select due rows, then claim them with a version-guarded update (db-scheduler's default)."""
    LOCK_AND_FETCH = "lock-and-fetch"
    """Claim in one statement with ``FOR UPDATE SKIP LOCKED``."""
