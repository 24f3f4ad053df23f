"""A row of ``scheduled_tasks`` as users see it, and the rules that judge it: its derived
state, when a running one counts as dead, when a due one counts as overdue, and where a
skipped missed slot goes. ``/jobs``, the dashboard, the CLI and the client all use these.

Every function is pure: the database's ``now`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from .codec import decode_data
from .rows import PARKED_TIME, PauseInfo, TaskRow
from .schedules import Schedule

__all__ = [
    "TASK_STATES",
    "ScheduledTask",
    "TaskState",
    "dead_after",
    "derive_state",
    "heartbeat_age",
    "overdue_after",
    "paused_message",
    "slot_after_missed",
]

TaskState = Literal[
    "scheduled", "running", "failing", "overdue", "dead", "unresolved", "paused", "parked"
]
TASK_STATES: tuple[TaskState, ...] = (
    "scheduled",
    "running",
    "failing",
    "overdue",
    "dead",
    "unresolved",
    "paused",
    "parked",
)

_MIN_OVERDUE = timedelta(seconds=1)


@dataclass(frozen=True)
class ScheduledTask:
    """A row of ``scheduled_tasks`` as the client shows it."""

    task_name: str
    task_instance: str
    execution_time: datetime
    picked: bool
    picked_by: str | None
    last_success: datetime | None
    last_failure: datetime | None
    consecutive_failures: int
    last_heartbeat: datetime | None
    version: int
    priority: int
    task_data: bytes | None

    @classmethod
    def from_row(cls, row: TaskRow) -> ScheduledTask:
        return cls(
            task_name=row.task_name,
            task_instance=row.task_instance,
            execution_time=row.execution_time,
            picked=row.picked,
            picked_by=row.picked_by,
            last_success=row.last_success,
            last_failure=row.last_failure,
            consecutive_failures=row.consecutive_failures or 0,
            last_heartbeat=row.last_heartbeat,
            version=row.version,
            priority=row.priority or 0,
            task_data=row.task_data,
        )

    @property
    def data(self) -> Any:
        """The decoded ``task_data`` (raises TaskDataError when it is not our JSON)."""
        return decode_data(self.task_data, where=f"{self.task_name}/{self.task_instance}")

    @property
    def parked(self) -> bool:
        """Parked: its typed job's model refused the stored data (see ``PARKED_TIME``)."""
        return not self.picked and self.execution_time >= PARKED_TIME


def dead_after(heartbeat_interval: timedelta, missed_heartbeats_limit: int) -> timedelta:
    """A picked row whose heartbeat is older than this is revived elsewhere."""
    return heartbeat_interval * missed_heartbeats_limit


def overdue_after(polling_interval: timedelta) -> timedelta:
    """How long a row may be due before it counts as overdue: two polls, at least 1 s."""
    return max(2 * polling_interval, _MIN_OVERDUE)


def heartbeat_age(task: ScheduledTask, now: datetime) -> timedelta | None:
    """How old a running row's heartbeat is (None: not running, or never heartbeated)."""
    if not task.picked or task.last_heartbeat is None:
        return None
    return max(now - task.last_heartbeat, timedelta(0))


def derive_state(
    task: ScheduledTask,
    now: datetime,
    *,
    dead_after: timedelta,
    overdue_after: timedelta,
    known: bool = True,
    paused: bool = False,
) -> TaskState:
    """``dead`` > ``running`` > ``parked`` > ``paused`` > ``unresolved`` > ``overdue`` >
    ``failing`` > ``scheduled``: a paused task still shows an execution that runs (or died)
    meanwhile; a parked row waits for a fix whatever else holds.
    ``known``: some job of this name is registered where the state is judged (the CLI, which
    loads no jobs, passes True)."""
    if task.picked:
        if task.last_heartbeat is None or now - task.last_heartbeat > dead_after:
            return "dead"
        return "running"
    if task.parked:
        return "parked"
    if paused:
        return "paused"
    if not known:
        return "unresolved"
    if now - task.execution_time > overdue_after:
        return "overdue"
    if task.consecutive_failures > 0:
        return "failing"
    return "scheduled"


def slot_after_missed(schedule: Schedule, task: ScheduledTask, now: datetime) -> datetime | None:
    """Where a resume with ``skip_missed`` moves a recurring row: its schedule's next slot
    that is still in the future. None when there is nothing to skip (the row runs, or is not
    due yet)."""
    if task.picked or task.execution_time > now:
        return None
    return schedule.next_execution_time(task.execution_time, now)


def paused_message(task_name: str, pause: PauseInfo, force_hint: str) -> str:
    """Why a run of a paused task was refused, and how to force it (``force_hint`` in the
    caller's own form: ``force=True``, ``?force=true``, ``--force``)."""
    reason = f": {pause.reason}" if pause.reason else ""
    return (
        f"{task_name} is paused (by {pause.paused_by} at {pause.paused_at.isoformat()}"
        f"{reason}); resume it, or pass {force_hint} to run it once anyway"
    )
