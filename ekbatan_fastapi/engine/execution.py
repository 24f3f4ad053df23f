"""One claimed execution: its context, and the result to record when it ends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..domain.catchup import (
    CatchUp,
    PassedSlots,
    SlotPlan,
    after_run,
    passed_slots,
    skip_message,
    skipped_by_plan,
)
from ..domain.codec import DataModel, TaskDataInvalid
from ..domain.context import (
    ExecutionContext,
    HeartbeatState,
)
from ..domain.errors import ExecutionCancelled
from ..domain.failure import ExponentialBackoff, FailureHandler
from ..domain.job import RECURRING_INSTANCE, DistributedJob, Job, OneTimeJob, data_model_of
from ..domain.logs import library_logger
from ..domain.overlap import BufferMark, Overlap, overlap_slot_of
from ..domain.persistent import PAUSED_TIME, PersistentScheduleJob
from ..domain.retries import RetryMark, retry_time
from ..domain.rows import (
    KIND_DELETED,
    KIND_SKIPPED,
    KIND_SUCCEEDED,
    PARKED_TIME,
    ExecutionRecord,
    Finish,
    FinishKind,
    Owned,
    TaskRow,
    outcome_of,
)
from ..domain.text import storable

if TYPE_CHECKING:
    from ..domain.persistent import ScheduleSpec
    from ..domain.schedules import Schedule
    from ..store.cancels import CancelRequest

__all__ = ["Execution"]

log = library_logger(__name__)

BACKFILL_RETRY = ExponentialBackoff(timedelta(seconds=10), rate=2.0, maximum=timedelta(hours=1))
"""How a failed backfilled slot is retried (db-scheduler's one-time default is five minutes;
a backfill is watched while it runs, so it starts sooner)."""

_MESSAGE_LIMIT = 2000
"""Characters of an error message kept in the history (the column's limit)."""

JOB_KINDS: dict[type[Job], tuple[bool, DataModel | None]] = {}
"""Per job class: whether it is a ``DistributedJob``, and its data model (``isinstance`` on an
ABC, once per class rather than twice per execution)."""


def job_kind(job: Job) -> tuple[bool, DataModel | None]:
    """The job's kind. On the hot path ``JOB_KINDS.get(type(job)) or job_kind(job)``: a dict
    look-up, and no Python call once its class is known."""
    cls = type(job)
    kind = JOB_KINDS.get(cls)
    if kind is None:
        kind = JOB_KINDS[cls] = (isinstance(job, DistributedJob), data_model_of(job))
    return kind


_new = tuple.__new__
"""Builds a named tuple from a tuple of all its fields, without the Python frame of its
``__new__`` (``Owned``, ``Finish``, ``ExecutionRecord``: built once per execution)."""


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
    persistent: ScheduleSpec | None = None
    """A ``PersistentScheduleJob``'s schedule row: its schedule, data and bounds as claimed
    (as counted, once it ended: ``Executor._count_run``)."""
    cancel: CancelRequest | None = None
    """Someone asked to stop it (``client.cancel_running``): who and why."""
    ended: str | None = None
    """Why its schedule ends with this run (``max_runs``, ``end_at``): the row is deleted and
    the history says so."""
    attempt: int = 1
    """Which attempt of its slot this is (``ctx.attempt``): above 1 for a retry."""
    retry_of: RetryMark | None = None
    """The pending retry it runs (a recurring job's ``failure_handler()``)."""
    dropped: RetryMark | None = None
    """A retry found pending when the next slot had come: dropped, this runs the schedule."""
    retry_mark: RetryMark | None = None
    """The retry its failure asks for, written into the row with its result."""
    note: str | None = None
    """Added to its history's error message (a retry the next slot overtook)."""
    overlap: Overlap | None = None
    """Its job's overlap policy (None: ``Overlap.skip``)."""
    passed: tuple[PassedSlots, ...] = ()
    """The slots its next time passes over, each span with its reason (``coalesced``: due
    before it started, merged into it by ``CatchUp.latest``; ``overlap``: came due while it
    ran, or skipped by ``Overlap.buffer_one``), set by ``finish`` (``after_run``); ``missed``
    counts them."""
    record_missed: bool = False
    """Its job records the slots that pass without a run (``record_missed_slots``)."""
    buffered_through: datetime | None = None
    """It runs a slot ``Overlap.buffer_one`` buffered; the slots after it up to this one were
    skipped then, and the schedule goes on after it."""
    buffer_mark: BufferMark | None = None
    """The slot its end buffers (``Overlap.buffer_one``), written into the row with its result."""
    no_buffer: bool = False
    """The buffer's mark could not be written: the schedule goes on as ``Overlap.skip``."""
    overlap_timer: asyncio.TimerHandle | None = None
    """Stops it when its next slot comes due (``Overlap.cancel_other``)."""
    overlap_slot: datetime | None = None
    """The slot that stopped it (``Overlap.cancel_other``): its row runs that slot next."""

    def passed_spans(self) -> list[PassedSlots]:
        """Every span of slots this execution's result passes over without a run, oldest
        first: skipped by the catch-up policy before its slot (``catch_up``, its plan), then
        merged by ``CatchUp.latest`` or passed over by an overlap policy after it
        (``passed``). Each is recorded in the history (``record_missed_slots``), told to
        ``slot_missed`` and counted in the task's streak of missed slots when the result is
        recorded (``SlotCounter``)."""
        plan = self.plan
        skipped = skipped_by_plan(plan, self.catch_up) if plan is not None else None
        if skipped is None:
            return list(self.passed)
        return sorted([skipped, *self.passed], key=lambda p: p.first)

    @property
    def ran(self) -> bool:
        """It ran a slot (its catch-up policy did not skip them all)."""
        return self.plan is None or self.plan.slot is not None

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

    def cancel_requested(self) -> bool:
        """Answers ``ctx.cancel_requested``."""
        return self.cancel is not None

    def is_timed_out(self) -> bool:
        """Answers ``ctx.is_timed_out``."""
        return self.timed_out

    def unfit_data(self, ctx: ExecutionContext) -> TaskDataInvalid | None:
        """A typed job's data is checked before ``execute`` is called: the error that parks
        the row when it does not fit (None: it fits, or the job is untyped)."""
        if self.unfit is not None or ctx.data_model is None:  # an unreadable schedule row
            return self.unfit
        try:
            ctx.data  # noqa: B018 (decoded and validated once, cached for execute)
        except TaskDataInvalid as error:
            self.unfit = error
        return self.unfit

    def record(self, finish: Finish, recorded: bool = True) -> ExecutionRecord:
        """This execution's history record; ``recorded``: whether its result was written."""
        error = self.error
        row = self.row
        kind = finish.kind
        if error is None and kind is not KIND_SKIPPED and self.ended is None:
            error_class = error_message = None
        else:
            error_class = None if error is None else storable(type(error).__qualname__, 200)
            error_message = self._message(finish, error)
        if error is None and recorded and (kind is KIND_DELETED or kind is KIND_SUCCEEDED):
            outcome = "succeeded"  # ``outcome_of``'s common case, without its two calls
        else:
            outcome = outcome_of(finish, recorded, error).value
        return _new(  # ExecutionRecord: every field, in its order
            ExecutionRecord,
            (
                row.task_name,
                row.task_instance,
                self.slot if self.slot is not None else row.execution_time,
                row.picked_by,
                self.started,
                self.finished_at or self.started,
                outcome,
                error_class,
                error_message,
                None,
                row.version,
            ),
        )

    def _message(self, finish: Finish, error: BaseException | None) -> str | None:
        if isinstance(error, ExecutionCancelled):
            return storable(str(error), _MESSAGE_LIMIT)
        if self.ended is not None and finish.kind is FinishKind.DELETED:
            ended = self.ended if error is None else f"{self.ended}; {error}"
            return storable(ended, _MESSAGE_LIMIT)
        if finish.kind is FinishKind.SKIPPED and self.plan is not None:
            return storable(skip_message(self.plan, self.catch_up), _MESSAGE_LIMIT)
        if error is None:
            return None
        text = str(error) if self.note is None else f"{error} ({self.note})"
        return storable(text, _MESSAGE_LIMIT)

    def dropped_record(self) -> ExecutionRecord | None:
        """The history record of the retry this execution dropped (None: it dropped none)."""
        mark = self.dropped
        if mark is None:
            return None
        return ExecutionRecord(
            task_name=self.row.task_name,
            task_instance=self.row.task_instance,
            execution_time=mark.slot,
            picked_by=self.row.picked_by,
            started_at=self.started,
            finished_at=self.started,
            outcome="skipped",
            error_class=None,
            error_message=storable(
                f"retry (attempt {mark.attempt}) of slot {mark.slot.isoformat()} due at "
                f"{mark.at.isoformat()} dropped: the next slot came first",
                _MESSAGE_LIMIT,
            ),
        )

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
        row = self.row
        owned = _new(Owned, (row.task_name, row.task_instance, row.version))  # self.owned
        if cancelled:
            return Finish(owned, FinishKind.RELEASED)
        if isinstance(error, ExecutionCancelled):
            return self._cancelled(owned, now, fallback_delay)
        try:
            if self.persistent is not None and (self.unfit is None or error is not self.unfit):
                return self._next_of_schedule(owned, now, error)
            if (JOB_KINDS.get(type(self.job)) or job_kind(self.job))[0] and not self.backfill:
                if error is None:
                    return _new(Finish, (owned, KIND_SUCCEEDED, self._next_slot(now)))
                retry = self._retry(now) if self.recurring else None
                return Finish(owned, FinishKind.FAILED, retry or self._next_slot(now))
            if error is None:
                return _new(Finish, (owned, KIND_DELETED, None))
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

    def _cancelled(self, owned: Owned, now: datetime, fallback_delay: timedelta) -> Finish:
        """Stopped on request: a recurring row goes on with its next slot (its failure
        counters unchanged), a one-time task (or a backfilled slot) is removed."""
        if self.persistent is None and (self.backfill or not job_kind(self.job)[0]):
            return Finish(owned, FinishKind.DELETED)
        self._overlapped(now)
        try:
            if self.persistent is not None:
                finish = self._next_of_schedule(owned, now, None)
                if finish.kind is FinishKind.DELETED:
                    return finish
                return Finish(owned, FinishKind.SKIPPED, finish.next_time)
            return Finish(owned, FinishKind.SKIPPED, self._next_slot(now))
        except Exception:
            log.exception(
                "could not compute the next time of %s; running it again in %s",
                self.label,
                fallback_delay,
                extra={"task_name": self.row.task_name, "task_instance": self.row.task_instance},
            )
            return Finish(owned, FinishKind.SKIPPED, now + fallback_delay)

    def _overlapped(self, now: datetime) -> None:
        """``Overlap.cancel_other``: stopped (by its own instance's timer, or by a peer's
        request) once its next slot was due: the row runs that slot next."""
        overlap, schedule = self.overlap, self.schedule
        if self.overlap_slot is not None or overlap is None or not overlap.cancels:
            return
        if schedule is None:
            return
        latest = schedule.latest_at_or_before(self.execution_time, now)
        if latest > self.execution_time and schedule.due_time(latest) <= now:
            self.overlap_slot = latest

    def stale_overlap(self, request: CancelRequest) -> bool:
        """A peer's ``Overlap.cancel_other`` request naming a slot that was due before this
        execution started (it runs an older slot late: a catch-up), not one that came due
        while it ran: not acted on."""
        slot = overlap_slot_of(request.reason)
        schedule = self.schedule
        if slot is None or schedule is None or self.overlap is None or not self.overlap.cancels:
            return False
        return schedule.due_time(slot) <= self.started

    def _next_of_schedule(self, owned: Owned, now: datetime, error: BaseException | None) -> Finish:
        """A schedule row's next slot (its own schedule, as it was when the run ended), or
        its end (deleted, the history saying why)."""
        spec = self.persistent
        assert spec is not None
        kind = FinishKind.SUCCEEDED if error is None else FinishKind.FAILED
        if spec.paused is not None:
            return Finish(owned, kind, PAUSED_TIME)
        if error is not None and (retry := self._retry(now)) is not None:
            return Finish(owned, kind, retry)
        next_time = self._next_slot(now)
        self.ended = spec.end_reason(next_time)
        if self.ended is not None:
            return Finish(owned, FinishKind.DELETED)
        return Finish(owned, kind, next_time)

    def _retry(self, now: datetime) -> datetime | None:
        """When the failed slot runs again per the job's ``failure_handler()`` (None: not:
        no handler, it gave up, or the next slot comes first)."""
        job = self.job
        assert isinstance(job, DistributedJob | PersistentScheduleJob)
        assert self.schedule is not None
        handler = job.failure_handler()
        if handler is None:
            return None
        at = handler.next_attempt(self.attempt, now)
        if at is None:
            self.note = f"its failure handler gave up after attempt {self.attempt}"
            return None
        at = retry_time(at)
        slot = self.execution_time
        following = self.schedule.following(slot)
        if following is not None and at >= self.schedule.due_time(following):
            self.note = (
                f"retry at {at.isoformat()} dropped: the next slot {following.isoformat()} "
                "comes first"
            )
            return None
        self.retry_mark = RetryMark(slot, self.attempt + 1, at)
        return at

    def without_retry(self, finish: Finish, now: datetime) -> Finish:
        """``finish`` with the next slot instead of the retry (or buffered slot) it asked
        for, whose mark could not be written: the row would run it as a slot of its own,
        off the grid."""
        if finish.kind is FinishKind.DELETED:  # its schedule ended: nothing follows
            self.buffer_mark = self.retry_mark = None
            return finish
        if self.buffer_mark is not None:
            self.buffer_mark, self.no_buffer = None, True
            self.note = "its buffered slot could not be recorded; the next slot follows"
            kind = finish.kind
        else:
            self.retry_mark = None
            self.note = "its retry could not be recorded; the next slot follows"
            kind = FinishKind.FAILED
        next_time = self._next_slot(now)
        if self.persistent is not None and (ended := self.persistent.end_reason(next_time)):
            self.ended = ended  # max_runs or end_at reached: as _next_of_schedule decides
            return Finish(finish.owned, FinishKind.DELETED)
        return Finish(finish.owned, kind, next_time)

    @property
    def mark(self) -> bytes | None:
        """What its end writes into the row's ``task_data`` before its result: a pending
        retry, or a buffered slot (a schedule row: its spec carrying it); None: nothing."""
        if self.retry_mark is not None:
            raw = self.retry_mark.encode()
        elif self.buffer_mark is not None:
            raw = self.buffer_mark.encode()
        else:
            return None
        if self.persistent is not None:
            return self.persistent.with_pending(raw).encode(where=self.label)
        return raw

    def request_stop(self, request: CancelRequest) -> bool:
        """Stop it as ``request`` asks (``client.cancel_running``, or its overlap policy): an
        ``async def`` execution's task is cancelled; a plain ``def`` one cannot be
        interrupted, its ``ctx.cancel_requested`` turns true. False: already asked, or
        its result is being recorded."""
        if self.cancel is not None or self.recording:
            return False
        self.cancel = request
        if self.job.is_async and self.task is not None and not self.held:
            self.task.cancel()
        return True

    def _next_slot(self, now: datetime) -> datetime:
        """A recurring row's next due time after this run, per its catch-up and overlap
        policies."""
        if self.schedule is not None:
            schedule = self.schedule
        else:
            assert isinstance(self.job, DistributedJob)
            schedule = self.job.schedule()
        if self.overlap_slot is not None:  # stopped by the slot that came due: it runs now
            following = schedule.following(self.execution_time)
            if following is not None and following < self.overlap_slot:
                last = schedule.back(self.overlap_slot, 1)
                self.passed = passed_slots(
                    schedule,
                    following,
                    last,
                    self.started,
                    run=self.execution_time,
                    policy="cancel_other",
                )
                self.missed = sum(p.count for p in self.passed)
            return schedule.due_time(self.overlap_slot)
        if self.row.task_instance != RECURRING_INSTANCE and self.persistent is None:
            return schedule.next_execution_time(self.row.execution_time, now)
        row_time = self.row.execution_time
        slot = schedule.slot_of(self.row.execution_time) if self.slot is None else self.slot
        if self.retry_of is not None:  # the slot's grid, not the retry's time
            row_time = schedule.due_time(self.retry_of.slot)
        elif self.buffered_through is not None:  # the skipped slots are accounted for
            slot = self.buffered_through
            row_time = schedule.due_time(slot)
        elif self.dropped is not None and self.slot is not None:
            row_time = schedule.due_time(self.slot)
        overlap = None if self.no_buffer else self.overlap
        after = after_run(
            schedule,
            self.catch_up or CatchUp.latest(),
            row_time,
            slot,
            now,
            started=self.started,
            overlap=overlap,
            ran=self.row.execution_time if self.slot is None else self.slot,  # execution_time
        )
        self.passed = after.passed
        self.missed = after.missed
        if after.buffered is not None and after.through is not None:
            at = retry_time(after.next_time)
            self.buffer_mark = BufferMark(after.buffered, after.through, at)
            return at
        return after.next_time

    def _failure_handler(self) -> FailureHandler:
        if isinstance(self.job, OneTimeJob):
            return self.job.failure_handler()
        return BACKFILL_RETRY
