"""Plain values that cross the store boundary: the rows of ``scheduled_tasks`` and the results
to write into them; the rows of our own tables (execution history, pauses, instances, job
definitions) and how an execution ended (``outcome_of``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum, StrEnum
from operator import itemgetter
from typing import NamedTuple

from .errors import ExecutionCancelled, JobTimedOut

__all__ = [
    "KIND_DELETED",
    "KIND_FAILED",
    "KIND_RELEASED",
    "KIND_SKIPPED",
    "KIND_SUCCEEDED",
    "PARKED_TIME",
    "RECURRING_INSTANCE",
    "ExecutionRecord",
    "Finish",
    "FinishKind",
    "InstanceInfo",
    "JobDefinition",
    "NewTask",
    "Outcome",
    "Own",
    "Owned",
    "PauseInfo",
    "PollResult",
    "PollingStrategy",
    "Revival",
    "TaskKey",
    "TaskRow",
    "outcome_of",
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
        """``(task_name, task_instance)`` (replaced below by a C getter: no Python call)."""
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
        """``(task_name, task_instance)`` (replaced below by a C getter: no Python call)."""
        return (self.task_name, self.task_instance)


# Read once or twice per execution: a C getter instead of a Python call.
TaskRow.key = Owned.key = property(itemgetter(0, 1))  # type: ignore[assignment,method-assign]


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


# The members the hot path compares with, as module globals for it to import: ``FinishKind.DELETED``
# is a look-up through the enum's metaclass, unspecialized on CPython 3.11 (some 900 machine
# instructions each, against a few dozen for a global). Defined here once.
KIND_SUCCEEDED, KIND_FAILED, KIND_RELEASED, KIND_DELETED, KIND_SKIPPED = (
    FinishKind.SUCCEEDED,
    FinishKind.FAILED,
    FinishKind.RELEASED,
    FinishKind.DELETED,
    FinishKind.SKIPPED,
)


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
    held: tuple[tuple[str, datetime], ...] = ()
    """Rows of the polled names picked by other instances (task name, execution time), as a
    poll about to sleep read them (lock-and-fetch): a recurring one comes due again at its
    next slot, and their owners are what the liveness watch judges. Empty when not read."""


class Own(NamedTuple):
    """The instance that checks for dead executions: its ``scheduler_name`` and when this
    incarnation became ready (database time); see ``TaskStore.revive_dead``."""

    name: str
    since: datetime


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


# -- our own tables' rows, and how an execution ended -------------------------------------------


class Outcome(StrEnum):
    """How an execution ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    """Its row was revived elsewhere meanwhile: its result was not recorded."""
    CANCELLED = "cancelled"
    """Cancelled at shutdown (its slot was released to run again), or stopped on request
    (``client.cancel_running``: the message says who asked and why)."""
    TIMED_OUT = "timed_out"
    """Ran longer than its job's ``timeout()``: a failure."""
    SKIPPED = "skipped"
    """Not an execution: slots its catch-up policy did not run (the message says which)."""
    MISSED = "missed"
    """Not an execution: a slot that passed without a run (``record_missed_slots``): its
    ``error_class`` is the reason (``coalesced``, ``overlap``, ``catch_up``), its message
    says more; a record whose message starts with a count stands for that many older slots
    of one span (a completion names its newest 100)."""
    PARKED = "parked"
    """A typed one-time job's stored data no longer fits its model: ``execute`` was not
    called, and the row waits, unpicked, for a fix (``reschedule`` with data) or a
    ``cancel`` (the message names the fields; docs/task-data.md)."""


def outcome_of(finish: Finish, recorded: bool, error: BaseException | None) -> Outcome:
    """The outcome of an execution whose result ``finish`` was (``recorded``) or was not
    written."""
    if error is None and recorded and finish.kind in _PLAIN_SUCCESS:  # the common case first
        return _OUTCOME_SUCCEEDED
    if not recorded:
        return Outcome.SUPERSEDED
    if finish.kind is FinishKind.RELEASED or isinstance(error, ExecutionCancelled):
        return Outcome.CANCELLED
    if finish.kind is FinishKind.SKIPPED:
        return Outcome.SKIPPED
    if isinstance(error, JobTimedOut):
        return Outcome.TIMED_OUT
    if finish.kind is FinishKind.FAILED and finish.next_time == PARKED_TIME:
        return Outcome.PARKED
    if finish.kind is FinishKind.FAILED or error is not None:
        return Outcome.FAILED
    return Outcome.SUCCEEDED


_PLAIN_SUCCESS = frozenset((FinishKind.DELETED, FinishKind.SUCCEEDED))
_OUTCOME_SUCCEEDED = Outcome.SUCCEEDED
"""A module global: ``Outcome.SUCCEEDED`` is a look-up through the enum's metaclass (once per
finished execution an observer is told of)."""


class ExecutionRecord(NamedTuple):
    """One execution in the history (``ekbatan_execution_history``): read from the table, or
    about to be written to it. Immutable (a named tuple: one is built per execution, and a
    named tuple takes a fifth of a frozen dataclass's time to build).

    ``id`` is set once stored. ``version`` is the claim's version, known only while writing:
    where the completion statement writes the history itself (PostgreSQL), it turns
    ``outcome`` into ``superseded`` when the version-guarded write matched no row.
    """

    task_name: str
    task_instance: str
    execution_time: datetime
    picked_by: str | None
    started_at: datetime
    finished_at: datetime
    outcome: str
    error_class: str | None
    error_message: str | None
    id: int | None = None
    version: int | None = None

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


@dataclass(frozen=True)
class JobDefinition:
    """A job as the instance that last registered it described it (``ekbatan_jobs``)."""

    task_name: str
    kind: str
    """``recurring`` or ``one-time``."""
    schedule: str | None
    """The schedule in db-scheduler's form (``FIXED_RATE|PT1M``): recurring jobs only."""
    fingerprint: str | None
    app_version: str | None
    """The application version that wrote it (``jobs.app-version``), if configured."""
    timeout: timedelta | None
    max_concurrency: int | None
    keyed: bool
    """The concurrency limit is per ``concurrency_key``."""
    written_by: str
    written_at: datetime
    catch_up: str | None = None
    """A recurring job's catch-up policy (``latest``, ``all(max_slots=48)``, ``skip(...)``)."""
    missed: int = 0
    """Slots coalesced into a later run (``CatchUp.latest``), cluster-wide, as counted."""
    caught_up: int = 0
    """Slots run late, one by one (``CatchUp.all``)."""
    skipped: int = 0
    """Slots not run by the policy (``CatchUp.skip``; ``CatchUp.all`` past ``max_slots``)."""
