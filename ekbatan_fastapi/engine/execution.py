"""One claimed execution: its context, and the result to record when it ends."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..domain.context import ExecutionContext, HeartbeatState, TransactionOpener
from ..domain.job import DistributedJob, Job, OneTimeJob
from ..domain.records import ExecutionRecord, outcome_of
from ..domain.rows import Finish, FinishKind, Owned, TaskRow
from ..domain.text import storable

if TYPE_CHECKING:
    import asyncio

    from ..domain.schedules import Schedule

__all__ = ["Execution"]

log = logging.getLogger(__name__)

_MESSAGE_LIMIT = 2000
"""Characters of an error message kept in the history (the column's limit)."""


@dataclass(eq=False)
class Execution:
    """A row this instance claimed and is running (or recording the result of)."""

    row: TaskRow
    job: Job
    heartbeat: HeartbeatState
    started: datetime
    schedule: Schedule | None = None
    task: asyncio.Task[None] | None = None
    recording: bool = field(default=False)
    error: BaseException | None = None
    finished_at: datetime | None = None
    duration: float = 0.0
    """Seconds ``execute`` ran (monotonic clock), set when it returns."""
    settled: Finish | None = None
    """The result ``ctx.transaction()`` committed with the effects (nothing left to write)."""
    history_written: bool = False
    """Its history record was committed by ``ctx.transaction()``."""
    timed_out: bool = False
    """It ran past its job's timeout."""

    @property
    def owned(self) -> Owned:
        return Owned(self.row.task_name, self.row.task_instance, self.row.version)

    @property
    def label(self) -> str:
        return f"{self.row.task_name}/{self.row.task_instance}"

    def context(
        self, shutting_down: Callable[[], bool], transactions: TransactionOpener | None = None
    ) -> ExecutionContext:
        """The context handed to ``execute``."""
        row = self.row
        return ExecutionContext(
            task_name=row.task_name,
            task_instance=row.task_instance,
            execution_time=row.execution_time,
            picked_by=row.picked_by or "",
            version=row.version,
            task_data=row.task_data,
            heartbeat_state=self.heartbeat,
            consecutive_failures=row.consecutive_failures or 0,
            shutting_down=shutting_down,
            timed_out=lambda: self.timed_out,
            transactions=transactions,
        )

    def record(self, finish: Finish, recorded: bool = True) -> ExecutionRecord:
        """This execution's history record; ``recorded``: whether its result was written."""
        error = self.error
        row = self.row
        return ExecutionRecord(
            task_name=row.task_name,
            task_instance=row.task_instance,
            execution_time=row.execution_time,
            picked_by=row.picked_by,
            started_at=self.started,
            finished_at=self.finished_at or self.started,
            outcome=outcome_of(finish, recorded, error).value,
            error_class=None if error is None else storable(type(error).__qualname__, 200),
            error_message=None if error is None else storable(str(error), _MESSAGE_LIMIT),
            version=row.version,
        )

    def finish(
        self,
        now: datetime,
        *,
        error: BaseException | None,
        cancelled: bool,
        fallback_delay: timedelta,
    ) -> Finish:
        """What to record: reschedule a recurring row, delete or retry a one-time one."""
        owned = self.owned
        if cancelled:
            return Finish(owned, FinishKind.RELEASED)
        try:
            if isinstance(self.job, DistributedJob):
                schedule = self.schedule if self.schedule is not None else self.job.schedule()
                next_time = schedule.next_execution_time(self.row.execution_time, now)
                kind = FinishKind.SUCCEEDED if error is None else FinishKind.FAILED
                return Finish(owned, kind, next_time)
            if error is None:
                return Finish(owned, FinishKind.DELETED)
            assert isinstance(self.job, OneTimeJob)
            failures = (self.row.consecutive_failures or 0) + 1
            retry_at = self.job.failure_handler().next_attempt(failures, now)
        except Exception:
            log.exception(
                "could not compute the next time of %s; retrying it in %s",
                self.label,
                fallback_delay,
                extra={"task_name": self.row.task_name, "task_instance": self.row.task_instance},
            )
            return Finish(owned, FinishKind.FAILED, now + fallback_delay)
        if retry_at is None:
            log.error(
                "%s failed %d times; its failure handler gave up, deleting it",
                self.label,
                failures,
                extra={"task_name": self.row.task_name, "task_instance": self.row.task_instance},
            )
            return Finish(owned, FinishKind.DELETED)
        return Finish(owned, FinishKind.FAILED, retry_at)
