"""One claimed execution: its context, and the result to record when it ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..domain.catchup import CatchUp, SlotPlan, next_after_run, skip_message
from ..domain.codec import DataModel, TaskDataInvalid
from ..domain.context import ExecutionContext, HeartbeatState, TransactionOpener
from ..domain.failure import ExponentialBackoff, FailureHandler
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job, OneTimeJob, data_model_of
from ..domain.logs import library_logger
from ..domain.records import ExecutionRecord, outcome_of
from ..domain.rows import PARKED_TIME, Finish, FinishKind, Owned, TaskRow
from ..domain.text import storable

if TYPE_CHECKING:
    import asyncio

    from ..domain.schedules import Schedule

__all__ = ["Execution"]

log = library_logger(__name__)

BACKFILL_RETRY = ExponentialBackoff(timedelta(seconds=10), rate=2.0, maximum=timedelta(hours=1))
"""How a failed backfilled slot is retried (db-scheduler's one-time default is five minutes;
a backfill is watched while it runs, so it starts sooner)."""

_MESSAGE_LIMIT = 2000
"""Characters of an error message kept in the history (the column's limit)."""

_KINDS: dict[type[Job], tuple[bool, DataModel | None]] = {}
"""Per job class: whether it is a ``DistributedJob``, and its data model (``isinstance`` on an
ABC, once per class rather than twice per execution)."""


def _kind(job: Job) -> tuple[bool, DataModel | None]:
    cls = type(job)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = (isinstance(job, DistributedJob), data_model_of(job))
    return kind


@dataclass(eq=False, slots=True)
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
    slot: datetime | None = None
    """The slot it runs (``ctx.execution_time``): the row's time without jitter, the slot a
    catch-up policy chose, a backfilled slot. None: the row's ``execution_time``."""
    catch_up: CatchUp | None = None
    plan: SlotPlan | None = None
    """What the job's catch-up policy decided when the row was claimed (recurring rows)."""
    missed: int = 0
    """Slots its next time coalesces (``CatchUp.latest``), set by ``finish``."""
    backfill: bool = False
    """A backfilled slot: one-time work of the recurring job, deleted once it succeeds."""
    held: bool = False
    """Claimed ahead of its time (``claim_ahead``) and waiting for it: not started yet."""
    unfit: TaskDataInvalid | None = None
    """Its stored data does not fit its typed job's model: ``execute`` is not called, and the
    row is parked (see ``unfit_data``)."""

    @property
    def recurring(self) -> bool:
        """The recurring row of a recurring job (its next time comes from its schedule)."""
        return self.schedule is not None and self.row.task_instance == RECURRING_INSTANCE

    @property
    def execution_time(self) -> datetime:
        return self.slot if self.slot is not None else self.row.execution_time

    @property
    def owned(self) -> Owned:
        return Owned(self.row.task_name, self.row.task_instance, self.row.version)

    @property
    def label(self) -> str:
        return f"{self.row.task_name}/{self.row.task_instance}"

    def context(
        self, shutting_down: Callable[[], bool], transactions: TransactionOpener | None = None
    ) -> ExecutionContext:
        """The context handed to ``execute`` (its fields in order: one is built per
        execution, and positional arguments cost half of keywords)."""
        row = self.row
        return ExecutionContext(
            row.task_name,
            row.task_instance,
            self.slot if self.slot is not None else row.execution_time,
            row.picked_by or "",
            row.version,
            row.task_data,
            self.heartbeat,
            row.consecutive_failures or 0,
            shutting_down,
            self._timed_out,
            transactions,
            self.backfill,
            _kind(self.job)[1],
        )

    def _timed_out(self) -> bool:
        """Answers ``ctx.is_timed_out``."""
        return self.timed_out

    def unfit_data(self, ctx: ExecutionContext) -> TaskDataInvalid | None:
        """A typed job's data is checked before ``execute`` is called: the error that parks
        the row when it does not fit (None: it fits, or the job is untyped)."""
        if ctx.data_model is None:
            return None
        try:
            ctx.data  # noqa: B018 (decoded and validated once, cached for execute)
        except TaskDataInvalid as error:
            self.unfit = error
        return self.unfit

    def record(self, finish: Finish, recorded: bool = True) -> ExecutionRecord:
        """This execution's history record; ``recorded``: whether its result was written."""
        error = self.error
        row = self.row
        if error is None and finish.kind is not FinishKind.SKIPPED:  # the common case, quicker
            error_class = error_message = None
        else:
            error_class = None if error is None else storable(type(error).__qualname__, 200)
            error_message = self._message(finish, error)
        return ExecutionRecord(  # positional: the fields' order (a named tuple)
            row.task_name,
            row.task_instance,
            self.slot if self.slot is not None else row.execution_time,
            row.picked_by,
            self.started,
            self.finished_at or self.started,
            outcome_of(finish, recorded, error).value,
            error_class,
            error_message,
            None,
            row.version,
        )

    def _message(self, finish: Finish, error: BaseException | None) -> str | None:
        if finish.kind is FinishKind.SKIPPED and self.plan is not None:
            return storable(skip_message(self.plan, self.catch_up), _MESSAGE_LIMIT)
        return None if error is None else storable(str(error), _MESSAGE_LIMIT)

    def skip_record(self) -> ExecutionRecord | None:
        """The history record of the slots the catch-up policy skipped before the one this
        execution runs (None: none were)."""
        plan = self.plan
        if plan is None or not plan.skipped or plan.slot is None:
            return None
        assert plan.skipped_from is not None
        return ExecutionRecord(
            task_name=self.row.task_name,
            task_instance=self.row.task_instance,
            execution_time=plan.skipped_from,
            picked_by=self.row.picked_by,
            started_at=self.started,
            finished_at=self.started,
            outcome="skipped",
            error_class=None,
            error_message=storable(skip_message(plan, self.catch_up), _MESSAGE_LIMIT),
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
            if _kind(self.job)[0] and not self.backfill:
                kind = FinishKind.SUCCEEDED if error is None else FinishKind.FAILED
                return Finish(owned, kind, self._next_slot(now))
            if error is None:
                return Finish(owned, FinishKind.DELETED)
            if error is self.unfit:  # parked: no retry can make the data fit
                return Finish(owned, FinishKind.FAILED, PARKED_TIME)
            failures = (self.row.consecutive_failures or 0) + 1
            retry_at = self._failure_handler().next_attempt(failures, now)
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

    def _next_slot(self, now: datetime) -> datetime:
        """A recurring row's next due time after this run, per its catch-up policy."""
        assert isinstance(self.job, DistributedJob)
        schedule = self.schedule if self.schedule is not None else self.job.schedule()
        if self.row.task_instance != RECURRING_INSTANCE:
            return schedule.next_execution_time(self.row.execution_time, now)
        next_time, self.missed = next_after_run(
            schedule,
            self.catch_up or CatchUp.latest(),
            self.row.execution_time,
            schedule.slot_of(self.row.execution_time) if self.slot is None else self.slot,
            now,
        )
        return next_time

    def _failure_handler(self) -> FailureHandler:
        if isinstance(self.job, OneTimeJob):
            return self.job.failure_handler()
        return BACKFILL_RETRY
