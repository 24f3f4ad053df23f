"""``Executor``: runs each claimed row as its own asyncio task (a plain ``def`` job in a worker
thread) and hands the result to the completer; at shutdown, waits for the executions, cancels
the async ones and waits again, then abandons what is left."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from ..domain.backfill import backfill_slot
from ..domain.catchup import CatchUp, SlotPlan, plan
from ..domain.context import ExecutionContext, HeartbeatState, TransactionOpener
from ..domain.errors import ExecutionCancelled, ExecutionSuperseded, JobTimedOut
from ..domain.job import (
    RECURRING_INSTANCE,
    DistributedJob,
    Job,
    pause_threshold,
    records_missed,
)
from ..domain.limits import JobLimits
from ..domain.logs import LOG_CONTEXT, library_logger
from ..domain.overlap import Overlap, next_due_after, overlap_reason, read_buffer_mark
from ..domain.persistent import PersistentScheduleJob
from ..domain.retries import read_mark
from ..domain.rows import Finish, FinishKind, TaskKey, TaskRow
from ..domain.schedules import Schedule
from ..domain.text import storable
from ..store.cancels import CancelRequest
from ..store.schedules import ScheduleRows
from .config import SchedulerConfig
from .definitions import PRE_COMPLETION_MAX_AGE, Definitions
from .execution import JOB_KINDS, Execution, job_kind
from .logs import log_extra
from .observer import ObserverDispatch
from .persistent import count_run, read_schedule_row
from .poller import DatabaseLink
from .running import Capacity, RunState
from .timeouts import Abandoned, TimeoutRunner

__all__ = ["Executor"]

log = library_logger(__name__)

_LAUNCH_BACKOFF = (timedelta(seconds=1), timedelta(minutes=5))
"""After a row's launch failed ``n`` times in a row here, the next attempt waits
``min(first * 2 ** (n - 1), most)``: a launch that keeps failing (deciding its slot, an
observer) is not tried at every wake-up of every instance."""
_LAUNCH_FAILURES_KEPT = 10_000
"""Rows whose failed launches are counted at once (then the counts start again)."""

_COUNTING = 2
"""Schedule rows' runs counted at once per scheduler (``Executor._counting``)."""


def _start(work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """An execution's task. On Python 3.12+ it starts eagerly: the job runs at once, up to
    its first real wait, in a task of its own (``asyncio.current_task()``, timeouts and task
    groups see that task, as with any task); a job that never waits is done before the next
    row is launched, without a turn of the event loop (about 3 us less per execution). On
    3.11, a task that starts at the loop's next turn."""
    if sys.version_info >= (3, 12):
        loop = asyncio.get_running_loop()
        return asyncio.Task(work, loop=loop, name=name, eager_start=True)
    return asyncio.create_task(work, name=name)


class Executor:
    """Starts executions and reports their results."""

    def __init__(
        self,
        *,
        name: str,
        jobs: Mapping[str, Job],
        schedule_for: Callable[[str], Schedule | None],
        config: SchedulerConfig,
        link: DatabaseLink,
        state: RunState,
        running: Capacity,
        observer: ObserverDispatch,
        submit: Callable[[Finish, Execution], None],
        settled: Callable[[Finish, Execution], None],
        transactions: Callable[[Execution], TransactionOpener] | None = None,
        limits: Mapping[str, JobLimits] | None = None,
        catch_ups: Mapping[str, CatchUp] | None = None,
        definitions: Definitions | None = None,
        schedule_rows: ScheduleRows | None = None,
        retry_marks: Callable[[Execution], Awaitable[bool]] | None = None,
        pause: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.jobs = jobs
        self.schedule_for = schedule_for
        """A recurring job's current schedule (``Definitions.schedule``)."""
        self.config = config
        self.link = link
        self.state = state
        self.running = running
        self.observer = observer
        self.submit = submit
        """Hands a result to the completer (no wait: the completer reports what it wrote)."""
        self.settled = settled
        """Reports a result ``ctx.transaction()`` already committed."""
        self.transactions = transactions
        """Builds an execution's ``ctx.transaction()`` (None: without a database)."""
        self._is_async = {name: job.is_async for name, job in jobs.items()}
        self._persistent = {n for n, job in jobs.items() if isinstance(job, PersistentScheduleJob)}
        """The ``PersistentScheduleJob``s (a set: no ABC check per launch)."""
        self._timeouts = {n: lim.timeout for n, lim in (limits or {}).items() if lim.timeout}
        self._catch_ups = dict(catch_ups or {})
        self.schedule_rows = schedule_rows
        """Where a ``PersistentScheduleJob``'s run is counted into its row (None: not)."""
        self._counting = asyncio.Semaphore(_COUNTING)
        """Runs counted at once: a burst of schedule rows ending together must leave the
        pool's other connections to the heartbeats (a starved heartbeat gets a live
        execution revived elsewhere, and its slot run twice)."""
        self._definitions = definitions
        """Re-read (when older than a second) before a recurring row's next time is computed:
        the newest stored schedule (None: not)."""
        self._retry_marks = retry_marks
        """Writes a failed slot's pending retry into its row (None: retries are not kept)."""
        self._overlaps: dict[str, Overlap] = {
            name: job.overlap()
            for name, job in jobs.items()
            if isinstance(job, DistributedJob | PersistentScheduleJob)
            and job.overlap() != Overlap.skip()
        }
        """The recurring jobs whose overlap policy is not ``Overlap.skip``."""
        self._pause = pause
        """Pauses a job cluster-wide (name, reason) as ``ekbatan`` (None: cannot)."""
        self._pause_after: dict[str, int] = {}
        """The recurring jobs paused after that many consecutive failures."""
        for name, job in jobs.items():
            recurring = isinstance(job, DistributedJob | PersistentScheduleJob)
            if recurring and (limit := pause_threshold(job)) is not None:
                self._pause_after[name] = limit
        self._records_missed = frozenset(
            name
            for name, job in jobs.items()
            if isinstance(job, DistributedJob | PersistentScheduleJob)
            and records_missed(job, config.record_missed_slots)
        )
        """The jobs whose slots that pass without a run are named in the history."""
        self._timer = TimeoutRunner(name, config.grace)
        self._threads: ThreadPoolExecutor | None = None
        self._heartbeats = (config.heartbeat_interval, config.dead_after, config.clock.monotonic)
        """An execution's ``HeartbeatState`` arguments (the configuration is fixed by now)."""
        self._stopping = lambda: state.stopping
        """Answers ``ctx.is_shutting_down`` (one function for every execution)."""
        self._ahead = bool(config.claim_ahead)
        """Rows may be claimed before their time (``claim_ahead``): each starts at its own."""
        self._launch_failures: dict[TaskKey, int] = {}
        """Rows whose launch failed here, each with its failures in a row (until it starts)."""
        self.launch_errors: list[Exception] | None = None
        """Where a manual driver's round (``Poller.step``) collects the launches that failed,
        to raise the first once the batch is launched (None: only logged)."""

    def launch(self, row: TaskRow) -> None:
        """Start running a row this instance claimed."""
        job = self.jobs.get(row.task_name)
        if job is None:  # cannot happen: the poll asks only for our names
            log.error("claimed a row of unknown task %s", row.task_name, extra=self._extra(row))
            return
        interval, dead_after, monotonic = self._heartbeats
        heartbeat = HeartbeatState(interval, dead_after, monotonic, monotonic())
        link = self.link
        now = link.clock.now() + link.offset  # link.now(), written out
        execution = Execution(row, job, heartbeat, now, self.schedule_for(row.task_name))
        execution.record_missed = row.task_name in self._records_missed
        # Its slot comes back once: when its task ends (however it ends), when the job returns,
        # or here if nothing runs or anything raises (kept, it would stall the poller).
        running = self.running
        running.launch(execution)
        try:
            if row.task_name in self._persistent:
                read_schedule_row(execution)
            # Claimed ahead of its time: held (and heartbeated) until then, in its own task;
            # started once both the database's clock (as estimated) and this machine's reach
            # it, so that a job never sees its slot in the future (the estimate may run ahead
            # of this machine's clock by a few milliseconds, and a row it calls due is held).
            if self._ahead and row.execution_time > (earlier := min(now, self.config.clock.now())):
                wait = (row.execution_time - earlier).total_seconds()
                execution.held = True
                task = _start(self._run_at(execution, wait), f"ekbatan:{execution.label}")
            elif not self._prepare(execution):  # the catch-up policy runs none: submitted
                running.release(execution)
                return
            else:
                if self._launch_failures:  # launching works again
                    self._launch_failures.pop(row.key, None)
                if "execution_started" in self.observer.wants:
                    lag = (execution.started - row.execution_time).total_seconds()
                    self.observer.execution_started(row.task_name, row.task_instance, lag)
                name = f"ekbatan:{row.task_name}/{row.task_instance}"  # its label
                work = self._run(execution)
                loop = asyncio.get_running_loop()
                if sys.version_info >= (3, 12):  # eager: see _start
                    task = asyncio.Task(work, loop=loop, name=name, eager_start=True)
                elif loop.get_task_factory() is None:  # asyncio.create_task, written out
                    task = asyncio.Task(work, loop=loop, name=name)
                else:
                    task = loop.create_task(work, name=name)
                if execution.overlap is not None and execution.overlap.cancels:
                    execution.task = task
                    self._arm_overlap(execution)
            execution.task = task
            if task.done():  # started eagerly and done: its slot is back (or comes back here)
                running.release(execution)
            else:  # ``_run`` gives it back, and takes this off, unless cancelled before it ran
                task.add_done_callback(self._ended)
        except Exception as error:  # the rest of the claimed batch is launched all the same
            self._launch_failed(execution, error)
        except BaseException:
            running.release(execution)
            raise

    def _ended(self, task: asyncio.Task[None]) -> None:
        """An execution's task ended without ``_run``'s release (held, or cancelled before
        any of its code ran): its slot comes back."""
        self.running.release_task(task)

    def _launch_failed(self, execution: Execution, error: Exception) -> None:
        """Launching ``execution`` raised (deciding its slot, reading its retry, an
        observer): its row is given back, unpicked, to be claimed again (held, it would be
        heartbeated forever and its slot run by nobody until a restart). An execution whose
        task had started already runs on, and records its result itself."""
        running, task = self.running, execution.task
        if self.launch_errors is not None:
            self.launch_errors.append(error)
        if task is not None:  # started (maybe done already): only arming its timer failed
            task.add_done_callback(partial(running.release, execution))
            log.error(
                "%s (slot %s) started, but preparing it failed afterwards: %s",
                execution.label,
                execution.row.execution_time.isoformat(),
                error,
                exc_info=error,
                extra=self._extra(execution.row),
            )
            return
        row = execution.row
        failures = self._launch_failures.get(row.key, 0) + 1
        if failures == 1 and len(self._launch_failures) >= _LAUNCH_FAILURES_KEPT:
            self._launch_failures.clear()
        self._launch_failures[row.key] = failures
        first, most = _LAUNCH_BACKOFF
        delay = min(first * 2 ** min(failures - 1, 20), most)
        execution.error = error
        if self._slot_row(row):
            # Its due time is its slot: kept. The row stays held (heartbeated: no instance
            # claims it) for the delay, then it is given back to be claimed again.
            log.error(
                "could not launch %s (slot %s, %d times in a row); its row is given back in %s",
                execution.label,
                row.execution_time.isoformat(),
                failures,
                delay,
                exc_info=error,
                extra=self._extra(row),
            )
            execution.held = True
            task = _start(self._give_back(execution, delay), f"ekbatan:{execution.label}")
            execution.task = task
            if task.done():
                running.release(execution)
            else:
                task.add_done_callback(self._ended)
            return
        running.release(execution)
        running.forget(execution)  # not heartbeated: the completer's write is pending
        execution.finished_at = now = self.link.now()
        execution.note = f"launch failed {failures} times in a row; tried again at {now + delay}"
        log.error(
            "could not launch %s (%d times in a row); its row is given back, due again in %s",
            execution.label,
            failures,
            delay,
            exc_info=error,
            extra=self._extra(row),
        )
        # a one-time row (or a backfilled slot, named by its id): due again after the delay,
        # its counters unchanged
        self.submit(Finish(execution.owned, FinishKind.SKIPPED, now + delay), execution)

    def _slot_row(self, row: TaskRow) -> bool:
        """A row whose due time is its slot: a recurring job's row, a schedule row."""
        if row.task_name in self._persistent:
            return True
        return row.task_instance == RECURRING_INSTANCE and isinstance(
            self.jobs.get(row.task_name), DistributedJob
        )

    async def _give_back(self, execution: Execution, delay: timedelta) -> None:
        """Hold a row whose launch failed for ``delay`` (sooner at a stop), then give it
        back, unpicked, its due time (its slot) unchanged."""
        with contextlib.suppress(asyncio.CancelledError):  # a stop (``drain``): given back now
            await asyncio.sleep(delay.total_seconds())
        execution.held = False
        self.running.release(execution)
        self.running.forget(execution)  # not heartbeated: the completer's unpick is pending
        execution.finished_at = self.link.now()
        self.submit(Finish(execution.owned, FinishKind.RELEASED), execution)

    def _arm_overlap(self, execution: Execution) -> None:
        """``Overlap.cancel_other``: stop the execution when its next slot comes due (a timer
        on this instance's loop; no statement until then)."""
        overlap, schedule = execution.overlap, execution.schedule
        if overlap is None or not overlap.cancels or schedule is None or execution.backfill:
            return
        if not execution.recurring and execution.persistent is None:
            return
        if execution.task is None or execution.task.done():
            return
        now = self.link.now()
        following = next_due_after(schedule, execution.execution_time, max(now, execution.started))
        if following is None:
            return
        delay = (schedule.due_time(following) - now).total_seconds()
        loop = asyncio.get_running_loop()
        execution.overlap_timer = loop.call_later(
            max(0.0, delay), self._overlap_due, execution, following
        )

    def _overlap_due(self, execution: Execution, slot: datetime) -> None:
        """The next slot of a still running ``Overlap.cancel_other`` execution came due: stop
        it as ``client.cancel_running`` does; its row then runs that slot."""
        execution.overlap_timer = None
        if execution.task is None or execution.task.done():
            return
        row = execution.row
        request = CancelRequest(
            row.task_name,
            row.task_instance,
            row.version,
            self.name,
            self.link.now(),
            overlap_reason(slot),
        )
        if not execution.request_stop(request):
            return
        if execution.job.is_async:
            execution.overlap_slot = slot  # its task ends now: that slot runs next
            return
        # A plain def job runs on in its thread until it returns (it may poll
        # ctx.cancel_requested): the slot that runs next is the latest one due by then
        # (``Execution._overlapped``), and those passed meanwhile, ``slot`` too once a
        # later one is due, are recorded missed (overlap), not run late one after another.
        log.warning(
            "%s: its next slot %s is due (Overlap.cancel_other), but a plain def job "
            "cannot be interrupted; ctx.cancel_requested is now true, and the latest slot "
            "due when it returns runs next",
            execution.label,
            slot.isoformat(),
            extra=self._extra(row),
        )

    async def _run_at(self, execution: Execution, wait: float) -> None:
        """A row claimed ``wait`` seconds before its time: run it then. Cancelled before it
        starts (at a stop), it is released to run elsewhere."""
        try:
            await asyncio.sleep(wait)
        except asyncio.CancelledError:
            execution.held = False
            self.running.release(execution)
            self.submit(Finish(execution.owned, FinishKind.RELEASED), execution)
            if self.state.stopping:
                return
            raise
        execution.held = False
        execution.started = self.link.now()
        try:
            if not self._prepare(execution):  # the catch-up policy runs none: submitted
                self.running.release(execution)
                return
            if self._launch_failures:  # launching works again
                self._launch_failures.pop(execution.row.key, None)
            if "execution_started" in self.observer.wants:
                lag = (execution.started - execution.row.execution_time).total_seconds()
                self.observer.execution_started(
                    execution.row.task_name, execution.row.task_instance, lag
                )
            self._arm_overlap(execution)
        except Exception as error:  # as a launch that raises: its row is given back
            execution.task = None  # this task runs no job
            self._launch_failed(execution, error)
            return
        await self._run(execution, together=True)

    def _prepare(self, execution: Execution) -> bool:
        """Decide which slot the execution runs (False: its catch-up policy runs none, and the
        row's next time is submitted)."""
        row, schedule = execution.row, execution.schedule
        if schedule is None:
            return True
        if execution.persistent is not None:
            catch_up = self._catch_ups.get(row.task_name)
        elif row.task_instance != RECURRING_INSTANCE:
            slot = backfill_slot(row.task_instance)
            execution.backfill = slot is not None
            execution.slot = slot
            return True
        else:
            catch_up = self._catch_ups.get(row.task_name)
        execution.overlap = self._overlaps.get(row.task_name)
        row_time = row.execution_time
        # A pending buffered slot or retry is honoured whatever the job's policies are now
        # (changed by a deploy or an edit since it was written): it was decided, and its
        # slots accounted for (the slots it skipped named missed), when it was written; read
        # as a slot of its own, its off-grid due time would run or name a slot twice.
        if row.task_data is not None or execution.persistent is not None:
            if execution.persistent is None:
                buffered = read_buffer_mark(row.task_data, row_time)
            else:
                buffered = execution.persistent.buffered_mark(row_time)
            if buffered is not None:
                execution.catch_up, execution.plan = catch_up, SlotPlan(buffered.slot)
                execution.slot, execution.buffered_through = buffered.slot, buffered.through
                return True
        if row.task_data is not None or execution.persistent is not None:
            spec = execution.persistent
            mark = read_mark(row.task_data, row_time) if spec is None else spec.retry_mark(row_time)
            if mark is not None:
                following = schedule.following(mark.slot)
                if following is None or execution.started < schedule.due_time(following):
                    execution.catch_up, execution.plan = catch_up, SlotPlan(mark.slot)
                    execution.slot, execution.retry_of = mark.slot, mark
                    execution.attempt = mark.attempt
                    return True
                execution.dropped = mark  # the next slot came: it runs per the schedule
                row_time = schedule.due_time(following)
        try:
            decided = plan(schedule, catch_up or CatchUp.latest(), row_time, execution.started)
        except Exception:
            log.exception(
                "could not apply the catch-up policy of %s; running its slot as it is",
                execution.label,
                extra=self._extra(row),
            )
            decided = SlotPlan(row.execution_time)
        execution.catch_up, execution.plan = catch_up, decided
        execution.slot = decided.slot
        if decided.slot is None:
            execution.finished_at = execution.started
            self.submit(Finish(execution.owned, FinishKind.SKIPPED, decided.next_time), execution)
            return False
        return True

    async def _run(self, execution: Execution, *, together: bool = False) -> None:
        """Run the job and submit its result. ``together``: one of many held rows that start
        at the same moment; it lets the others start before it records its result (the jobs
        that do not wait would otherwise start one full execution after another)."""
        row = execution.row  # every record logged while it runs names it (its own task)
        # ``bind_log_context`` written out: all three fields, in a dict of this task's own
        LOG_CONTEXT.set(
            {"task_name": row.task_name, "task_instance": row.task_instance, "scheduler": self.name}
        )
        monotonic = self.config.clock.monotonic
        began = monotonic()
        try:
            if self.observer.scopes_executions:
                error, cancelled = await self._call_scoped(execution)
            else:
                error, cancelled = await self._call_job(execution)
        except Abandoned:
            self.running.forget(execution)  # no more heartbeats: revived after the dead window
            self.state.abandoned_at = monotonic()
            return
        finally:
            self.running.release(execution)
            if (task := execution.task) is not None:  # its slot is back: no done callback
                task.remove_done_callback(self._ended)  # (None: started eagerly, not yet set)
            if execution.overlap_timer is not None:
                execution.overlap_timer.cancel()
                execution.overlap_timer = None
        execution.recording = True  # a stop request no longer cancels it (``request_stop``)
        execution.duration = monotonic() - began
        if together:
            await asyncio.sleep(0)
        if execution.settled is not None:
            self._after_commit(execution, error)
            return
        if (  # execution.recurring, written out
            self._definitions is not None
            and not cancelled
            and execution.schedule is not None
            and row.task_instance == RECURRING_INSTANCE
        ):
            if monotonic() >= self._definitions.fresh_until:
                await self._newest_schedule(execution, self._definitions)
            execution.schedule = self.schedule_for(row.task_name) or execution.schedule
        if error is not None:
            self._log_failure(execution, error)
            execution.error = error
            if not cancelled and self.observer.active:
                self.observer.execution_failed(
                    row.task_name, row.task_instance, execution.execution_time, error
                )
        if error is not None and not cancelled and row.task_name in self._pause_after:
            self._pause_schedule_if_failing(execution, error)
        if self.schedule_rows is not None and execution.persistent is not None and not cancelled:
            async with self._counting:
                await count_run(self.schedule_rows, execution)
        link = self.link
        execution.finished_at = link.clock.now() + link.offset  # link.now(), written out
        finish = execution.finish(
            execution.finished_at,
            error=error,
            cancelled=cancelled,
            fallback_delay=self.config.polling_interval,
        )
        if (  # execution.mark, without its call when there is none
            execution.retry_mark is not None or execution.buffer_mark is not None
        ) and not await self._mark_retry(execution):
            finish = execution.without_retry(finish, execution.finished_at)
        if error is not None and not cancelled and row.task_name in self._pause_after:
            await self._pause_if_failing(execution, error)
        self.submit(finish, execution)

    async def _call_scoped(self, execution: Execution) -> tuple[BaseException | None, bool]:
        """``_call_job`` inside the observers' ``execution_scope``. Once the job returned,
        its result is recorded whatever interrupts the scope's exit: a stop request finds it
        recording (``request_stop`` refuses it), and a cancellation of the task there (a
        shutdown's second phase) ends only the scope's exit, not the recording: the row
        would stay picked, its slot run by nobody until revived as a dead execution."""
        result: tuple[BaseException | None, bool] | None = None
        try:
            async with self.observer.execution_scope(execution):  # e.g. its span (otel)
                result = await self._call_job(execution)
                execution.recording = True
        except asyncio.CancelledError:
            if result is None:
                raise
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                task.uncancel()
            log.warning(
                "%s: an observer's execution_scope was interrupted on exit; its result is "
                "recorded all the same",
                execution.label,
                extra=self._extra(execution.row),
            )
        assert result is not None
        return result

    def _pause_schedule_if_failing(self, execution: Execution, error: BaseException) -> None:
        """A schedule row's ``pause_after_failures()``: once reached, the spec its end writes
        says paused (by ``ekbatan``), and its row waits at the paused time (no other write)."""
        spec = execution.persistent
        if spec is None or spec.paused is not None:
            return
        reason = self._failing_reason(execution, error)
        if reason is None:
            return
        paused = {"by": "ekbatan", "at": self.link.now().isoformat(), "reason": reason}
        execution.persistent = replace(spec, paused=paused)
        self._paused(execution, reason)

    def _failing_reason(self, execution: Execution, error: BaseException) -> str | None:
        """Why the job (or schedule) is paused now (None: its failures in a row have not
        reached its ``pause_after_failures()``)."""
        row = execution.row
        limit = self._pause_after[row.task_name]
        failures = (row.consecutive_failures or 0) + 1
        if failures < limit:
            return None
        return storable(
            f"paused after {failures} consecutive failures (pause_after_failures={limit}); "
            f"last error: {type(error).__qualname__}: {error}",
            1000,
        )

    def _paused(self, execution: Execution, reason: str) -> None:
        row = execution.row
        log.error("%s: %s", execution.label, reason, extra=self._extra(row))
        execution.note = "; ".join(n for n in (execution.note, "job paused") if n)
        if self.observer.active:
            self.observer.job_paused(
                row.task_name, row.task_instance, execution.execution_time, reason
            )

    async def _pause_if_failing(self, execution: Execution, error: BaseException) -> None:
        """Pause the job cluster-wide once its failures in a row reach its
        ``pause_after_failures()`` (before the failure is recorded: no next attempt starts)."""
        row = execution.row
        if not execution.recurring or self._pause is None:
            return
        reason = self._failing_reason(execution, error)
        if reason is None:
            return
        failures = (row.consecutive_failures or 0) + 1
        try:
            await self._pause(row.task_name, reason)
        except Exception as failed:
            log.error(
                "%s failed %d times in a row, but could not be paused: %s",
                execution.label,
                failures,
                failed,
                extra=self._extra(row),
            )
            return
        self._paused(execution, reason)

    async def _mark_retry(self, execution: Execution) -> bool:
        """Write the pending retry into the row (still ours, guarded by its version) before
        its result moves it to the retry's time. False: not written (then no retry)."""
        if self._retry_marks is None:
            return False
        try:
            if await self._retry_marks(execution):
                return True
            log.warning(
                "%s: the row was revived elsewhere meanwhile; its retry is not recorded",
                execution.label,
                extra=self._extra(execution.row),
            )
        except Exception as error:
            log.warning(
                "%s: could not record its pending retry (%s); the next slot follows instead",
                execution.label,
                error,
                extra=self._extra(execution.row),
            )
        return False

    async def _newest_schedule(self, execution: Execution, definitions: Definitions) -> None:
        """Re-read the schedules a rolling deploy stored. Whatever goes wrong here, the
        result is still recorded (by the schedule the execution had): an exception would end
        this task with the row picked and heartbeated, its slot run by nobody."""
        try:
            await definitions.refresh(PRE_COMPLETION_MAX_AGE)
        except Exception:
            log.exception(
                "could not look for a newer stored schedule of %s; its next time comes from "
                "the schedule it ran by",
                execution.label,
                extra=self._extra(execution.row),
            )
            return

    def _after_commit(self, execution: Execution, error: BaseException | None) -> None:
        """The job's ``ctx.transaction()`` committed its slot: report it as recorded."""
        if error is not None:
            log.error(
                "%s raised after its ctx.transaction() committed; the slot stays completed "
                "(put what can fail inside the block, or before it)",
                execution.label,
                exc_info=error,
                extra=self._extra(execution.row),
            )
        assert execution.settled is not None
        self.settled(execution.settled, execution)

    def _log_failure(self, execution: Execution, error: BaseException) -> None:
        if isinstance(error, ExecutionCancelled):
            return  # ``ctx.cancel()``: not a failure to log
        if isinstance(error, ExecutionSuperseded):
            log.warning("%s", error, extra=self._extra(execution.row))
        elif isinstance(error, JobTimedOut):
            log.error(
                "%s (slot %s)",
                error,
                execution.row.execution_time.isoformat(),
                extra=self._extra(execution.row),
            )
        elif error is execution.unfit:
            log.error("%s", error, extra=self._extra(execution.row))
        else:
            log.error(
                "%s (slot %s) failed",
                execution.label,
                execution.row.execution_time.isoformat(),
                exc_info=error,
                extra=self._extra(execution.row),
            )

    async def _call_job(self, execution: Execution) -> tuple[BaseException | None, bool]:
        """Run the job: (the exception it raised, whether it was cancelled at shutdown)."""
        # what ctx.transaction() opens, built on its first use (most jobs never open one)
        opener = None if self.transactions is None else partial(self._open, execution, [])
        row, spec = execution.row, execution.persistent
        job = execution.job
        # The context handed to ``execute``: the class called with its fields in their order
        # (``execution_context``'s body: 15 keywords through a function cost ~2k instructions
        # more per execution; tests/test_named_rows.py checks that each lands in its field).
        ctx: ExecutionContext[Any] = ExecutionContext(
            row.task_name,  # task_name
            row.task_instance,  # task_instance
            row.execution_time if execution.slot is None else execution.slot,  # execution_time
            row.picked_by or "",  # picked_by
            row.version,  # version
            row.task_data if spec is None else spec.data_bytes(where=execution.label),  # task_data
            execution.heartbeat,  # heartbeat_state
            row.consecutive_failures or 0,  # consecutive_failures
            self._stopping,  # shutting_down
            execution.is_timed_out,  # timed_out
            opener,  # transactions
            execution.backfill,  # is_backfill
            (JOB_KINDS.get(type(job)) or job_kind(job))[1],  # data_model
            execution.attempt,  # attempt
            execution.cancel_requested,  # cancel_check
        )
        # only a typed job's data (or an unreadable schedule row) can park it
        if (execution.unfit is not None or ctx.data_model is not None) and (
            unfit := execution.unfit_data(ctx)
        ) is not None:
            return unfit, False  # parked: execute() is not called
        if execution.cancel is not None:  # asked to stop while held (claimed ahead): not run
            return self._stopped(execution), False
        timeout = self._timeouts.get(execution.row.task_name)
        try:
            if self._is_async[execution.row.task_name]:
                if timeout is None:
                    await execution.job.execute(ctx)  # type: ignore[misc]
                else:
                    work = execution.job.execute(ctx)
                    return await self._timer.run_async(execution, work, timeout), False  # type: ignore[arg-type]
            else:
                error = await self._call_sync(execution, ctx, timeout)
                if execution.cancel is not None:
                    return self._stopped(execution, error), False
                return error, False
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if execution.cancel is not None and not self.state.stopping:
                if task is not None:
                    task.uncancel()
                return self._stopped(execution), False
            if self.state.stopping:
                log.warning(
                    "%s cancelled at shutdown; its slot is released to run again",
                    execution.label,
                    extra=self._extra(execution.row),
                )
                return None, True
            if task is not None and task.cancelling():
                raise  # this execution's task itself is being cancelled (not by us)
            # The job raised CancelledError itself (a future it awaited was cancelled): a
            # failure like any other. Re-raising would leave the row picked and heartbeated
            # forever, its slot run by nobody.
            return exc, False
        except Abandoned:
            raise
        except Exception as exc:
            return exc, False
        return None, False

    def _stopped(
        self, execution: Execution, cause: BaseException | None = None
    ) -> ExecutionCancelled:
        """The error recorded for an execution stopped on request (``cancel_running``)."""
        assert execution.cancel is not None
        error = ExecutionCancelled(execution.cancel.describe())
        error.__cause__ = cause
        log.warning(
            "%s (slot %s) %s",
            execution.label,
            execution.execution_time.isoformat(),
            execution.cancel.describe(),
            extra=self._extra(execution.row),
        )
        return error

    def _open(
        self, execution: Execution, made: list[TransactionOpener], target: Any = None
    ) -> AbstractAsyncContextManager[Any]:
        """``ctx.transaction()``: its ``SlotTransaction`` is built on the first call."""
        if not made:
            assert self.transactions is not None
            made.append(self.transactions(execution))
        return made[0](target)

    async def _call_sync(
        self, execution: Execution, ctx: ExecutionContext, timeout: timedelta | None
    ) -> BaseException | None:
        """A plain ``def`` job in a worker thread; its timeout is cooperative."""
        disarm = self._timer.arm(execution, timeout) if timeout is not None else None
        try:
            # in the task's context: the row's log fields, what an observer's scope made current
            await asyncio.get_running_loop().run_in_executor(
                self._thread_pool(), contextvars.copy_context().run, execution.job.execute, ctx
            )
            error: BaseException | None = None
        except Exception as exc:
            error = exc
        finally:
            if disarm is not None:
                disarm()
        if timeout is not None and execution.timed_out:
            timed_out = self._timer.timed_out(execution, timeout)
            timed_out.__cause__ = error
            return timed_out
        return error

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                max_workers=max(32, 2 * self.running.batch_size), thread_name_prefix="ekbatan-job"
            )
        return self._threads

    async def drain(self, wait: timedelta) -> None:
        """Shutdown's two phases: wait up to ``wait`` for the running executions; cancel the
        async ones and wait up to ``wait`` again; abandon what still runs (its row stays
        picked and is revived as a dead execution). Rows claimed ahead that have not started
        are released first, for another instance to run at their time."""
        for execution in self.running:
            if execution.held and execution.task is not None:
                execution.task.cancel()
        tasks = {e.task for e in self.running if e.task is not None}
        if not tasks:
            return
        log.info(
            "scheduler %s stopping: waiting up to 2x %s for %d running executions",
            self.name,
            wait,
            len(tasks),
            extra={"scheduler": self.name},
        )
        seconds = wait.total_seconds()
        _, pending = await asyncio.wait(tasks, timeout=seconds)
        if pending:
            for execution in self.running:
                # not one recording its result (the job returned): it ends by itself
                if execution.task in pending and execution.job.is_async and not execution.recording:
                    execution.task.cancel()
            _, pending = await asyncio.wait(pending, timeout=seconds)
        for execution in self.running:
            if execution.task in pending:
                log.warning(
                    "abandoning %s: still running after 2x %s; its row stays picked and "
                    "is revived as a dead execution",
                    execution.label,
                    wait,
                    extra=self._extra(execution.row),
                )
                self.running.forget(execution)

    def close(self) -> None:
        """Let go of the worker threads (a job still running in one is abandoned)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _extra(self, row: TaskRow) -> dict[str, Any]:
        return log_extra(row, self.name)
