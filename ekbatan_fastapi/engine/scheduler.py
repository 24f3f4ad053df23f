"""``Scheduler``: runs the registered jobs against one ``scheduled_tasks`` table.

It wires the loops, each an object that owns its state (see docs/architecture.md):

* the **poller** (startup first) claims due rows in batches and hands them to the executor;
* the **executor** runs each as its own asyncio task (a plain ``def`` in a worker thread) and
  hands its result to the completer;
* the **completer** records results in batches, each write guarded by the claimed version;
* the **housekeeper** heartbeats every running execution, revives dead executions and deletes
  unresolved rows;
* the **listener** wakes the poller when any instance schedules work (PostgreSQL);
* the **history recorder** writes the history where the completion does not, and its
  retention loop prunes it hourly in paced batches (off the housekeeper's round);
* the **loop-lag monitor** reports a blocked event loop.

The scheduler keeps the lifecycle: start, supervision (a loop that crashes is logged and
restarted), the two-phase stop, and the status snapshot. A database error never ends a loop:
it is logged, shown in ``status()``, and retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..domain.catchup import CatchUp
from ..domain.errors import ConfigurationError
from ..domain.job import DistributedJob, Job, schedule_of
from ..domain.limits import JobLimits, resolve_limits
from ..domain.logs import bind_log_context, library_logger
from ..domain.rows import PollingStrategy, TaskKey, TaskRow
from ..domain.schedules import Schedule
from ..store.limited import Limit
from .alarm import Alarm
from .backoff import Backoff
from .completer import Completer
from .config import SchedulerConfig
from .definitions import PRE_COMPLETION_MAX_AGE, Definitions
from .execution import Execution
from .executor import Executor
from .history import HistoryRecorder
from .housekeeper import Housekeeper
from .lag import LoopLagMonitor
from .link import DatabaseLink
from .listener import Listener
from .observer import ObserverDispatch
from .poller import Poller
from .running import Holdings, RunningExecutions, RunState
from .slots import SlotCounter
from .startup import Startup
from .status import ExecutionStatus, SchedulerStatus
from .transaction import SlotTransaction

if TYPE_CHECKING:
    from ..store.dialects import Store

__all__ = ["Scheduler"]

log = library_logger(__name__)

_CANCEL_WAIT = 5.0
"""Seconds a stop waits for a cancelled loop to end (a statement cancelled on a silent
connection costs SQLAlchemy's polite close, 2 s): past it, the loop is left behind."""


def _strategy(config: SchedulerConfig, store: Store) -> PollingStrategy:
    """The configured polling strategy, or the dialect's best."""
    supported = store.tasks.supports_skip_locked
    if config.polling_strategy is None:
        return PollingStrategy.LOCK_AND_FETCH if supported else PollingStrategy.FETCH
    strategy = PollingStrategy(config.polling_strategy)
    if strategy is PollingStrategy.LOCK_AND_FETCH and not supported:
        raise ConfigurationError(
            f"polling_strategy 'lock-and-fetch' needs FOR UPDATE SKIP LOCKED, which the "
            f"{store.dialect.name} dialect lacks; use 'fetch'"
        )
    return strategy


def _check_claim_ahead(config: SchedulerConfig, store: Store) -> None:
    if config.claim_ahead and not store.tasks.supports_claim_ahead:
        raise ConfigurationError(
            f"claim_ahead ({config.claim_ahead.total_seconds():g} s) is not supported on the "
            f"{store.dialect.name} dialect (its task store cannot claim ahead); set it to 0 (PT0S)"
        )


class Scheduler:
    """Runs the registered jobs against one ``scheduled_tasks`` table."""

    def __init__(self, store: Store, jobs: Sequence[Job], config: SchedulerConfig) -> None:
        config.validate()
        self.store = store
        self.config = config
        self.name = config.scheduler_name
        self.clock = config.clock
        self.jobs: dict[str, Job] = {job.name(): job for job in jobs}
        self.schedules: dict[str, Schedule] = {
            name: schedule_of(job)
            for name, job in self.jobs.items()
            if isinstance(job, DistributedJob)
        }
        self.catch_ups: dict[str, CatchUp] = {
            name: job.catch_up()
            for name, job in self.jobs.items()
            if isinstance(job, DistributedJob)
        }
        active = [
            name
            for name in self.jobs
            if not (name in self.schedules and self.schedules[name].is_disabled)
        ]
        self.limits: dict[str, JobLimits] = {
            name: resolve_limits(job, config.job_overrides.get(name))
            for name, job in self.jobs.items()
        }
        """Each job's timeout and concurrency limit (its own, or the settings' override)."""
        self.polling_strategy = _strategy(config, store)
        _check_claim_ahead(config, store)
        self.batch_size = config.batch_size or max(50, 3 * len(self.jobs))
        self.observer = ObserverDispatch(config.observers, self.name)
        self.state = RunState()
        self.link = DatabaseLink(self.name, self.clock, self.observer, store.db.diagnose)
        self.alarm = Alarm(self.link, lambda: self.state.stopping, config.claim_ahead)
        self.executions = RunningExecutions(self.batch_size, self.alarm.request_poll)
        self.recorder = HistoryRecorder(
            store.operations,
            self.name,
            history=config.history,
            retention=config.history_retention,
            on_db_error=self.link.failed,
        )
        self._wire(active)
        self.lag = LoopLagMonitor(
            self.name,
            config.heartbeat_interval,
            config.dead_after,
            suspects=self.executions.async_labels,
            now=self.link.now,
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.observer.attached(self)

    def _wire(self, active: list[str]) -> None:
        """Build the loops; each gets the collaborators it uses, nothing more."""
        self._wire_executions()
        self._wire_loops(active)

    def _wire_executions(self) -> None:
        """What runs executions and records them; the stored job definitions."""
        store, config = self.store, self.config
        self.completer = Completer(
            name=self.name,
            tasks=store.tasks,
            config=config,
            link=self.link,
            alarm=self.alarm,
            running=self.executions,
            history=self.recorder,
            observer=self.observer,
            limited={n for n, lim in self.limits.items() if lim.limited},
            counter=SlotCounter(store.jobs, self.recorder, self.observer)
            if self.catch_ups
            else None,
        )
        self.definitions = Definitions(
            name=self.name,
            jobs=self.jobs,
            schedules=self.schedules,
            catch_ups=self.catch_ups,
            limits=self.limits,
            store=store.jobs,
            config=config,
            now=self.link.now,
        )
        self.executor = Executor(
            name=self.name,
            jobs=self.jobs,
            schedules=self.schedules,
            running=self.executions,
            observer=self.observer,
            submit=self.completer.submit,
            settled=self.completer.settled,
            transactions=self._transaction_for,
            limits=self.limits,
            catch_ups=self.catch_ups,
            before_recording=self._before_recording,
            config=config,
            link=self.link,
            state=self.state,
        )

    def _wire_loops(self, active: list[str]) -> None:
        """Startup, the poller, the housekeeper and the listener."""
        store, config = self.store, self.config
        self.startup = Startup(
            name=self.name,
            jobs=self.jobs,
            schedules=self.schedules,
            tasks=store.tasks,
            definitions=self.definitions,
            alarm=self.alarm,
            history=self.recorder,
            config=config,
            link=self.link,
            state=self.state,
        )
        self.poller = Poller(
            name=self.name,
            names=active,
            limits={
                n: Limit(lim.max_concurrency, lim.concurrency_key)
                for n, lim in self.limits.items()
                if lim.max_concurrency is not None and n in active
            },
            strategy=self.polling_strategy,
            tasks=store.tasks,
            alarm=self.alarm,
            running=self.executions,
            executor=self.executor,
            history=self.recorder,
            observer=self.observer,
            config=config,
            link=self.link,
            state=self.state,
        )
        self.housekeeper = Housekeeper(
            name=self.name,
            names=active,
            known=list(self.jobs),
            tasks=store.tasks,
            alarm=self.alarm,
            running=self.executions,
            history=self.recorder,
            observer=self.observer,
            refresh_definitions=self.definitions.refresh,
            config=config,
            link=self.link,
            state=self.state,
            traces=store.traces,
        )
        self.listener = Listener(
            tasks=store.tasks, config=config, link=self.link, alarm=self.alarm, state=self.state
        )

    async def _before_recording(self) -> None:
        """Before a recurring job's next time is computed: the newest stored schedule."""
        await self.definitions.refresh(PRE_COMPLETION_MAX_AGE)

    def _transaction_for(self, execution: Execution) -> SlotTransaction:
        return SlotTransaction(
            execution,
            tasks=self.store.tasks,
            operations=self.store.operations,
            history=self.recorder,
            config=self.config,
            link=self.link,
        )

    # -- what other layers read and call ---------------------------------------------------

    @property
    def running(self) -> dict[TaskKey, Execution]:
        """The executions this instance holds, by row (running, or recording their result)."""
        return self.executions.by_key

    def holdings(self) -> Holdings:
        """The rows held now, how many executions were launched so far, and whether a claim
        is in flight: two of these, taken around a read of the rows, tell an orphaned claim
        from one whose answer was being processed (``Holdings.settled_since``)."""
        running = self.executions
        return Holdings(frozenset(running.by_key), running.launches, self.state.claiming)

    @property
    def is_shutting_down(self) -> bool:
        return self.state.stopping

    def db_time(self) -> datetime:
        """The database's clock, estimated from the local clock and the last observed offset."""
        return self.link.now()

    def request_poll(self) -> None:
        """Poll now (new due work, capacity freed, a revival, or shutdown)."""
        self.alarm.request_poll()

    def note_due(self, when: datetime) -> None:
        """Something becomes due at ``when`` (database time): wake up then, if that is sooner."""
        self.alarm.note_due(when)

    def claiming(self) -> contextlib.AbstractContextManager[None]:
        """Around a claim made for this instance outside the poller (a forced run-now) and
        the ``run_claimed`` of its row: its row is picked before it is held."""
        return self.state.claim()

    def run_claimed(self, row: TaskRow) -> None:
        """Run a row this instance claimed outside the poller (a forced run-now)."""
        if not self._tasks or self.state.stopping:
            raise RuntimeError(f"scheduler {self.name} is not running")
        self.executor.launch(row)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background tasks and return at once; no database round trip here."""
        if self._tasks:
            raise RuntimeError(f"scheduler {self.name} is already started")
        self.state.started_at = self.clock.now()
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
            "poller": self._start_and_poll,
            "completer": self.completer.run,
            "housekeeper": self.housekeeper.run,
            "loop-lag monitor": self.lag.run,
            "history writer": self.recorder.run,
            "history retention": self.recorder.retain,
        }
        if self.config.listen and self.store.tasks.supports_notify:
            loops["listener"] = self.listener.run
        for name, loop in loops.items():
            self._tasks[name] = asyncio.create_task(self._supervise(name, loop))

    async def _start_and_poll(self) -> None:
        if not self.state.ready.is_set():
            await self.startup.run()
        await self.poller.run()

    async def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until startup reached the database and created the recurring rows."""
        try:
            async with asyncio.timeout(timeout):
                await self.state.ready.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Two-phase shutdown: stop claiming; wait, cancel and wait again for the running
        executions; record their results and history; then stop heartbeats (last)."""
        if self.state.stopping:
            return
        self.state.stopping = True
        self.alarm.request_poll()
        results_wait = min(
            self.config.shutdown_results_wait, self.config.shutdown_max_wait
        ).total_seconds()
        await self._cancel("listener")
        # The poller is not cancelled at once: a claim interrupted mid-statement may have
        # committed and its rows would stay picked, run by nobody until revived. Woken above,
        # it finishes its statement, starts what it claimed (waited for below like any
        # execution) and returns; a database that does not answer gets shutdown_results_wait.
        await self._drain("poller", timeout=results_wait)
        await self.executor.drain(self.config.shutdown_max_wait)
        # Recording the last results, their history and leaving share shutdown_results_wait:
        # with the database down, a stop must still fit a pod's grace period. What is left
        # unrecorded is revived after the dead window, like an abandoned execution.
        deadline = asyncio.get_running_loop().time() + results_wait
        self.completer.close()
        await self._drain("completer", timeout=self._left(deadline))
        self.recorder.close()
        await self._drain("history writer", timeout=self._left(deadline))
        await self._leave(self._left(deadline))
        await self.definitions.close()
        self.executor.close()
        log.info("scheduler %s stopped", self.name, extra={"scheduler": self.name})

    @staticmethod
    def _left(deadline: float) -> float:
        return max(deadline - asyncio.get_running_loop().time(), 0.01)

    async def _leave(self, timeout: float) -> None:
        """Nothing runs any more: heartbeats can stop. Removing this instance's row is cosmetic
        (a stopped instance's row would age out anyway): never worth a long wait on a
        connection that died silently. Both at once: a statement cancelled on a silent
        connection costs SQLAlchemy's polite close (2 s) each."""

        async def leave() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.recorder.leave(), timeout=timeout)

        await asyncio.gather(
            self._cancel("housekeeper", "loop-lag monitor", "history retention"), leave()
        )

    async def _drain(self, name: str, timeout: float) -> None:
        """Let a loop that was told to close finish its work; cancel it after ``timeout``."""
        task = self._tasks.get(name)
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=timeout)
        except TimeoutError:
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)  # its statement's connection is discarded
            log.warning(
                "scheduler %s: the %s did not finish in %.1fs (shutdown_results_wait); what it "
                "had not recorded is revived after the dead window",
                self.name,
                name,
                timeout,
            )

    async def _cancel(self, *names: str) -> None:
        """Cancel the named loops all at once, then wait for them: a loop cancelled in a
        statement on a silent connection takes SQLAlchemy's polite close (2 s), and those
        waits overlap instead of adding up."""
        tasks = {self._tasks[name]: name for name in names if name in self._tasks}
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=_CANCEL_WAIT)
        for task in done:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                log.warning("scheduler %s: the %s ended with %r", self.name, tasks[task], error)
        for task in pending:  # never a stop that waits on a connection that went silent
            log.warning(
                "scheduler %s: the %s did not end within %.0fs of its cancellation; left behind",
                self.name,
                tasks[task],
                _CANCEL_WAIT,
            )

    async def _supervise(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a loop; if it crashes, log it, count it, and restart it after a backoff."""
        bind_log_context(scheduler=self.name)  # this loop's task: its records name us
        backoff = Backoff(self.config.polling_interval.total_seconds())
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.state.loop_restarts += 1
                delay = backoff.next()
                log.exception(
                    "scheduler %s: the %s loop crashed; restarting it in %.2fs",
                    self.name,
                    name,
                    delay,
                    extra={"scheduler": self.name},
                )
                self.link.report("loop-crashed", f"{name} loop crashed (restarted)")
                await asyncio.sleep(delay)

    # -- reporting -------------------------------------------------------------------------

    def status(self) -> SchedulerStatus:
        """A snapshot of this instance's state (for ``/jobs`` and logs)."""
        return SchedulerStatus(
            name=self.name,
            started_at=self.state.started_at,
            ready=self.state.ready.is_set(),
            stopping=self.state.stopping,
            database_reachable=self.link.reachable,
            condition=self.link.condition,
            condition_since=self.link.condition_since,
            last_error=self.link.last_error,
            last_error_at=self.link.last_error_at,
            last_successful_poll=self.state.last_poll,
            polling_strategy=self.polling_strategy,
            batch_size=self.batch_size,
            loop_restarts=self.state.loop_restarts,
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
                for e in self.executions
            ],
        )
