"""The scheduler core: poller, executor, completer and housekeeper on one asyncio loop.

Four supervised background tasks share the state of one ``Scheduler``:

* the **poller** claims due rows in batches and starts one asyncio task per execution;
  it sleeps until the earliest known due time or the polling interval, whichever is sooner;
* each **execution** runs the job (a plain ``def`` in a worker thread) and hands its result
  to the completer;
* the **completer** records results in batches, each write guarded by the claimed version;
* the **housekeeper** heartbeats every running execution, revives dead executions and deletes
  unresolved rows.

A database error never ends a loop: it is logged, shown in ``status()``, and retried with
backoff. Any other exception in a loop is logged and the loop restarts (supervision).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from .backoff import Backoff
from .config import SchedulerConfig
from .errors import ConfigurationError
from .execution import Execution
from .housekeeping import Housekeeping
from .job import RECURRING_INSTANCE, DistributedJob, HeartbeatState, _Job
from .lag import LoopLagMonitor
from .observer import ObserverDispatch, finished_event
from .operations.recorder import OperationsRecorder
from .operations.repository import OperationsRepository
from .repository.base import (
    HistoryTableMissing,
    HistoryUnwritable,
    PollingStrategy,
    TaskRepository,
)
from .repository.model import Finish, HistoryEntry, TaskKey, TaskRow
from .schedules import Schedule
from .status import ExecutionStatus, SchedulerStatus

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)

_MAX_FINISH_BATCH = 1000


class Scheduler(Housekeeping):
    """Runs the registered jobs against one ``scheduled_tasks`` table."""

    def __init__(
        self, repository: TaskRepository, jobs: Sequence[_Job], config: SchedulerConfig
    ) -> None:
        config.validate()
        self.repository = repository
        self.config = config
        self.name = config.scheduler_name
        self.clock = config.clock
        self.jobs: dict[str, _Job] = {job.name(): job for job in jobs}
        self.schedules: dict[str, Schedule] = {
            name: job.schedule()
            for name, job in self.jobs.items()
            if isinstance(job, DistributedJob)
        }
        self._active = [
            name
            for name, job in self.jobs.items()
            if not (name in self.schedules and self.schedules[name].is_disabled)
        ]
        strategy = config.polling_strategy
        if strategy is None:
            strategy = (
                PollingStrategy.LOCK_AND_FETCH
                if repository.supports_skip_locked
                else PollingStrategy.FETCH
            )
        if strategy == PollingStrategy.LOCK_AND_FETCH and not repository.supports_skip_locked:
            raise ConfigurationError(
                f"polling_strategy 'lock-and-fetch' needs FOR UPDATE SKIP LOCKED, which the "
                f"{repository.dialect_name} dialect lacks; use 'fetch'"
            )
        self.polling_strategy = strategy
        self.batch_size = config.batch_size or max(50, 3 * len(self.jobs))
        self._is_async = {name: job.is_async for name, job in self.jobs.items()}

        self.recorder = OperationsRecorder(
            OperationsRepository(repository),
            self.name,
            history=config.history,
            retention=config.history_retention,
            on_db_error=self._db_failed,
        )
        self.running: dict[TaskKey, Execution] = {}
        self._pending: list[tuple[Finish, Execution]] = []
        self._executing = 0
        """Executions whose job has not returned yet: only these count against batch_size,
        so the next claim overlaps the recording of the previous batch's results."""
        self._waiting_for_capacity = False
        self._poll_lease = repository.lease()
        self._finish_lease = repository.lease()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._threads: ThreadPoolExecutor | None = None
        self._wake = asyncio.Event()
        self._finish_ready = asyncio.Event()
        self._poll_requested = False
        self._planned_due: datetime | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._completer_closed = False
        self._started_at: datetime | None = None
        self._db_offset = timedelta(0)
        self._db_reachable: bool | None = None
        self._last_error: str | None = None
        self._last_error_logged = -1e9
        self._last_poll: datetime | None = None
        self._loop_restarts = 0
        self.lag = LoopLagMonitor(
            self.name,
            config.heartbeat_interval,
            config.dead_after,
            suspects=lambda: sorted({e.label for e in self.running.values() if e.job.is_async}),
            now=self.db_time,
        )
        self._last_unresolved_check = -1e9
        self._next_death: datetime | None = None
        """When the next picked row would be dead (database time): check for it then."""
        self.observer = ObserverDispatch(config.observers, self.name)
        self.observer.attached(self)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background tasks and return at once; no database round trip here."""
        if self._tasks:
            raise RuntimeError(f"scheduler {self.name} is already started")
        self._started_at = self.clock.now()
        log.info(
            "scheduler %s starting: %d jobs, %s, batch %d, polling every %s, heartbeat %s x %d",
            self.name,
            len(self.jobs),
            self.polling_strategy,
            self.batch_size,
            self.config.polling_interval,
            self.config.heartbeat_interval,
            self.config.missed_heartbeats_limit,
            extra={"scheduler": self.name},
        )
        loops: dict[str, Callable[[], Awaitable[None]]] = {
            "poller": self._poll_loop,
            "completer": self._complete_loop,
            "housekeeper": self._housekeeping_loop,
            "loop-lag monitor": self.lag.run,
            "history writer": self.recorder.run,
        }
        if self.config.listen and self.repository.supports_notify:
            loops["listener"] = self._listen_loop
        for name, loop in loops.items():
            self._tasks[name] = asyncio.create_task(self._supervise(name, loop))

    async def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until startup reached the database and created the recurring rows."""
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Two-phase shutdown: wait, cancel and wait again, then stop heartbeats (last)."""
        if self._stopping:
            return
        self._stopping = True
        self.request_poll()
        wait = self.config.shutdown_max_wait.total_seconds()
        await self._cancel("listener")
        # The poller is not cancelled: a claim interrupted mid-statement may have committed
        # and its rows would stay picked, run by nobody. Woken above, it finishes its statement,
        # starts what it claimed (waited for below like any execution) and returns.
        await self._drain("poller", timeout=max(wait, 1.0))
        tasks = {e.task for e in self.running.values() if e.task is not None}
        if tasks:
            log.info(
                "scheduler %s stopping: waiting up to 2x %s for %d running executions",
                self.name,
                self.config.shutdown_max_wait,
                len(tasks),
                extra={"scheduler": self.name},
            )
            _, pending = await asyncio.wait(tasks, timeout=wait)
            if pending:
                for execution in list(self.running.values()):
                    if execution.task in pending and execution.job.is_async:
                        execution.task.cancel()
                _, pending = await asyncio.wait(pending, timeout=wait)
            for execution in list(self.running.values()):
                if execution.task in pending:
                    log.warning(
                        "abandoning %s: still running after 2x %s; its row stays picked and "
                        "is revived as a dead execution",
                        execution.label,
                        self.config.shutdown_max_wait,
                        extra=self._extra(execution.row),
                    )
                    self.running.pop(execution.row.key, None)
        self._completer_closed = True
        self._finish_ready.set()
        await self._drain("completer", timeout=max(wait, 1.0))
        self.recorder.close()
        await self._drain("history writer", timeout=max(wait, 1.0))
        # Nothing runs any more: heartbeats can stop. Removing this instance's row is cosmetic
        # (a stopped instance's row would age out anyway): never worth a long wait on a
        # connection that died silently. Both at once: a statement cancelled on a silent
        # connection costs SQLAlchemy's polite close (2 s) each.

        async def leave() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recorder.leave(), timeout=max(wait, 1.0))

        await asyncio.gather(self._cancel("housekeeper", "loop-lag monitor"), leave())
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("scheduler %s stopped", self.name, extra={"scheduler": self.name})

    async def _drain(self, name: str, timeout: float) -> None:
        """Let a loop that was told to close finish its work; cancel it after ``timeout``."""
        task = self._tasks.get(name)
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except TimeoutError:
            task.cancel()
            log.warning("scheduler %s: the %s did not finish in %.0fs", self.name, name, timeout)

    async def _cancel(self, *names: str) -> None:
        """Cancel the named loops all at once, then wait for them: a loop cancelled in a
        statement on a silent connection takes SQLAlchemy's polite close (2 s), and those
        waits overlap instead of adding up."""
        tasks = [self._tasks[name] for name in names if name in self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def is_shutting_down(self) -> bool:
        return self._stopping

    # -- time ----------------------------------------------------------------------------

    def db_time(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.clock.now() + self._db_offset

    def _observe_db_time(self, db_now: datetime, sent: datetime | None = None) -> None:
        """Learn the database clock's offset from ``now()`` read in a statement sent at local
        time ``sent``: ``now()`` is taken when the statement starts, so measuring against the
        time the answer arrived would make every later wake-up late by that round trip."""
        self._db_offset = db_now - (sent if sent is not None else self.clock.now())
        if self._db_reachable is False:
            log.warning("scheduler %s: database reachable again", self.name)
        self._db_reachable = True

    def _db_failed(self, error: BaseException, where: str) -> None:
        self._last_error = f"{where}: {type(error).__name__}: {error}"
        if self.observer.active:
            self.observer.database_error(where, error)
        was_reachable = self._db_reachable
        self._db_reachable = False
        now = self.clock.monotonic()
        if was_reachable is not False or now - self._last_error_logged > 60:
            self._last_error_logged = now
            log.error(
                "scheduler %s: database error during %s (will retry): %s",
                self.name,
                where,
                self._last_error,
                extra={"scheduler": self.name},
            )

    # -- wake-ups --------------------------------------------------------------------------

    def request_poll(self) -> None:
        """Poll now (new due work, capacity freed, a revival, or shutdown)."""
        self._poll_requested = True
        self._wake.set()

    def note_due(self, when: datetime) -> None:
        """Something becomes due at ``when`` (database time): wake up then, if that is sooner."""
        if self._planned_due is None or when < self._planned_due:
            self._planned_due = when
            self._wake.set()

    async def _sleep(self, seconds: float) -> None:
        """Sleep until the deadline, an earlier known due time, or a poll request."""
        loop_time = asyncio.get_running_loop().time
        deadline = loop_time() + seconds
        while not self._stopping:
            if self._planned_due is not None:
                until_due = (self._planned_due - self.db_time()).total_seconds() + 0.002
                deadline = min(deadline, loop_time() + max(0.0, until_due))
            remaining = deadline - loop_time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            self._wake.clear()
            if self._poll_requested:
                self._poll_requested = False
                return

    # -- loops -----------------------------------------------------------------------------

    async def _supervise(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self._loop_restarts += 1
                delay = backoff.next()
                log.exception(
                    "scheduler %s: the %s loop crashed; restarting it in %.2fs",
                    self.name,
                    name,
                    delay,
                    extra={"scheduler": self.name},
                )
                self._last_error = f"{name} loop crashed (restarted)"
                await asyncio.sleep(delay)

    async def _poll_loop(self) -> None:
        try:
            await self._polling()
        finally:
            await self._poll_lease.release()

    async def _polling(self) -> None:
        if not self._ready.is_set():
            await self._bootstrap()
        backoff = Backoff(self.config.polling_interval.total_seconds())
        interval = self.config.polling_interval.total_seconds()
        contended = Backoff(interval, floor=0.005)
        lease = self._poll_lease
        while not self._stopping:
            limit = self.batch_size - self._executing
            if limit <= 0 or len(self.running) >= 2 * self.batch_size:
                # Nothing can be claimed until executions finish (they wake us then), so a
                # known due time is moot; one in the past would make _sleep return at once
                # without yielding, and this loop would spin and starve the event loop.
                self._planned_due = None
                self._waiting_for_capacity = True
                lease.idle()
                await self._sleep(interval)
                continue
            began = self.clock.monotonic()
            sent = self.clock.now()
            try:
                result = await self.repository.poll(
                    self._active, limit, self.name, self.polling_strategy, lease=lease
                )
            except Exception as error:
                self._db_failed(error, "poll")
                await self._sleep(backoff.next())
                continue
            backoff.reset()
            if self.observer.active:
                self.observer.polled(self.clock.monotonic() - began, len(result.claimed))
            self._observe_db_time(result.db_now, sent)
            self._last_poll = result.db_now
            for row in result.claimed:
                self._launch(row)
            # More may be due: a full batch claimed, or (fetch) a full batch seen of which peers
            # won some; sleeping now would leave a full table to the winners for a whole interval.
            if len(result.claimed) >= limit or result.more_due:
                continue  # more may be due
            if result.next_due is not None and result.next_due <= result.db_now:
                # A due row this poll did not get: a peer's lock hid it, which is a claim in
                # flight or only a peer's scan. Look again soon, backing off in case the lock
                # is long held, rather than leave the slot to the next polling interval.
                retry = timedelta(seconds=contended.next())
                self._planned_due = result.db_now + retry
            else:
                contended.reset()
                self._planned_due = result.next_due
            await lease.release()  # nothing more due now: an idle poller holds no connection
            await self._sleep(interval)

    def run_claimed(self, row: TaskRow) -> None:
        """Run a row this instance claimed outside the poller (a forced run-now)."""
        if not self._tasks or self._stopping:
            raise RuntimeError(f"scheduler {self.name} is not running")
        self._launch(row)

    def _launch(self, row: TaskRow) -> None:
        job = self.jobs.get(row.task_name)
        if job is None:  # cannot happen: the poll asks only for our names
            log.error("claimed a row of unknown task %s", row.task_name, extra=self._extra(row))
            return
        heartbeat = HeartbeatState(
            heartbeat_interval=self.config.heartbeat_interval,
            dead_after=self.config.dead_after,
            _monotonic=self.clock.monotonic,
            last_success=self.clock.monotonic(),
        )
        execution = Execution(
            row, job, heartbeat, self.db_time(), schedule=self.schedules.get(row.task_name)
        )
        self.running[row.key] = execution
        self._executing += 1
        if self.observer.active:
            lag = (execution.started - row.execution_time).total_seconds()
            self.observer.execution_started(row.task_name, row.task_instance, lag)
        execution.task = asyncio.create_task(
            self._execute(execution), name=f"ekbatan:{execution.label}"
        )

    async def _execute(self, execution: Execution) -> None:
        error: BaseException | None = None
        cancelled = False
        began = self.clock.monotonic()
        try:
            ctx = execution.context(lambda: self._stopping)
            if self._is_async[execution.row.task_name]:
                await execution.job.execute(ctx)  # type: ignore[misc]
            else:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(
                        max_workers=max(32, 2 * self.batch_size), thread_name_prefix="ekbatan-job"
                    )
                await asyncio.get_running_loop().run_in_executor(
                    self._threads, execution.job.execute, ctx
                )
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if self._stopping:
                cancelled = True
                log.warning(
                    "%s cancelled at shutdown; its slot is released to run again",
                    execution.label,
                    extra=self._extra(execution.row),
                )
            elif task is not None and task.cancelling():
                raise  # this execution's task itself is being cancelled (not by us)
            else:
                # The job raised CancelledError itself (a future it awaited was cancelled): a
                # failure like any other. Re-raising would leave the row picked and
                # heartbeated forever, its slot run by nobody.
                error = exc
        except Exception as exc:
            error = exc
        finally:
            self._executing -= 1
            if self._waiting_for_capacity:
                self._waiting_for_capacity = False
                self.request_poll()
        if error is not None:
            log.error(
                "%s (slot %s) failed",
                execution.label,
                execution.row.execution_time.isoformat(),
                exc_info=error,
                extra=self._extra(execution.row),
            )
        execution.error = error
        execution.duration = self.clock.monotonic() - began
        execution.finished_at = self.db_time()
        finish = execution.finish(
            execution.finished_at,
            error=error,
            cancelled=cancelled,
            fallback_delay=self.config.polling_interval,
        )
        self._record(execution, finish)

    def _record(self, execution: Execution, finish: Finish) -> None:
        """Hand a result to the completer (no wait: the completer reports what it wrote)."""
        if self._completer_closed:
            log.warning(
                "%s finished after shutdown; its row stays picked and is revived later",
                execution.label,
                extra=self._extra(execution.row),
            )
            return
        execution.recording = True
        self._pending.append((finish, execution))
        self._finish_ready.set()

    async def _complete_loop(self) -> None:
        try:
            await self._completing()
        finally:
            await self._finish_lease.release()

    async def _completing(self) -> None:
        backoff = Backoff(self.config.polling_interval.total_seconds())
        retrying = False  # the last attempt failed: it may have committed, its answer lost
        history_refused = False  # the database refused this batch's history: send it without
        while True:
            if not self._pending:
                if self._completer_closed:
                    return
                self._finish_lease.idle()
                await self._finish_ready.wait()
                self._finish_ready.clear()
                continue
            batch = self._pending[:_MAX_FINISH_BATCH]
            # After an outage a row revived and claimed again by this instance can have a stale
            # result and a fresh one pending together. Only the newest claim can still match
            # the row's version, and the repository answers with keys: the older results are
            # not sent, and count as superseded.
            newest: dict[TaskKey, int] = {}
            for finish, _ in batch:
                owned = finish.owned
                newest[owned.key] = max(newest.get(owned.key, owned.version), owned.version)
            current = [f for f, _ in batch if f.owned.version == newest[f.owned.key]]
            # Where the dialect can, the history is written by the completion statement itself.
            inline = (
                self.repository.writes_history_with_finish
                and self.recorder.enabled
                and not history_refused
            )
            history: list[HistoryEntry] = (
                [self.recorder.entry(e, f) for f, e in batch] if inline else []
            )
            try:
                recorded = await self.repository.finish(
                    current,
                    lease=self._finish_lease,
                    history=history,
                    picked_by=self.name,
                    retry=retrying,
                )
            except HistoryTableMissing as error:
                self.recorder.table_lost(error)
                continue
            except HistoryUnwritable as error:
                # Nothing was written: send the results again at once, without their history.
                self.recorder.dropped(len(history), error)
                history_refused = True
                continue
            except Exception as error:
                self._db_failed(error, "recording results")
                retrying = True
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            ambiguous, retrying, history_refused = retrying, False, False
            del self._pending[: len(batch)]
            for finish, execution in batch:
                key = execution.row.key
                if self.running.get(key) is execution:  # not a newer claim of the same row
                    del self.running[key]
                ok = key in recorded and finish.owned.version == newest[key]
                if not inline:
                    self.recorder.record(execution, finish, ok)
                if self.observer.active:
                    self.observer.execution_finished(finished_event(execution, finish, ok))
                if not ok:
                    log.warning(
                        "%s (slot %s) finished, but its row was revived by another instance "
                        "meanwhile: result not recorded%s",
                        execution.label,
                        execution.row.execution_time.isoformat(),
                        " (or recorded by an earlier attempt of this write whose answer was "
                        "lost to the database error)"
                        if ambiguous
                        else "",
                        extra=self._extra(execution.row),
                    )
                elif (
                    finish.next_time is not None
                    and finish.owned.task_instance == RECURRING_INSTANCE
                ):
                    self.note_due(finish.next_time)
            if self._waiting_for_capacity and len(self.running) < 2 * self.batch_size:
                self._waiting_for_capacity = False
                self.request_poll()

    # -- reporting -------------------------------------------------------------------------

    def _extra(self, row: TaskRow) -> dict[str, Any]:
        return {
            "task_name": row.task_name,
            "task_instance": row.task_instance,
            "scheduler": self.name,
        }

    def status(self) -> SchedulerStatus:
        """A snapshot of this instance's state (for ``/jobs`` and logs)."""
        return SchedulerStatus(
            name=self.name,
            started_at=self._started_at,
            ready=self._ready.is_set(),
            stopping=self._stopping,
            database_reachable=self._db_reachable,
            last_error=self._last_error,
            last_successful_poll=self._last_poll,
            polling_strategy=self.polling_strategy,
            batch_size=self.batch_size,
            loop_restarts=self._loop_restarts,
            loop_lag_events=self.lag.events,
            max_loop_lag=self.lag.max_lag,
            last_loop_lag_at=self.lag.last_at,
            running=[
                ExecutionStatus(
                    task_name=e.row.task_name,
                    task_instance=e.row.task_instance,
                    execution_time=e.row.execution_time,
                    started=e.started,
                    version=e.row.version,
                    fraction_dead=e.heartbeat.fraction_dead,
                    failed_heartbeats=e.heartbeat.failed_heartbeats,
                )
                for e in self.running.values()
            ],
        )
