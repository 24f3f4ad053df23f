"""The values of our own tables (execution history, pauses, instances) and how an execution
ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from .errors import JobTimedOut
from .rows import PARKED_TIME, Finish, FinishKind

__all__ = ["ExecutionRecord", "InstanceInfo", "JobDefinition", "Outcome", "PauseInfo", "outcome_of"]


class Outcome(StrEnum):
    """How an execution ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    """Its row was revived elsewhere meanwhile: its result was not recorded."""
    CANCELLED = "cancelled"
    """Cancelled at shutdown; its slot was released to run again."""
    TIMED_OUT = "timed_out"
    """Ran longer than its job's ``timeout()``: a failure."""
    SKIPPED = "skipped"
    """Not an execution: slots its catch-up policy did not run (the message says which)."""
    PARKED = "parked"
    """A typed one-time job's stored data no longer fits its model: ``execute`` was not
    called, and the row waits, unpicked, for a fix (``reschedule`` with data) or a
    ``cancel`` (the message names the fields; docs/task-data.md)."""


def outcome_of(finish: Finish, recorded: bool, error: BaseException | None) -> Outcome:
    """The outcome of an execution whose result ``finish`` was (``recorded``) or was not
    written."""
    if error is None and recorded and finish.kind in _PLAIN_SUCCESS:  # the common case first
        return Outcome.SUCCEEDED
    if not recorded:
        return Outcome.SUPERSEDED
    if finish.kind is FinishKind.RELEASED:
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
