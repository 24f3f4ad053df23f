"""``Executor``: runs each claimed row as its own asyncio task (a plain ``def`` job in a worker
thread) and hands the result to the completer; at shutdown, waits for the executions, cancels
the async ones and waits again, then abandons what is left."""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any

from ..domain.backfill import backfill_slot
from ..domain.catchup import CatchUp, SlotPlan, plan
from ..domain.context import ExecutionContext, HeartbeatState, TransactionOpener
from ..domain.errors import ExecutionSuperseded, JobTimedOut
from ..domain.job import RECURRING_INSTANCE, Job
from ..domain.limits import JobLimits
from ..domain.logs import bind_log_context, library_logger
from ..domain.rows import Finish, FinishKind, TaskRow
from ..domain.schedules import Schedule
from .config import SchedulerConfig
from .execution import Execution
from .link import DatabaseLink
from .logs import log_extra
from .observer import ObserverDispatch
from .running import RunningExecutions, RunState
from .timeouts import Abandoned, TimeoutRunner

__all__ = ["Executor"]

log = library_logger(__name__)


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
        schedules: Mapping[str, Schedule],
        config: SchedulerConfig,
        link: DatabaseLink,
        state: RunState,
        running: RunningExecutions,
        observer: ObserverDispatch,
        submit: Callable[[Finish, Execution], None],
        settled: Callable[[Finish, Execution], None],
        transactions: Callable[[Execution], TransactionOpener] | None = None,
        limits: Mapping[str, JobLimits] | None = None,
        catch_ups: Mapping[str, CatchUp] | None = None,
        before_recording: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.jobs = jobs
        self.schedules = schedules
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
        self._timeouts = {n: lim.timeout for n, lim in (limits or {}).items() if lim.timeout}
        self._catch_ups = dict(catch_ups or {})
        self._before_recording = before_recording
        """Awaited before a recurring row's next time is computed (the newest schedule)."""
        self._timer = TimeoutRunner(name, config.grace)
        self._threads: ThreadPoolExecutor | None = None
        self._heartbeats = (config.heartbeat_interval, config.dead_after, config.clock.monotonic)
        """An execution's ``HeartbeatState`` arguments (the configuration is fixed by now)."""
        self._stopping = lambda: state.stopping
        """Answers ``ctx.is_shutting_down`` (one function for every execution)."""
        self._ahead = bool(config.claim_ahead)
        """Rows may be claimed before their time (``claim_ahead``): each starts at its own."""

    def launch(self, row: TaskRow) -> None:
        """Start running a row this instance claimed."""
        job = self.jobs.get(row.task_name)
        if job is None:  # cannot happen: the poll asks only for our names
            log.error("claimed a row of unknown task %s", row.task_name, extra=self._extra(row))
            return
        interval, dead_after, monotonic = self._heartbeats
        heartbeat = HeartbeatState(interval, dead_after, monotonic, monotonic())
        now = self.link.now()
        execution = Execution(row, job, heartbeat, now, self.schedules.get(row.task_name))
        self.running.started(execution)
        # Claimed ahead of its time: held (and heartbeated) until then, in its own task;
        # started once both the database's clock (as estimated) and this machine's reach it,
        # so that a job never sees its slot in the future (the estimate may run ahead of this
        # machine's clock by a few milliseconds, and a row it calls due is held too).
        if self._ahead and row.execution_time > (earlier := min(now, self.config.clock.now())):
            wait = (row.execution_time - earlier).total_seconds()
            execution.held = True
            execution.task = _start(self._run_at(execution, wait), f"ekbatan:{execution.label}")
            return
        if self._begin(execution):
            execution.task = _start(self._run(execution), f"ekbatan:{execution.label}")

    def _begin(self, execution: Execution) -> bool:
        """Decide the slot and report the start (False: the catch-up policy runs none, and
        the row's next time is submitted)."""
        if not self._prepare(execution):
            self.running.returned()
            assert execution.plan is not None
            skipped = Finish(execution.owned, FinishKind.SKIPPED, execution.plan.next_time)
            self.submit(skipped, execution)
            return False
        if self.observer.active:
            row = execution.row
            lag = (execution.started - row.execution_time).total_seconds()
            self.observer.execution_started(row.task_name, row.task_instance, lag)
        return True

    async def _run_at(self, execution: Execution, wait: float) -> None:
        """A row claimed ``wait`` seconds before its time: run it then. Cancelled before it
        starts (at a stop), it is released to run elsewhere."""
        try:
            await asyncio.sleep(wait)
        except asyncio.CancelledError:
            execution.held = False
            self.running.returned()
            self.submit(Finish(execution.owned, FinishKind.RELEASED), execution)
            if self.state.stopping:
                return
            raise
        execution.held = False
        execution.started = self.link.now()
        if self._begin(execution):
            await self._run(execution, together=True)

    def _prepare(self, execution: Execution) -> bool:
        """Decide which slot the execution runs (False: its catch-up policy runs none)."""
        row, schedule = execution.row, execution.schedule
        if schedule is None:
            return True
        if row.task_instance != RECURRING_INSTANCE:
            slot = backfill_slot(row.task_instance)
            execution.backfill = slot is not None
            execution.slot = slot
            return True
        catch_up = self._catch_ups.get(row.task_name)
        try:
            decided = plan(
                schedule, catch_up or CatchUp.latest(), row.execution_time, execution.started
            )
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
            return False
        return True

    async def _run(self, execution: Execution, *, together: bool = False) -> None:
        """Run the job and submit its result. ``together``: one of many held rows that start
        at the same moment; it lets the others start before it records its result (the jobs
        that do not wait would otherwise start one full execution after another)."""
        row = execution.row  # every record logged while it runs names it (its own task)
        bind_log_context(
            task_name=row.task_name, task_instance=row.task_instance, scheduler=self.name
        )
        monotonic = self.config.clock.monotonic
        began = monotonic()
        try:
            if self.observer.scopes_executions:
                async with self.observer.execution_scope(execution):  # e.g. its span (otel)
                    error, cancelled = await self._call_job(execution)
            else:
                error, cancelled = await self._call_job(execution)
        except Abandoned:
            self.running.forget(execution)  # no more heartbeats: revived after the dead window
            return
        finally:
            self.running.returned()
        execution.duration = monotonic() - began
        if together:
            await asyncio.sleep(0)
        if execution.settled is not None:
            self._after_commit(execution, error)
            return
        if self._before_recording is not None and not cancelled and execution.recurring:
            await self._newest_schedule(execution)
        if error is not None:
            self._log_failure(execution, error)
            execution.error = error
        execution.finished_at = self.link.now()
        finish = execution.finish(
            execution.finished_at,
            error=error,
            cancelled=cancelled,
            fallback_delay=self.config.polling_interval,
        )
        self.submit(finish, execution)

    async def _newest_schedule(self, execution: Execution) -> None:
        """Take the schedule a rolling deploy stored, if newer. Whatever goes wrong here, the
        result is still recorded (by the schedule the execution had): an exception would end
        this task with the row picked and heartbeated, its slot run by nobody."""
        assert self._before_recording is not None
        try:
            await self._before_recording()
        except Exception:
            log.exception(
                "could not look for a newer stored schedule of %s; its next time comes from "
                "the schedule it ran by",
                execution.label,
                extra=self._extra(execution.row),
            )
            return
        execution.schedule = self.schedules.get(execution.row.task_name, execution.schedule)

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
        ctx = execution.context(self._stopping, self._opener(execution))
        if (unfit := execution.unfit_data(ctx)) is not None:
            return unfit, False  # parked: execute() is not called
        timeout = self._timeouts.get(execution.row.task_name)
        try:
            if self._is_async[execution.row.task_name]:
                if timeout is None:
                    await execution.job.execute(ctx)  # type: ignore[misc]
                else:
                    work = execution.job.execute(ctx)
                    return await self._timer.run_async(execution, work, timeout), False  # type: ignore[arg-type]
            else:
                return await self._call_sync(execution, ctx, timeout), False
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
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

    def _opener(self, execution: Execution) -> TransactionOpener | None:
        """What ``ctx.transaction()`` opens, built on its first use (most jobs never open
        one, and the hot path pays for a closure only)."""
        make = self.transactions
        if make is None:
            return None
        made: list[TransactionOpener] = []

        def open_transaction(target: Any = None) -> AbstractAsyncContextManager[Any]:
            if not made:
                made.append(make(execution))
            return made[0](target)

        return open_transaction

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
                if execution.task in pending and execution.job.is_async:
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
